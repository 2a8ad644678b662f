package driver

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	utilexec "k8s.io/utils/exec"

	"github.com/diskfit/diskfit/csi-driver/internal/testdisk"
)

// recordPath is the path of a volume's record on a file disk.
func recordPath(diskPath, key string) string {
	return filepath.Join(diskPath, "diskfit", "volumes", key+".json")
}

// dataPath is the path of a volume's data file on a file disk.
func dataPath(diskPath, key string) string {
	return filepath.Join(diskPath, "diskfit", "volumes", key+".img")
}

// readRecordJSON reads a volume's record as the JSON object it is on disk.
func readRecordJSON(t *testing.T, diskPath, key string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(recordPath(diskPath, key))
	if err != nil {
		t.Fatal(err)
	}
	var rec map[string]any
	if err := json.Unmarshal(data, &rec); err != nil {
		t.Fatal(err)
	}
	return rec
}

// recordContent returns what a volume's record says it holds ("" when
// the record has no such field, as an older driver wrote it).
func recordContent(t *testing.T, diskPath, key string) string {
	t.Helper()
	c, _ := readRecordJSON(t, diskPath, key)["content"].(string)
	return c
}

// makeOlderRecord rewrites a volume's record without the content field,
// as a driver older than that field wrote it.
func makeOlderRecord(t *testing.T, diskPath, key string) {
	t.Helper()
	rec := readRecordJSON(t, diskPath, key)
	delete(rec, "content")
	data, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	tmp := recordPath(diskPath, key) + ".test"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, recordPath(diskPath, key)); err != nil {
		t.Fatal(err)
	}
}

// zeroRange overwrites n bytes at off of a device or file with zeroes and
// syncs them.
func zeroRange(t *testing.T, path string, off, n int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(make([]byte, n), off); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

// tearFilesystem leaves on dev what an mkfs cut short can leave: its first
// 4 KiB (the superblock, so blkid still finds the filesystem) without the
// 8 MiB after it (the first allocation or block group's metadata, the root
// directory), so the filesystem does not mount and fsck cannot repair it.
func tearFilesystem(t *testing.T, dev string) {
	t.Helper()
	zeroRange(t, dev, 4<<10, 8*mi)
}

// fileSum returns the SHA-256 of a file's content.
func fileSum(t *testing.T, path string) [sha256.Size]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	var sum [sha256.Size]byte
	copy(sum[:], h.Sum(nil))
	return sum
}

