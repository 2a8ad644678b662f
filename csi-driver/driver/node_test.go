package driver

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
	"github.com/diskfit/diskfit/csi-driver/config"
	"github.com/diskfit/diskfit/csi-driver/internal/testdisk"
)

func (e *env) stage(t *testing.T, id string, cap *csi.VolumeCapability) string {
	t.Helper()
	staging := filepath.Join(e.kubelet, "plugins", "staging", strings.ReplaceAll(id, ":", "_"))
	if _, err := e.d.NodeStageVolume(e.ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: cap}); err != nil {
		t.Fatalf("NodeStageVolume: %v", err)
	}
	return staging
}

func (e *env) publish(t *testing.T, id, staging, name string, cap *csi.VolumeCapability, readOnly bool) (string, error) {
	t.Helper()
	target := filepath.Join(e.kubelet, "pods", name)
	_, err := e.d.NodePublishVolume(e.ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: cap, Readonly: readOnly})
	return target, err
}

func (e *env) teardown(t *testing.T, id, staging string, targets ...string) {
	t.Helper()
	for _, target := range targets {
		if _, err := e.d.NodeUnpublishVolume(e.ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
			t.Fatalf("NodeUnpublishVolume: %v", err)
		}
		if _, err := os.Stat(target); !os.IsNotExist(err) {
			t.Errorf("target %s still exists after unpublish: %v", target, err)
		}
	}
	if _, err := e.d.NodeUnstageVolume(e.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		t.Fatalf("NodeUnstageVolume: %v", err)
	}
	if _, err := e.d.DeleteVolume(e.ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatalf("DeleteVolume: %v", err)
	}
	if loops := testdisk.LoopsBelow(e.paths["xfs"]); len(loops) > 0 {
		t.Errorf("loop devices left: %v", loops)
	}
}

func withFS(cap *csi.VolumeCapability, fs string) *csi.VolumeCapability {
	cap.GetMount().FsType = fs
	return cap
}