// writeSynced writes data to path and syncs it.
func writeSynced(t *testing.T, path string, data []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

// useVolume publishes a staged volume, writes a file through the
// publication, reads it back and tears everything down.
func (e *env) useVolume(t *testing.T, id, staging, name string, cap *csi.VolumeCapability) {
	t.Helper()
	target, err := e.publish(t, id, staging, name, cap, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(target, "data"), []byte("hello"), 0o600); err != nil {
		t.Fatalf("writing to the volume: %v", err)
	}
	if data, err := os.ReadFile(filepath.Join(target, "data")); err != nil || string(data) != "hello" {
		t.Errorf("the volume reads %q, %v", data, err)
	}
	e.teardown(t, id, staging, target)
}

// TestStageFormatsTornFreshVolume: a volume no stage has recorded as
// formatted holds nothing but what the driver's own mkfs wrote, so when a
// stage finds a filesystem mkfs did not finish (the driver, or its whole
// container, was killed during mkfs) it formats the volume again. Two
// kinds of torn filesystem, on XFS and ext4: one whose superblock made it
// but the metadata after it did not (blkid finds the filesystem, it does
// not mount, fsck cannot repair it), and one whose first MiB is missing
// (no signature left).
func TestStageFormatsTornFreshVolume(t *testing.T) {
	e := newEnv(t, []testDisk{{name: "xfs", fsType: "xfs", size: 4 * gi}}, nil)
	dk := e.d.disk("xfs")
	for _, fs := range []string{"xfs", "ext4"} {
		for _, tear := range []struct {
			name string
			tear func(t *testing.T, dev string)
		}{
			{"superblock-only", tearFilesystem},
			{"first-mib-zeroed", func(t *testing.T, dev string) { zeroRange(t, dev, 0, mi) }},
		} {
			t.Run(fs+"/"+tear.name, func(t *testing.T) {
				cap := withFS(mountCap(), fs)
				req := createReq("pvc-torn-"+fs+"-"+tear.name, 300*mi)
				req.VolumeCapabilities = []*csi.VolumeCapability{cap}
				vol := e.mustCreate(t, req)
				key := strings.TrimPrefix(vol.VolumeId, "xfs:")
				// What a stage killed during mkfs leaves: the volume
				// attached, a filesystem partly written.
				dev, err := dk.backend.Attach(e.ctx, key, false)
				if err != nil {
					t.Fatal(err)
				}
				args := []string{"-f", dev}
				if fs == "ext4" {
					args = []string{"-F", "-m0", dev}
				}
				if out, err := execOutput("mkfs."+fs, args...); err != nil {
					t.Fatal(err, out)
				}
				tear.tear(t, dev)

				staging := e.stage(t, vol.VolumeId, cap)
				if c := recordContent(t, e.paths["xfs"], key); c != "filesystem" {
					t.Errorf("after staging, the record says the volume holds %q, want \"filesystem\"", c)
				}
				e.useVolume(t, vol.VolumeId, staging, "torn-"+fs+"-"+tear.name, cap)
			})
		}
	}
}

// TestStageNeverReformatsFormattedVolume: a volume recorded as formatted
// may hold data and is never formatted again. Its filesystem damaged (the
// first MiB zeroed, so blkid finds nothing there), staging fails and
// writes nothing to the volume; with the first MiB put back the volume
// stages and its file is there.
func TestStageNeverReformatsFormattedVolume(t *testing.T) {
	e := newEnv(t, []testDisk{{name: "xfs", fsType: "xfs", size: 4 * gi}}, nil)
	for _, fs := range []string{"xfs", "ext4"} {
		t.Run(fs, func(t *testing.T) {
			cap := withFS(mountCap(), fs)
			req := createReq("pvc-kept-"+fs, 300*mi)
			req.VolumeCapabilities = []*csi.VolumeCapability{cap}
			vol := e.mustCreate(t, req)
			key := strings.TrimPrefix(vol.VolumeId, "xfs:")
			if c := recordContent(t, e.paths["xfs"], key); c != "none" {
				t.Errorf("a new volume's record says it holds %q, want \"none\"", c)
			}
			staging := e.stage(t, vol.VolumeId, cap)
			target, err := e.publish(t, vol.VolumeId, staging, "kept-"+fs, cap, false)
			if err != nil {
				t.Fatal(err)
			}
			want := make([]byte, 64<<10)
			if _, err := rand.Read(want); err != nil {
				t.Fatal(err)
			}
			writeSynced(t, filepath.Join(target, "data"), want)
			e.teardownNode(t, vol.VolumeId, staging, target)
			if c := recordContent(t, e.paths["xfs"], key); c != "filesystem" {
				t.Errorf("after staging, the record says the volume holds %q, want \"filesystem\"", c)
			}

			img := dataPath(e.paths["xfs"], key)
			f, err := os.Open(img)
			if err != nil {
				t.Fatal(err)
			}
			saved := make([]byte, mi)
			_, err = f.ReadAt(saved, 0)
			f.Close()
			if err != nil {
				t.Fatal(err)
			}
			zeroRange(t, img, 0, mi)
			damaged := fileSum(t, img)

			_, err = e.d.NodeStageVolume(e.ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging, VolumeCapability: cap})
			if err == nil {
				t.Fatal("staging a formatted volume whose filesystem is damaged succeeded: the volume was formatted again")
			}
			wantCode(t, err, codes.FailedPrecondition)
			if fileSum(t, img) != damaged {
				t.Error("the failed stage wrote to the volume")
			}
			if mounted, err := e.d.isMountPoint(staging); err != nil || mounted {
				t.Errorf("staging path mounted after the failed stage: %v, %v", mounted, err)
			}
			if loops := testdisk.LoopsBelow(e.paths["xfs"]); len(loops) != 0 {
				t.Errorf("loop devices left after the failed stage: %v", loops)
			}

			f, err = os.OpenFile(img, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			_, err = f.WriteAt(saved, 0)
			if err == nil {
				err = f.Sync()
			}
			f.Close()
			if err != nil {
				t.Fatal(err)
			}
			staging = e.stage(t, vol.VolumeId, cap)
			if got, err := os.ReadFile(filepath.Join(staging, "data")); err != nil || !bytes.Equal(got, want) {
				t.Errorf("the volume's file after repair: %d bytes, %v; want the %d bytes written", len(got), err, len(want))
			}
			e.teardown(t, vol.VolumeId, staging)
		})
	}
}

// TestStageOlderRecords: a record without the content field (made by an
// older driver) may stand for a volume holding data. Staging keeps the
// older behaviour for it: a volume proven blank is formatted, any other
// goes through SafeFormatAndMount, which mounts a filesystem it finds.
// Once staged, the record says the volume holds a filesystem.
func TestStageOlderRecords(t *testing.T) {
	e := newEnv(t, []testDisk{{name: "xfs", fsType: "xfs", size: 2 * gi}}, nil)
	cap := mountCap()
	vol := e.mustCreate(t, createReq("pvc-older", 300*mi))
	makeOlderRecord(t, e.paths["xfs"], "pvc-older")
	staging := e.stage(t, vol.VolumeId, cap)
	target, err := e.publish(t, vol.VolumeId, staging, "older", cap, false)
	if err != nil {
		t.Fatal(err)
	}
	writeSynced(t, filepath.Join(target, "data"), []byte("older"))
	e.teardownNode(t, vol.VolumeId, staging, target)
	if c := recordContent(t, e.paths["xfs"], "pvc-older"); c != "filesystem" {
		t.Errorf("after staging, the record says the volume holds %q, want \"filesystem\"", c)
	}

	makeOlderRecord(t, e.paths["xfs"], "pvc-older")
	staging = e.stage(t, vol.VolumeId, cap)
	if data, err := os.ReadFile(filepath.Join(staging, "data")); err != nil || string(data) != "older" {
		t.Errorf("the volume reads %q, %v after staging again", data, err)
	}
	if c := recordContent(t, e.paths["xfs"], "pvc-older"); c != "filesystem" {
		t.Errorf("after staging, the record says the volume holds %q, want \"filesystem\"", c)
	}
	e.teardown(t, vol.VolumeId, staging)
}

// TestCopiesKeepTheirFilesystem: a volume restored from a snapshot or
// cloned from a volume carries its source's filesystem and is recorded as
// formatted from its creation, so no stage ever formats it; a copy of a
// volume never written is as empty as a new volume and is recorded so.
func TestCopiesKeepTheirFilesystem(t *testing.T) {
	e := newEnv(t, []testDisk{{name: "xfs", fsType: "xfs", size: 4 * gi}}, nil)
	cap := mountCap()
	src, snap := e.copySource(t, "pvc-copy-src", 300*mi, cap)
	fresh := e.mustCreate(t, createReq("pvc-copy-fresh", 300*mi))
	from := func(name string, source *csi.VolumeContentSource) *csi.Volume {
		req := createReq(name, 300*mi)
		req.VolumeContentSource = source
		return e.mustCreate(t, req)
	}
	volumeSource := func(id string) *csi.VolumeContentSource {
		return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: id}}}
	}
	restored := from("pvc-copy-restored", &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
		Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.SnapshotId}}})
	cloned := from("pvc-copy-cloned", volumeSource(src.VolumeId))
	freshClone := from("pvc-copy-fresh-clone", volumeSource(fresh.VolumeId))
	for key, want := range map[string]string{
		"pvc-copy-src": "filesystem", "pvc-copy-fresh": "none",
		"pvc-copy-restored": "filesystem", "pvc-copy-cloned": "filesystem", "pvc-copy-fresh-clone": "none",
	} {
		if c := recordContent(t, e.paths["xfs"], key); c != want {
			t.Errorf("the record of %s says it holds %q, want %q", key, c, want)
		}
	}
	for _, vol := range []*csi.Volume{restored, cloned} {
		staging := e.stage(t, vol.VolumeId, cap)
		if data, err := os.ReadFile(filepath.Join(staging, "data")); err != nil || string(data) != "copied" {
			t.Errorf("%s reads %q, %v", vol.VolumeId, data, err)
		}
		e.teardown(t, vol.VolumeId, staging)
	}
	staging := e.stage(t, freshClone.VolumeId, cap)
	e.useVolume(t, freshClone.VolumeId, staging, "fresh-clone", cap)
}

// TestUnstageKeepsPublishedBlockDevice: while a Block volume is still
// published (a bind mount of its device node that a pod uses),
// NodeUnstageVolume refuses with FailedPrecondition and leaves the loop
// device attached: detached, the pod's device node would point at a loop
// device that the next attach may give to another volume. Staging a Block
// volume records that it may hold data, so no later stage formats it.
func TestUnstageKeepsPublishedBlockDevice(t *testing.T) {
	e := newEnv(t, []testDisk{{name: "xfs", fsType: "xfs", size: 2 * gi}}, nil)
	dk := e.d.disk("xfs")
	cap := blockCap()
	req := createReq("pvc-block-held", 64*mi)
	req.VolumeCapabilities = []*csi.VolumeCapability{cap}
	vol := e.mustCreate(t, req)
	staging := e.stage(t, vol.VolumeId, cap)
	if c := recordContent(t, e.paths["xfs"], "pvc-block-held"); c != "block" {
		t.Errorf("after staging as Block, the record says the volume holds %q, want \"block\"", c)
	}
	target, err := e.publish(t, vol.VolumeId, staging, "block-held", cap, false)
	if err != nil {
		t.Fatal(err)
	}
	dev, err := dk.backend.Device(e.ctx, "pvc-block-held")
	if err != nil || dev == "" {
		t.Fatalf("device of the staged volume: %q, %v", dev, err)
	}
	page := alignedPage(t)
	rw := func(write bool, b byte) {
		t.Helper()
		fd, err := unix.Open(target, unix.O_RDWR|unix.O_DIRECT|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatalf("opening the published device: %v", err)
		}
		defer unix.Close(fd)
		if write {
			for i := range page {
				page[i] = b
			}
			if _, err := unix.Pwrite(fd, page, 8*mi); err != nil {
				t.Fatalf("writing through the publication: %v", err)
			}
			return
		}
		if _, err := unix.Pread(fd, page, 8*mi); err != nil {
			t.Fatalf("reading through the publication: %v", err)
		}
		if page[0] != b || page[len(page)-1] != b {
			t.Errorf("the publication reads %#x, want %#x", page[0], b)
		}
	}
	rw(true, 0xa5)

	_, err = e.d.NodeUnstageVolume(e.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging})
	wantCode(t, err, codes.FailedPrecondition)
	if !strings.Contains(err.Error(), target) {
		t.Errorf("the refusal does not name the publication %s: %v", target, err)
	}
	if got, err := dk.backend.Device(e.ctx, "pvc-block-held"); err != nil || got != dev {
		t.Errorf("device after the refused unstage: %q, %v; want %s still attached", got, err, dev)
	}
	rw(false, 0xa5)
	rw(true, 0x3c)
	rw(false, 0x3c)
	e.teardown(t, vol.VolumeId, staging, target)
}