// TestNodeFilesystemLifecycle stages, publishes, writes, expands and tears
// down Filesystem volumes of both supported filesystems on real mounts.
func TestNodeFilesystemLifecycle(t *testing.T) {
	e := newEnv(t, []testDisk{{name: "xfs", fsType: "xfs", size: 8 * gi}}, nil)
	for _, fs := range []string{"xfs", "ext4"} {
		t.Run(fs, func(t *testing.T) {
			cap := withFS(mountCap(), fs)
			req := createReq("pvc-life-"+fs, 512*mi)
			req.VolumeCapabilities = []*csi.VolumeCapability{cap}
			vol := e.mustCreate(t, req)
			staging := e.stage(t, vol.VolumeId, cap)
			// Staging twice is harmless.
			e.stage(t, vol.VolumeId, cap)
			target, err := e.publish(t, vol.VolumeId, staging, "rw-"+fs, cap, false)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(target, "data"), []byte("hello"), 0o600); err != nil {
				t.Fatalf("writing to the volume: %v", err)
			}
			ro, err := e.publish(t, vol.VolumeId, staging, "ro-"+fs, cap, true)
			if err != nil {
				t.Fatal(err)
			}
			if data, err := os.ReadFile(filepath.Join(ro, "data")); err != nil || string(data) != "hello" {
				t.Errorf("read-only publication reads %q, %v", data, err)
			}
			if err := os.WriteFile(filepath.Join(ro, "other"), nil, 0o600); err == nil {
				t.Error("writing to a read-only publication succeeded")
			}
			stats, err := e.d.NodeGetVolumeStats(e.ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: vol.VolumeId, VolumePath: target})
			if err != nil {
				t.Fatal(err)
			}
			if total := stats.Usage[0].Total; total <= 0 || total > vol.CapacityBytes {
				t.Errorf("stats total %d for a %d-byte volume", total, vol.CapacityBytes)
			}

			grown := vol.CapacityBytes + 512*mi
			expand := &csi.NodeExpandVolumeRequest{VolumeId: vol.VolumeId, VolumePath: target, StagingTargetPath: staging, VolumeCapability: cap,
				CapacityRange: &csi.CapacityRange{RequiredBytes: grown}}
			_, err = e.d.NodeExpandVolume(e.ctx, expand)
			// The volume grows whatever happens to its filesystem.
			if got := e.volumeSize(t, vol.VolumeId); got != grown {
				t.Errorf("volume has %d bytes after NodeExpandVolume, want %d", got, grown)
			}
			if fs == "ext4" && err != nil {
				// This kernel refuses ext4 online grow; the driver says so
				// and grows it at the next stage.
				wantCode(t, err, codes.FailedPrecondition)
				if !strings.Contains(err.Error(), "next time the volume is staged") {
					t.Errorf("ext4 refusal does not say what happens next: %v", err)
				}
				e.teardownNode(t, vol.VolumeId, staging, target, ro)
				staging = e.stage(t, vol.VolumeId, cap)
				if target, err = e.publish(t, vol.VolumeId, staging, "rw-"+fs, cap, false); err != nil {
					t.Fatal(err)
				}
				ro = ""
				// kubelet retries the node expansion; now there is nothing
				// left to grow and it succeeds.
				expand.VolumePath, expand.StagingTargetPath = target, staging
				if resp, err := e.d.NodeExpandVolume(e.ctx, expand); err != nil || resp.CapacityBytes != grown {
					t.Errorf("NodeExpandVolume after the offline grow: %v, %v", resp, err)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			var st unix.Statfs_t
			if err := unix.Statfs(target, &st); err != nil {
				t.Fatal(err)
			}
			if size := int64(st.Blocks) * st.Frsize; size <= vol.CapacityBytes {
				t.Errorf("filesystem is %d bytes after growing the volume to %d", size, grown)
			}
			if data, err := os.ReadFile(filepath.Join(target, "data")); err != nil || string(data) != "hello" {
				t.Errorf("after expansion the volume reads %q, %v", data, err)
			}
			targets := []string{target}
			if ro != "" {
				targets = append(targets, ro)
			}
			e.teardown(t, vol.VolumeId, staging, targets...)
		})
	}
}