// A re-stage of a published Block volume (the kubelet stages again after
// its restart, or for a second pod) that fails, here because the record
// of a volume made by an older driver cannot be written on a full disk,
// leaves the loop device attached: detaching it would leave the pod's
// device node leading to whatever gets that loop device next.
func TestFailedRestageKeepsPublishedBlockDevice(t *testing.T) {
	e := newEnv(t, []testDisk{{name: "xfs", fsType: "xfs", size: 1 * gi}}, nil)
	dk := e.d.disk("xfs")
	cap := blockCap()
	req := createReq("pvc-block-old", 64*mi)
	req.VolumeCapabilities = []*csi.VolumeCapability{cap}
	vol := e.mustCreate(t, req)
	staging := e.stage(t, vol.VolumeId, cap)
	target, err := e.publish(t, vol.VolumeId, staging, "block-old", cap, false)
	if err != nil {
		t.Fatal(err)
	}
	dev, _ := dk.backend.Device(e.ctx, "pvc-block-old")
	// As a driver older than the content field left it.
	makeOlderRecord(t, e.paths["xfs"], "pvc-block-old")
	// Fill the disk so the record's temporary file cannot be written.
	fill, err := os.Create(filepath.Join(e.paths["xfs"], "fill"))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	for {
		if _, err := fill.Write(buf); err != nil {
			break
		}
	}
	fill.Sync()
	for {
		if _, err := fill.Write(buf[:4096]); err != nil {
			break
		}
	}
	fill.Sync()
	fill.Close()
	_, err = e.d.NodeStageVolume(e.ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging, VolumeCapability: cap})
	t.Logf("re-stage: %v", err)
	pubs, _ := e.d.devicePublications(dev)
	got, _ := dk.backend.Device(e.ctx, "pvc-block-old")
	if len(pubs) > 0 && got != dev {
		t.Errorf("the re-stage detached %s (now %q) while it is published at %v", dev, got, pubs)
	}
	os.Remove(filepath.Join(e.paths["xfs"], "fill"))
	_ = target
}

// A Block volume's loop device that something else (a process with the
// device node open, udev probing it) holds open at NodeUnstageVolume is
// only marked by the kernel to be freed on last close, and the unstage
// fails; DeleteVolume refuses the volume while the device is there. A
// stage that follows reuses the device, and it must stay the volume's
// once that other opener closes: freed, its number would go to the next
// volume staged, and the pod's device node would then read and write
// that volume.
func TestRestagedBlockVolumeKeepsItsDevice(t *testing.T) {
	e := newEnv(t, []testDisk{{name: "xfs", fsType: "xfs", size: 1 * gi}}, nil)
	dk := e.d.disk("xfs")
	cap := blockCap()
	create := func(name string) *csi.Volume {
		req := createReq(name, 64*mi)
		req.VolumeCapabilities = []*csi.VolumeCapability{cap}
		return e.mustCreate(t, req)
	}
	a := create("pvc-held")
	staging := e.stage(t, a.VolumeId, cap)
	dev, err := dk.backend.Device(e.ctx, "pvc-held")
	if err != nil || dev == "" {
		t.Fatalf("device of the staged volume: %q, %v", dev, err)
	}
	holder, err := os.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Close() })
	// The unstage waits for the device to go; a second shows it does not.
	ctx, cancel := context.WithTimeout(e.ctx, time.Second)
	_, err = e.d.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: a.VolumeId, StagingTargetPath: staging})
	cancel()
	if err == nil {
		t.Fatalf("NodeUnstageVolume with %s held open: OK", dev)
	}
	_, err = e.d.DeleteVolume(e.ctx, &csi.DeleteVolumeRequest{VolumeId: a.VolumeId})
	wantCode(t, err, codes.FailedPrecondition)

	staging = e.stage(t, a.VolumeId, cap)
	target, err := e.publish(t, a.VolumeId, staging, "held", cap, false)
	if err != nil {
		t.Fatal(err)
	}
	page := alignedPage(t)
	fd, err := unix.Open(target, unix.O_RDWR|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("opening the published device: %v", err)
	}
	if _, err := unix.Pwrite(fd, page, 8*mi); err != nil {
		t.Fatalf("writing through the publication: %v", err)
	}
	unix.Close(fd)
	holder.Close()

	b := create("pvc-next")
	stagingB := e.stage(t, b.VolumeId, cap)
	if got, err := dk.backend.Device(e.ctx, "pvc-held"); err != nil || got != dev {
		t.Errorf("device of the published volume once the other opener closed %s: %q, %v", dev, got, err)
	}
	if got, _ := dk.backend.Device(e.ctx, "pvc-next"); got == dev {
		t.Errorf("the next volume staged got %s, which the first volume's pod uses", dev)
	}
	fd, err = unix.Open(target, unix.O_RDWR|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("opening the published device: %v", err)
	}
	buf := alignedPage(t)
	clear(buf)
	if n, err := unix.Pread(fd, buf, 8*mi); err != nil || n != len(buf) {
		t.Errorf("reading through the publication: %d, %v", n, err)
	} else if !bytes.Equal(buf, page) {
		t.Errorf("the publication of %s no longer reads what was written through it", a.VolumeId)
	}
	unix.Close(fd)

	if _, err := e.d.NodeUnpublishVolume(e.ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: a.VolumeId, TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.d.NodeUnstageVolume(e.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: a.VolumeId, StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.d.DeleteVolume(e.ctx, &csi.DeleteVolumeRequest{VolumeId: a.VolumeId}); err != nil {
		t.Fatal(err)
	}
	e.teardown(t, b.VolumeId, stagingB)
}

// TestLargerCopyGetsTheWholeVolume: a restore or clone asked for larger
// than its source (a 400 MiB snapshot restored into an 800 MiB claim) is
// made at the size asked for, and its filesystem, which the copy carries
// at its source's size, fills the volume once staged: the claim's
// capacity is what the pod can write. No expansion is ever asked for such
// a volume (the PVC's capacity is already the PV's), so the stage is the
// only moment to grow it.
func TestLargerCopyGetsTheWholeVolume(t *testing.T) {
	for _, fsType := range []string{"xfs", "ext4"} {
		t.Run(fsType, func(t *testing.T) {
			e := newEnv(t, []testDisk{{name: "xfs", fsType: "xfs", size: 4 * gi}}, nil)
			cap := withFS(mountCap(), fsType)
			src, snap := e.copySource(t, "pvc-small-src", 400*mi, cap)
			for name, source := range map[string]*csi.VolumeContentSource{
				"pvc-larger-restore": {Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.SnapshotId}}},
				"pvc-larger-clone":   {Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: src.VolumeId}}},
			} {
				req := createReq(name, 800*mi)
				req.VolumeCapabilities = []*csi.VolumeCapability{cap}
				req.VolumeContentSource = source
				vol := e.mustCreate(t, req)
				if vol.CapacityBytes != 800*mi {
					t.Fatalf("%s has %d bytes, want %d", name, vol.CapacityBytes, 800*mi)
				}
				staging := e.stage(t, vol.VolumeId, cap)
				if data, err := os.ReadFile(filepath.Join(staging, "data")); err != nil || string(data) != "copied" {
					t.Errorf("%s reads %q, %v", name, data, err)
				}
				var st unix.Statfs_t
				if err := unix.Statfs(staging, &st); err != nil {
					t.Fatal(err)
				}
				// Filesystem metadata takes a few percent; a filesystem still
				// at the source's 400 MiB is far below this.
				if fsBytes := int64(st.Blocks) * st.Frsize; fsBytes < 700*mi {
					t.Errorf("%s: the staged %s filesystem has %d bytes (%d MiB) on a volume of %d MiB: the copy's filesystem was not grown to the volume",
						name, fsType, fsBytes, fsBytes/mi, vol.CapacityBytes/mi)
				}
				e.teardown(t, vol.VolumeId, staging)
			}
		})
	}
}