// teardownNode unpublishes and unstages without deleting.
func (e *env) teardownNode(t *testing.T, id, staging string, targets ...string) {
	t.Helper()
	for _, target := range targets {
		if _, err := e.d.NodeUnpublishVolume(e.ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.d.NodeUnstageVolume(e.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
}

func TestNodeBlockVolume(t *testing.T) {
	e := newEnv(t, []testDisk{{name: "xfs", fsType: "xfs", size: 2 * gi}}, nil)
	cap := blockCap()
	req := createReq("pvc-block", 64*mi)
	req.VolumeCapabilities = []*csi.VolumeCapability{cap}
	vol := e.mustCreate(t, req)
	if vol.CapacityBytes != 64*mi {
		t.Errorf("block volume of %d bytes, want %d", vol.CapacityBytes, 64*mi)
	}
	staging := e.stage(t, vol.VolumeId, cap)
	target, err := e.publish(t, vol.VolumeId, staging, "block", cap, false)
	if err != nil {
		t.Fatal(err)
	}
	size, err := deviceSize(target)
	if err != nil {
		t.Fatal(err)
	}
	if size != 64*mi {
		t.Errorf("published device has %d bytes, want %d", size, 64*mi)
	}
	out := testdisk.Run(t, "dd", "if=/dev/zero", "of="+target, "bs=1M", "count=4", "oflag=direct", "status=none")
	_ = out

	// Growing a Block volume grows its file and its loop device, which the
	// published device node shows at once; there is no filesystem step.
	// The second request carries no capability, as csi-sanity's: the
	// published path being a file says Block.
	for _, tt := range []struct {
		name string
		cap  *csi.VolumeCapability
		size int64
	}{{"with capability", cap, 128 * mi}, {"without capability", nil, 192 * mi}} {
		resp, err := e.d.NodeExpandVolume(e.ctx, &csi.NodeExpandVolumeRequest{VolumeId: vol.VolumeId, VolumePath: target, StagingTargetPath: staging,
			VolumeCapability: tt.cap, CapacityRange: &csi.CapacityRange{RequiredBytes: tt.size}})
		if err != nil || resp.CapacityBytes != tt.size {
			t.Fatalf("NodeExpandVolume %s: %v, %v; want %d bytes", tt.name, resp, err, tt.size)
		}
		if size, err := deviceSize(target); err != nil || size != tt.size {
			t.Errorf("%s: published device has %d bytes (%v), want %d", tt.name, size, err, tt.size)
		}
	}
	e.teardown(t, vol.VolumeId, staging, target)
}

// volumeSize returns a volume's size as the controller reports it.
func (e *env) volumeSize(t *testing.T, id string) int64 {
	t.Helper()
	resp, err := e.d.ControllerGetVolume(e.ctx, &csi.ControllerGetVolumeRequest{VolumeId: id})
	if err != nil {
		t.Fatal(err)
	}
	return resp.Volume.CapacityBytes
}

// TestNodeExpandVolume grows a staged and published XFS volume through
// NodeExpandVolume alone, as the kubelet does when the resizer did not
// call ControllerExpandVolume: the backing file, the loop device and the
// filesystem grow and the DiskNode refresh is asked for; a retry is a
// no-op; bad ranges and a disk too full change nothing.
func TestNodeExpandVolume(t *testing.T) {
	e := newEnv(t, []testDisk{{name: "xfs", fsType: "xfs", size: 2 * gi}}, nil)
	dk := e.d.disks()[0]
	cap := mountCap()
	vol := e.mustCreate(t, createReq("pvc-grow", 400*mi))
	staging := e.stage(t, vol.VolumeId, cap)
	target, err := e.publish(t, vol.VolumeId, staging, "grow", cap, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(target, "data"), []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	dev, err := dk.backend.Device(e.ctx, "pvc-grow")
	if err != nil || dev == "" {
		t.Fatalf("device of the staged volume: %q, %v", dev, err)
	}
	expand := func(cr *csi.CapacityRange) (*csi.NodeExpandVolumeResponse, error) {
		return e.d.NodeExpandVolume(e.ctx, &csi.NodeExpandVolumeRequest{VolumeId: vol.VolumeId, VolumePath: target, StagingTargetPath: staging,
			VolumeCapability: cap, CapacityRange: cr})
	}
	// sizes returns the recorded, file, device and filesystem sizes.
	sizes := func() [4]int64 {
		t.Helper()
		st, err := os.Stat(filepath.Join(e.paths["xfs"], "diskfit", "volumes", "pvc-grow.img"))
		if err != nil {
			t.Fatal(err)
		}
		devBytes, err := deviceSize(dev)
		if err != nil {
			t.Fatal(err)
		}
		var sfs unix.Statfs_t
		if err := unix.Statfs(target, &sfs); err != nil {
			t.Fatal(err)
		}
		return [4]int64{e.volumeSize(t, vol.VolumeId), st.Size(), devBytes, int64(sfs.Blocks) * sfs.Frsize}
	}
	kicked := func() bool {
		select {
		case <-e.d.kick:
			return true
		default:
			return false
		}
	}
	kicked() // CreateVolume's
	before := sizes()
	free, err := dk.backend.Usage(e.ctx)
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name     string
		cr       *csi.CapacityRange
		wantCode codes.Code
		wantMsg  []string
	}{
		{name: "limit below required", cr: &csi.CapacityRange{RequiredBytes: 2 * gi, LimitBytes: gi}, wantCode: codes.InvalidArgument},
		{name: "negative required", cr: &csi.CapacityRange{RequiredBytes: -1}, wantCode: codes.InvalidArgument},
		{name: "limit below the rounded size", cr: &csi.CapacityRange{RequiredBytes: gi + 1, LimitBytes: gi + 2}, wantCode: codes.OutOfRange},
		{name: "absurd", cr: &csi.CapacityRange{RequiredBytes: 1 << 51}, wantCode: codes.OutOfRange},
		{name: "beyond the disk", cr: &csi.CapacityRange{RequiredBytes: 100 * gi}, wantCode: codes.ResourceExhausted,
			wantMsg: []string{"disk xfs", "bytes free", fmt.Sprint(100 * gi)}},
		// The CSI spec makes the range optional: then only the filesystem
		// is fitted to its device, which it already fills.
		{name: "no capacity range", wantCode: codes.OK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := expand(tt.cr)
			wantCode(t, err, tt.wantCode)
			for _, m := range tt.wantMsg {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("message %q does not contain %q", err, m)
				}
			}
			if err == nil && resp.CapacityBytes != vol.CapacityBytes {
				t.Errorf("capacity %d, want %d", resp.CapacityBytes, vol.CapacityBytes)
			}
			if after := sizes(); after != before {
				t.Errorf("sizes (record, file, device, filesystem) went from %v to %v", before, after)
			}
			if kicked() {
				t.Error("a call that grew nothing asked for a DiskNode refresh")
			}
		})
	}
	if u, err := dk.backend.Usage(e.ctx); err != nil || u.FreeBytes < free.FreeBytes-mi {
		t.Errorf("the failed expansions took space: free %d before, %+v, %v after", free.FreeBytes, u, err)
	}

	grown := vol.CapacityBytes + 512*mi
	for i := range 2 {
		resp, err := expand(&csi.CapacityRange{RequiredBytes: grown})
		if err != nil || resp.CapacityBytes != grown {
			t.Fatalf("expansion %d: %v, %v; want %d bytes", i+1, resp, err, grown)
		}
		after := sizes()
		if after[0] != grown || after[1] != grown || after[2] != grown || after[3] <= before[3]+400*mi {
			t.Errorf("expansion %d: sizes (record, file, device, filesystem) %v, want %d and a filesystem grown from %d", i+1, after, grown, before[3])
		}
		// Only the call that grew the volume asks for a DiskNode refresh;
		// the kubelet's retry is a no-op.
		if got := kicked(); got != (i == 0) {
			t.Errorf("expansion %d asked for a DiskNode refresh: %v", i+1, got)
		}
	}
	// A smaller request never shrinks.
	if resp, err := expand(&csi.CapacityRange{RequiredBytes: vol.CapacityBytes}); err != nil || resp.CapacityBytes != grown {
		t.Errorf("smaller request: %v, %v; want %d bytes", resp, err, grown)
	}
	if data, err := os.ReadFile(filepath.Join(target, "data")); err != nil || string(data) != "hello" {
		t.Errorf("after expansion the volume reads %q, %v", data, err)
	}
	e.teardown(t, vol.VolumeId, staging, target)
}

func TestNodeSingleWriterAndPaths(t *testing.T) {
	e := newEnv(t, []testDisk{{name: "xfs", fsType: "xfs", size: 2 * gi}}, nil)
	cap := mountCap()
	cap.AccessMode.Mode = csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER
	req := createReq("pvc-snsw", 400*mi)
	req.VolumeCapabilities = []*csi.VolumeCapability{cap}
	vol := e.mustCreate(t, req)

	outside := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(e.kubelet, "escape")); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, staging string
		want          codes.Code
	}{
		{name: "staging outside the kubelet dir", staging: filepath.Join(outside, "s"), want: codes.InvalidArgument},
		{name: "staging is the kubelet dir", staging: e.kubelet, want: codes.InvalidArgument},
		{name: "staging escapes through ..", staging: e.kubelet + "/../x", want: codes.InvalidArgument},
		{name: "staging escapes through a symlink", staging: filepath.Join(e.kubelet, "escape", "s"), want: codes.InvalidArgument},
		{name: "relative staging path", staging: "plugins/s", want: codes.InvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := e.d.NodeStageVolume(e.ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: tt.staging, VolumeCapability: cap})
			wantCode(t, err, tt.want)
			_, err = e.d.NodePublishVolume(e.ctx, &csi.NodePublishVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: filepath.Join(e.kubelet, "s"), TargetPath: tt.staging, VolumeCapability: cap})
			wantCode(t, err, tt.want)
		})
	}
	_, err := e.d.NodeExpandVolume(e.ctx, &csi.NodeExpandVolumeRequest{VolumeId: vol.VolumeId, VolumePath: outside, VolumeCapability: cap})
	wantCode(t, err, codes.InvalidArgument)
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Errorf("a path outside the kubelet dir was touched: %v", entries)
	}

	_, err = e.publish(t, vol.VolumeId, filepath.Join(e.kubelet, "s"), "unstaged", cap, false)
	wantCode(t, err, codes.FailedPrecondition)
	staging := e.stage(t, vol.VolumeId, cap)
	first, err := e.publish(t, vol.VolumeId, staging, "first", cap, false)
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.publish(t, vol.VolumeId, staging, "second", cap, false)
	wantCode(t, err, codes.FailedPrecondition)
	// Deleting a staged volume is refused rather than pulling the file
	// from under a mounted filesystem.
	_, err = e.d.DeleteVolume(e.ctx, &csi.DeleteVolumeRequest{VolumeId: vol.VolumeId})
	wantCode(t, err, codes.FailedPrecondition)
	e.teardown(t, vol.VolumeId, staging, first)
}