// copySource makes a volume of size for cap that holds the file "data"
// reading "copied", unstaged, and a snapshot of it, for tests of copies.
func (e *env) copySource(t *testing.T, name string, size int64, cap *csi.VolumeCapability) (*csi.Volume, *csi.Snapshot) {
	t.Helper()
	src := e.createWith(t, name, size, cap)
	staging := e.stage(t, src.VolumeId, cap)
	writeSynced(t, filepath.Join(staging, "data"), []byte("copied"))
	e.teardownNode(t, src.VolumeId, staging)
	snap, err := e.d.CreateSnapshot(e.ctx, &csi.CreateSnapshotRequest{Name: "snap-" + name, SourceVolumeId: src.VolumeId})
	if err != nil {
		t.Fatal(err)
	}
	return src, snap.Snapshot
}

// slowResize runs resize2fs after a pause, as growing a large ext4 takes,
// and leaves a marker once resize2fs has finished.
type slowResize struct {
	utilexec.Interface
	// marker is made once resize2fs has finished.
	marker string
	// started, when set, is closed when resize2fs starts.
	started chan struct{}
}

func (s *slowResize) CommandContext(ctx context.Context, cmd string, args ...string) utilexec.Cmd {
	if cmd == "resize2fs" {
		if s.started != nil {
			close(s.started)
		}
		return s.Interface.CommandContext(ctx, "sh", "-c", `sleep 2 && resize2fs "$1" && touch "$2"`, "_", args[len(args)-1], s.marker)
	}
	return s.Interface.CommandContext(ctx, cmd, args...)
}

// largerExt4Restore makes an ext4 volume of 256 MiB holding "copied" in
// file data, and restores a snapshot of it into a volume of 768 MiB, whose
// filesystem its first stage grows offline.
func (e *env) largerExt4Restore(t *testing.T) (*csi.Volume, *csi.VolumeCapability) {
	t.Helper()
	cap := withFS(mountCap(), "ext4")
	_, snap := e.copySource(t, "pvc-grow-src", 256*mi, cap)
	req := createReq("pvc-grow", 768*mi)
	req.VolumeCapabilities = []*csi.VolumeCapability{cap}
	req.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
		Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.SnapshotId}}}
	return e.mustCreate(t, req), cap
}

// TestOfflineGrowOutlivesTheRequest: a restore of an ext4 volume into a
// larger claim is grown offline (e2fsck, resize2fs) by its first stage.
// The kubelet gives NodeStageVolume 2 minutes and then gives up on it;
// resize2fs is not safe to kill (the filesystem is marked in error while
// it moves blocks), and a grow killed at every attempt would never end.
// So the grow runs to its end whatever the caller does, the volume's lock
// keeps the kubelet's retry waiting (Aborted when it gives up), and a
// later stage finds the data and the whole volume.
func TestOfflineGrowOutlivesTheRequest(t *testing.T) {
	e := newEnv(t, []testDisk{{name: "xfs", fsType: "xfs", size: 4 * gi}}, nil)
	vol, cap := e.largerExt4Restore(t)

	marker := filepath.Join(t.TempDir(), "resized")
	e.d.exec = &slowResize{Interface: e.d.exec, marker: marker}
	staging := filepath.Join(e.kubelet, "plugins", "staging", "grow")
	stage := func(ctx context.Context) error {
		_, err := e.d.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging, VolumeCapability: cap})
		return err
	}
	// The kubelet's deadline, scaled down: it passes while resize2fs runs.
	ctx, cancel := context.WithTimeout(e.ctx, time.Second)
	defer cancel()
	firstDone := make(chan error, 1)
	go func() { firstDone <- stage(ctx) }()
	<-ctx.Done()
	// The kubelet's retry, while the first stage still grows the volume.
	retryCtx, retryCancel := context.WithTimeout(e.ctx, 500*time.Millisecond)
	defer retryCancel()
	if err := stage(retryCtx); status.Code(err) != codes.Aborted {
		t.Errorf("a stage while the grow runs: %v, want Aborted", err)
	}
	t.Logf("the stage given a 1 s deadline: %v", <-firstDone)
	if _, err := os.Stat(marker); err != nil {
		t.Fatalf("resize2fs did not finish: it was killed when the request's deadline passed")
	}
	if err := stage(e.ctx); err != nil {
		t.Fatalf("staging again: %v", err)
	}
	if data, err := os.ReadFile(filepath.Join(staging, "data")); err != nil || string(data) != "copied" {
		t.Errorf("the restored volume reads %q, %v", data, err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(staging, &st); err != nil {
		t.Fatal(err)
	}
	if fsBytes := int64(st.Blocks) * st.Frsize; fsBytes < 700*mi {
		t.Errorf("the staged filesystem has %d MiB on a volume of %d MiB", fsBytes/mi, vol.CapacityBytes/mi)
	}
	e.teardown(t, vol.VolumeId, staging)
}

// A driver told to stop (SIGTERM: a rollout of the DaemonSet) while an
// offline ext4 grow runs waits for the grow to end, however long the
// calls in flight are otherwise given: resize2fs killed while it moves
// blocks leaves the filesystem marked in error, and the driver's exit
// kills it (its container's processes go with it). Here the calls are
// given 200 ms and the grow takes 2 s; before, Run returned, and the
// process would have exited, with resize2fs still running.
func TestShutdownWaitsForAnOfflineGrow(t *testing.T) {
	defer func(g time.Duration) { shutdownGrace = g }(shutdownGrace)
	shutdownGrace = 200 * time.Millisecond
	e := newEnv(t, []testDisk{{name: "xfs", fsType: "xfs", size: 4 * gi}}, nil)
	vol, cap := e.largerExt4Restore(t)

	cfg := e.d.cfg
	cfg.Endpoint = "unix://" + filepath.Join(t.TempDir(), "csi.sock")
	stopDisks(e.d)
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopDisks(d) })
	grow := &slowResize{Interface: d.exec, marker: filepath.Join(t.TempDir(), "resized"), started: make(chan struct{})}
	d.exec = grow
	ctx, stop := context.WithCancel(e.ctx)
	defer stop()
	ran := make(chan error, 1)
	go func() { ran <- d.Run(ctx) }()
	conn, err := grpc.NewClient(cfg.Endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := waitFor(ctx, func() (bool, error) {
		resp, err := csi.NewIdentityClient(conn).Probe(ctx, &csi.ProbeRequest{}, grpc.WaitForReady(true))
		return err == nil && resp.GetReady().GetValue(), nil
	}); err != nil {
		t.Fatalf("the driver never became ready: %v", err)
	}
	staging := filepath.Join(e.kubelet, "plugins", "staging", "grow")
	go func() {
		_, err := csi.NewNodeClient(conn).NodeStageVolume(e.ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging, VolumeCapability: cap}, grpc.WaitForReady(true))
		t.Logf("the stage: %v", err)
	}()
	select {
	case <-grow.started:
	case <-time.After(time.Minute):
		t.Fatal("resize2fs never started")
	}
	stop()
	if err := <-ran; err != nil {
		t.Errorf("Run: %v", err)
	}
	if _, err := os.Stat(grow.marker); err != nil {
		t.Errorf("Run returned while resize2fs still ran: the driver's exit would have killed it")
	}
	if err := waitFor(e.ctx, func() (bool, error) { return d.isMountPoint(staging) }); err != nil {
		t.Fatalf("the stage never mounted the grown volume: %v", err)
	}
	if _, err := d.NodeUnstageVolume(e.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging}); err != nil {
		t.Error(err)
	}
}

// One volume is never used as a Filesystem and as a Block volume at once:
// a pod writing raw blocks under a mounted filesystem corrupts it, and a
// filesystem staged over a device a pod writes to is mounted from data
// anyone may have written. Two PVs of different volumeMode can name one
// volume (an admin gave it a second PV, or made one by hand without
// volumeMode). With its filesystem staged, a Block stage and a Block
// publish are refused; with it published as a Block device, a Filesystem
// stage is refused and nothing is mounted. Before, all three went ahead.
func TestVolumeIsNeverFilesystemAndBlockAtOnce(t *testing.T) {
	e := newEnv(t, []testDisk{{name: "xfs", fsType: "xfs", size: 2 * gi}}, nil)
	staged := func(t *testing.T, id, name string, cap *csi.VolumeCapability) (string, error) {
		staging := filepath.Join(e.kubelet, "plugins", "staging", name)
		_, err := e.d.NodeStageVolume(e.ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: cap})
		return staging, err
	}

	t.Run("filesystem first", func(t *testing.T) {
		id := e.createWith(t, "pvc-fs-first", 300*mi, mountCap()).VolumeId
		fsStaging := e.stage(t, id, mountCap())
		target, err := e.publish(t, id, fsStaging, "fs-first", mountCap(), false)
		if err != nil {
			t.Fatal(err)
		}
		blockStaging, err := staged(t, id, "fs-first-as-block", blockCap())
		wantCode(t, err, codes.FailedPrecondition)
		_, err = e.publish(t, id, blockStaging, "fs-first-as-block", blockCap(), false)
		wantCode(t, err, codes.FailedPrecondition)
		e.teardown(t, id, fsStaging, target)
	})

	t.Run("block first", func(t *testing.T) {
		id := e.createWith(t, "pvc-block-first", 300*mi, blockCap()).VolumeId
		blockStaging := e.stage(t, id, blockCap())
		target, err := e.publish(t, id, blockStaging, "block-first", blockCap(), false)
		if err != nil {
			t.Fatal(err)
		}
		// The pod writes a filesystem to its device.
		if out, err := exec.Command("mkfs.xfs", "-q", target).CombinedOutput(); err != nil {
			t.Fatalf("mkfs.xfs on the published device: %v: %s", err, out)
		}
		fsStaging, err := staged(t, id, "block-first-as-fs", mountCap())
		wantCode(t, err, codes.FailedPrecondition)
		if mounted, _ := e.d.isMountPoint(fsStaging); mounted {
			t.Errorf("the Block volume's device was mounted as a filesystem at %s", fsStaging)
			_ = unix.Unmount(fsStaging, 0)
		}
		e.teardown(t, id, blockStaging, target)
	})
}