// TestVolumeHealthAndDiskNode checks the abnormal health of a volume whose
// backing file is gone, and the DiskNode status: created with an owner
// reference, counting volumes, and marking a disk unhealthy when its
// filesystem is unmounted.
func TestVolumeHealthAndDiskNode(t *testing.T) {
	e := newEnv(t, []testDisk{{name: "one", class: "ssd", fsType: "xfs", size: gi}, {name: "two", fsType: "ext4", size: gi}}, nil)
	vol := e.mustCreate(t, createReq("pvc-health", 400*mi))
	h, err := e.d.ControllerGetVolumeHealth(e.ctx, &csi.ControllerGetVolumeHealthRequest{VolumeId: vol.VolumeId})
	if err != nil || len(h.VolumeHealth.HealthStatuses) != 0 {
		t.Fatalf("healthy volume reported %v, %v", h, err)
	}
	e.d.publish(e.ctx)
	dn, err := e.diskfit.DiskfitV1alpha1().DiskNodes().Get(e.ctx, testNode, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Not owned by its Node: a cordon outlives the Node (docs/design.md).
	if len(dn.OwnerReferences) != 0 {
		t.Errorf("owner references %v, want none", dn.OwnerReferences)
	}
	one := dn.Status.Disk("one")
	if one == nil || !one.Healthy || one.VolumeCount != 1 || one.DeviceClass != "ssd" || one.FreeBytes > one.CapacityBytes-400*mi {
		t.Errorf("disk one status %+v", one)
	}
	if dn.Status.HealthyDisks != 2 || dn.Status.ObservedTime.IsZero() {
		t.Errorf("status totals %+v", dn.Status)
	}

	if err := os.Remove(filepath.Join(e.paths["one"], "diskfit", "volumes", "pvc-health.img")); err != nil {
		t.Fatal(err)
	}
	h, err = e.d.ControllerGetVolumeHealth(e.ctx, &csi.ControllerGetVolumeHealthRequest{VolumeId: vol.VolumeId})
	if err != nil || len(h.VolumeHealth.HealthStatuses) != 1 || h.VolumeHealth.HealthStatuses[0].Status != csi.VolumeHealthErrorType_INACCESSIBLE {
		t.Errorf("volume without its backing file reported %v, %v", h, err)
	}

	onTwo := createReq("pvc-on-two-before", 400*mi)
	onTwo.Parameters = e.addPVC(t, "pvc-on-two-before", map[string]string{
		"volume.kubernetes.io/selected-node": testNode, "diskfit.io/selected-disk": "two"})
	volTwo := e.mustCreate(t, onTwo)

	// Lazily: the driver serving the disk keeps it busy.
	testdisk.Run(t, "umount", "--lazy", e.paths["two"])
	// The volume still exists on the unmounted disk: deleting it now must
	// not report success, and it is not "not found" either.
	_, err = e.d.DeleteVolume(e.ctx, &csi.DeleteVolumeRequest{VolumeId: volTwo.VolumeId})
	wantCode(t, err, codes.Unavailable)
	_, err = e.d.ControllerGetVolume(e.ctx, &csi.ControllerGetVolumeRequest{VolumeId: volTwo.VolumeId})
	wantCode(t, err, codes.Unavailable)
	e.d.publish(e.ctx)
	dn, err = e.diskfit.DiskfitV1alpha1().DiskNodes().Get(e.ctx, testNode, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	two := dn.Status.Disk("two")
	if two == nil || two.Healthy || !strings.Contains(two.Message, "unmounted") {
		t.Errorf("unmounted disk reported %+v", two)
	}
	if dn.Status.HealthyDisks != 1 {
		t.Errorf("%d healthy disks, want 1", dn.Status.HealthyDisks)
	}
	sh, err := e.d.NodeGetStorageHealth(e.ctx, &csi.NodeGetStorageHealthRequest{})
	if err != nil || len(sh.BackendHealth) != 1 || !strings.Contains(sh.BackendHealth[0].Message, "disk two") {
		t.Errorf("storage health %v, %v", sh, err)
	}
	_, err = e.d.CreateVolume(e.ctx, &csi.CreateVolumeRequest{Name: "pvc-on-two", VolumeCapabilities: []*csi.VolumeCapability{mountCap()},
		CapacityRange: &csi.CapacityRange{RequiredBytes: 400 * mi}, Parameters: e.addPVC(t, "pvc-on-two", map[string]string{
			"volume.kubernetes.io/selected-node": testNode, "diskfit.io/selected-disk": "two"})})
	wantCode(t, err, codes.ResourceExhausted)
}

// TestSnapshotsAndClones restores a snapshot and clones a volume with
// reflink on XFS, and checks that an ext4 disk refuses both.
func TestSnapshotsAndClones(t *testing.T) {
	e := newEnv(t, []testDisk{{name: "xfs", fsType: "xfs", size: 4 * gi}, {name: "ext4", fsType: "ext4", size: 2 * gi}}, nil)
	cap := blockCap()
	src := createReq("pvc-src", 64*mi)
	src.VolumeCapabilities = []*csi.VolumeCapability{cap}
	src.Parameters = e.addPVC(t, "pvc-src", map[string]string{"volume.kubernetes.io/selected-node": testNode, "diskfit.io/selected-disk": "xfs"})
	vol := e.mustCreate(t, src)
	staging := e.stage(t, vol.VolumeId, cap)
	dev, err := e.d.disk("xfs").backend.Device(e.ctx, "pvc-src")
	if err != nil {
		t.Fatal(err)
	}
	testdisk.Run(t, "sh", "-c", "printf snapshot-data | dd of="+dev+" oflag=direct,sync conv=notrunc bs=512 count=1 status=none 2>/dev/null || printf snapshot-data | dd of="+dev+" conv=notrunc,fsync status=none")
	snap, err := e.d.CreateSnapshot(e.ctx, &csi.CreateSnapshotRequest{Name: "snap-1", SourceVolumeId: vol.VolumeId})
	if err != nil {
		t.Fatal(err)
	}
	again, err := e.d.CreateSnapshot(e.ctx, &csi.CreateSnapshotRequest{Name: "snap-1", SourceVolumeId: vol.VolumeId})
	if err != nil || again.Snapshot.SnapshotId != snap.Snapshot.SnapshotId {
		t.Errorf("repeated CreateSnapshot: %v, %v", again, err)
	}
	// csi-snapshotter's --snapshot-name-uuid-length cuts the
	// VolumeSnapshot's UID in the name: a later VolumeSnapshot of the same
	// volume can ask for the name of an earlier one, and must not get the
	// earlier point in time. Its VolumeSnapshotContent (named after the
	// whole UID) tells them apart.
	forContent := func(content string) *csi.CreateSnapshotRequest {
		return &csi.CreateSnapshotRequest{Name: "snapshot-0b5c3f2e", SourceVolumeId: vol.VolumeId,
			Parameters: map[string]string{diskfit.SnapshotContentNameKey: content}}
	}
	day1, err := e.d.CreateSnapshot(e.ctx, forContent("snapcontent-0b5c3f2e-1111"))
	if err != nil {
		t.Fatal(err)
	}
	if later, err := e.d.CreateSnapshot(e.ctx, forContent("snapcontent-0b5c3f2e-2222")); status.Code(err) != codes.AlreadyExists {
		t.Errorf("CreateSnapshot of an earlier snapshot's name for another VolumeSnapshotContent: %v, %v; want AlreadyExists", later, err)
	}
	if retry, err := e.d.CreateSnapshot(e.ctx, forContent("snapcontent-0b5c3f2e-1111")); err != nil || retry.Snapshot.SnapshotId != day1.Snapshot.SnapshotId {
		t.Errorf("retried CreateSnapshot for its own content: %v, %v", retry, err)
	}
	if _, err := e.d.DeleteSnapshot(e.ctx, &csi.DeleteSnapshotRequest{SnapshotId: day1.Snapshot.SnapshotId}); err != nil {
		t.Fatal(err)
	}
	e.teardownNode(t, vol.VolumeId, staging)

	restore := createReq("pvc-restore", 128*mi)
	restore.VolumeCapabilities = []*csi.VolumeCapability{cap}
	restore.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.Snapshot.SnapshotId}}}
	restored := e.mustCreate(t, restore)
	clone := createReq("pvc-clone", 64*mi)
	clone.VolumeCapabilities = []*csi.VolumeCapability{cap}
	clone.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: vol.VolumeId}}}
	cloned := e.mustCreate(t, clone)
	for _, v := range []*csi.Volume{restored, cloned} {
		key := strings.TrimPrefix(v.VolumeId, "xfs:")
		data, err := os.ReadFile(filepath.Join(e.paths["xfs"], "diskfit", "volumes", key+".img"))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(string(data), "snapshot-data") || int64(len(data)) != v.CapacityBytes {
			t.Errorf("%s: %d bytes starting %q", v.VolumeId, len(data), data[:16])
		}
	}
	if restored.CapacityBytes != 128*mi {
		t.Errorf("restored volume has %d bytes, want %d", restored.CapacityBytes, 128*mi)
	}

	tooSmall := createReq("pvc-too-small", 32*mi)
	tooSmall.CapacityRange.LimitBytes = 32 * mi
	tooSmall.VolumeCapabilities = []*csi.VolumeCapability{cap}
	tooSmall.VolumeContentSource = restore.VolumeContentSource
	_, err = e.d.CreateVolume(e.ctx, tooSmall)
	wantCode(t, err, codes.OutOfRange)

	onExt4 := createReq("pvc-ext4", 64*mi)
	onExt4.VolumeCapabilities = []*csi.VolumeCapability{cap}
	onExt4.Parameters = e.addPVC(t, "pvc-ext4", map[string]string{"volume.kubernetes.io/selected-node": testNode, "diskfit.io/selected-disk": "ext4"})
	ext4Vol := e.mustCreate(t, onExt4)
	_, err = e.d.CreateSnapshot(e.ctx, &csi.CreateSnapshotRequest{Name: "snap-ext4", SourceVolumeId: ext4Vol.VolumeId})
	wantCode(t, err, codes.FailedPrecondition)
	_, err = e.d.CreateSnapshot(e.ctx, &csi.CreateSnapshotRequest{Name: "snap-1", SourceVolumeId: restored.VolumeId})
	wantCode(t, err, codes.AlreadyExists)
	for _, id := range []string{vol.VolumeId, restored.VolumeId, cloned.VolumeId, ext4Vol.VolumeId} {
		if _, err := e.d.DeleteVolume(e.ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.d.DeleteSnapshot(e.ctx, &csi.DeleteSnapshotRequest{SnapshotId: snap.Snapshot.SnapshotId}); err != nil {
		t.Fatal(err)
	}
	if files := e.volumeFiles(t); len(files) != 0 {
		t.Errorf("left behind: %v", files)
	}
}

// TestLVMDiskWithoutDeviceMapper configures an lvm disk next to a file
// disk on a machine without device-mapper: the driver starts, reports the
// lvm disk unhealthy with the reason, and keeps serving the file disk.
func TestLVMDiskWithoutDeviceMapper(t *testing.T) {
	e := newEnv(t, []testDisk{{name: "file", fsType: "xfs", size: gi}}, nil)
	cfg := e.d.cfg
	node := *cfg.Node
	node.Disks = append(node.Disks, config.Disk{Name: "lvm", Backend: v1alpha1.BackendLVM, VolumeGroup: "vg-none"})
	cfg.Node = &node
	cfg.DeviceMapperControl = filepath.Join(t.TempDir(), "no-control")
	d := e.restart(t, cfg)
	st := d.Observe(e.ctx)
	lvm, file := st.Disk("lvm"), st.Disk("file")
	if lvm == nil || lvm.Healthy || lvm.Backend != v1alpha1.BackendLVM || !strings.Contains(lvm.Message, "device-mapper is not available") {
		t.Errorf("lvm disk status %+v", lvm)
	}
	if file == nil || !file.Healthy {
		t.Errorf("file disk status %+v", file)
	}
	req := createReq("pvc-lvm", 64*mi)
	req.Parameters = e.addPVC(t, "pvc-lvm", map[string]string{"volume.kubernetes.io/selected-node": testNode, "diskfit.io/selected-disk": "lvm"})
	_, err := d.CreateVolume(e.ctx, req)
	wantCode(t, err, codes.ResourceExhausted)
	if _, err := d.CreateVolume(e.ctx, createReq("pvc-file", 400*mi)); err != nil {
		t.Errorf("the file disk stopped working: %v", err)
	}
}

// TestRestoredFilesystemKeepsData checks that staging never formats a
// volume that holds data: a restore of a snapshot of a filesystem volume
// mounts with the file the source had.
func TestRestoredFilesystemKeepsData(t *testing.T) {
	e := newEnv(t, []testDisk{{name: "xfs", fsType: "xfs", size: 4 * gi}}, nil)
	cap := mountCap()
	src := e.mustCreate(t, createReq("pvc-fs-src", 400*mi))
	staging := e.stage(t, src.VolumeId, cap)
	if err := os.WriteFile(filepath.Join(staging, "data"), []byte("kept"), 0o600); err != nil {
		t.Fatal(err)
	}
	e.teardownNode(t, src.VolumeId, staging)
	snap, err := e.d.CreateSnapshot(e.ctx, &csi.CreateSnapshotRequest{Name: "snap-fs", SourceVolumeId: src.VolumeId})
	if err != nil {
		t.Fatal(err)
	}
	req := createReq("pvc-fs-restore", 400*mi)
	req.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.Snapshot.SnapshotId}}}
	restored := e.mustCreate(t, req)
	staging = e.stage(t, restored.VolumeId, cap)
	if data, err := os.ReadFile(filepath.Join(staging, "data")); err != nil || string(data) != "kept" {
		t.Errorf("restored volume reads %q, %v", data, err)
	}
	e.teardown(t, restored.VolumeId, staging)
}