// TestExt4StageDoesNotGrowPastTheRecordedSize: an expansion whose
// allocation failed, and whose cutting back of the data file failed too,
// leaves the file larger than the volume's record. A stage attaches the
// file at its size; the ext4 it holds must not be grown into that tail:
// start cuts the file back to the record once no device holds it, and a
// filesystem grown past it would lose its end (growXFSToVolume leaves an
// XFS as it is there too).
func TestExt4StageDoesNotGrowPastTheRecordedSize(t *testing.T) {
	e := newEnv(t, []testDisk{{name: "xfs", fsType: "xfs", size: 4 * gi}}, nil)
	cap := withFS(mountCap(), "ext4")
	vol := e.createWith(t, "pvc-tail", 256*mi, cap)
	staging := e.stage(t, vol.VolumeId, cap)
	if err := os.WriteFile(filepath.Join(staging, "data"), []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	e.unstage(t, vol.VolumeId, staging)

	files, err := filepath.Glob(filepath.Join(e.paths["xfs"], "diskfit", "volumes", "*.img"))
	if err != nil || len(files) != 1 {
		t.Fatalf("data files %v, %v: want one", files, err)
	}
	if err := os.Truncate(files[0], vol.CapacityBytes+256*mi); err != nil {
		t.Fatal(err)
	}
	staging = e.stage(t, vol.VolumeId, cap)
	var st unix.Statfs_t
	if err := unix.Statfs(staging, &st); err != nil {
		t.Fatal(err)
	}
	if fsBytes := int64(st.Blocks) * st.Frsize; fsBytes > vol.CapacityBytes {
		t.Errorf("the staged ext4 has %d MiB on a volume of %d MiB: grown into a tail that start cuts off", fsBytes/mi, vol.CapacityBytes/mi)
	}
	e.unstage(t, vol.VolumeId, staging)

	// Start cuts the file back to its record; the volume stages and reads
	// back as before.
	e.d = e.restart(t, e.d.cfg)
	staging = e.stage(t, vol.VolumeId, cap)
	if data, err := os.ReadFile(filepath.Join(staging, "data")); err != nil || string(data) != "kept" {
		t.Errorf("after a restart the volume reads %q, %v; want %q", data, err, "kept")
	}
	e.teardown(t, vol.VolumeId, staging)
}

// A stage that fails after it attached the volume detaches it again. The
// kubelet takes AlreadyExists (the staging path holds another mount) as
// final: it calls no NodeUnstageVolume, so a loop device left attached
// would hold the volume for good, and DeleteVolume would refuse it as
// attached. Before, this refusal (and a record that could not be read, or
// a staging path that could not be made) returned with the device
// attached.
func TestFailedStageDetachesWhatItAttached(t *testing.T) {
	e := newEnv(t, []testDisk{{name: "xfs", fsType: "xfs", size: gi}}, nil)
	cap := mountCap()
	id := e.createWith(t, "pvc-blocked", 64*mi, cap).VolumeId
	staging := filepath.Join(e.kubelet, "plugins", "staging", "blocked")
	if err := os.MkdirAll(staging, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", staging, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(staging, unix.MNT_DETACH) })
	_, err := e.d.NodeStageVolume(e.ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: cap})
	wantCode(t, err, codes.AlreadyExists)
	if dev, err := e.d.disk("xfs").backend.Device(e.ctx, "pvc-blocked"); err != nil || dev != "" {
		t.Errorf("after the refused stage the volume is attached at %q (%v), want detached", dev, err)
	}
	if _, err := e.d.DeleteVolume(e.ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Errorf("DeleteVolume after the refused stage: %v", err)
	}
}
