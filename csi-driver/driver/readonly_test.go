package driver

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestReadOnlyStageWritesNothing: a volume staged read-only ("ro" in the
// mount flags, as a PV made by hand to look at a retained volume's data
// may ask, or the access mode SINGLE_NODE_READER_ONLY) is mounted
// read-only and not written by the stage: not even to grow an ext4 that an
// expansion left smaller than its device, which a writable stage does
// offline (e2fsck, resize2fs). The volume's data file reads the same
// before and after, and the files on it are there.
func TestReadOnlyStageWritesNothing(t *testing.T) {
	e := newEnv(t, []testDisk{{name: "xfs", fsType: "xfs", size: 4 * gi}}, nil)
	cap := withFS(mountCap(), "ext4")
	vol := e.createWith(t, "pvc-read-only", 512*mi, cap)
	staging := e.stage(t, vol.VolumeId, cap)
	target, err := e.publish(t, vol.VolumeId, staging, "writer", cap, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(target, "data"), []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = e.d.NodeExpandVolume(e.ctx, &csi.NodeExpandVolumeRequest{VolumeId: vol.VolumeId, VolumePath: target, StagingTargetPath: staging,
		VolumeCapability: cap, CapacityRange: &csi.CapacityRange{RequiredBytes: 1024 * mi}})
	if err == nil {
		t.Skip("this kernel grows ext4 online: no filesystem is left to grow at the next stage")
	}
	wantCode(t, err, codes.FailedPrecondition)
	e.teardownNode(t, vol.VolumeId, staging, target)
	before := fileSum(t, dataPath(e.paths["xfs"], "pvc-read-only"))

	roFlag := withFS(mountCap(), "ext4")
	roFlag.GetMount().MountFlags = []string{"ro"}
	// mount(8) takes a comma-separated list in one flag, and so does a
	// PV's mountOptions entry.
	roInAList := withFS(mountCap(), "ext4")
	roInAList.GetMount().MountFlags = []string{"noatime,ro"}
	readerOnly := withFS(mountCap(), "ext4")
	readerOnly.AccessMode.Mode = csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY
	for _, tt := range []struct {
		what string
		ro   *csi.VolumeCapability
	}{{`"ro" in the mount flags`, roFlag}, {`"noatime,ro" in the mount flags`, roInAList}, {"SINGLE_NODE_READER_ONLY", readerOnly}} {
		staging = e.stage(t, vol.VolumeId, tt.ro)
		if opts := mountOptionsAt(t, staging); !slices.Contains(opts, "ro") {
			t.Errorf("%s: staged with %v, want ro", tt.what, opts)
		}
		reader, err := e.publish(t, vol.VolumeId, staging, "reader", tt.ro, true)
		if err != nil {
			t.Fatal(err)
		}
		if data, err := os.ReadFile(filepath.Join(reader, "data")); err != nil || string(data) != "hello" {
			t.Errorf("%s: the read-only stage reads %q, %v", tt.what, data, err)
		}
		e.teardownNode(t, vol.VolumeId, staging, reader)
		if after := fileSum(t, dataPath(e.paths["xfs"], "pvc-read-only")); after != before {
			t.Errorf("%s: a read-only stage changed the volume's data", tt.what)
		}
	}

	// A writable stage grows the filesystem as before.
	staging = e.stage(t, vol.VolumeId, cap)
	if _, err := e.d.NodeExpandVolume(e.ctx, &csi.NodeExpandVolumeRequest{VolumeId: vol.VolumeId, VolumePath: staging, StagingTargetPath: staging,
		VolumeCapability: cap, CapacityRange: &csi.CapacityRange{RequiredBytes: 1024 * mi}}); status.Code(err) != codes.OK {
		t.Errorf("NodeExpandVolume after a writable stage: %v", err)
	}
	e.teardown(t, vol.VolumeId, staging)
}

// A Block volume staged SINGLE_NODE_READER_ONLY is a read-only device: a
// pod that opens the published device for writing cannot change the volume
// (a read-only bind mount does not stop writes to a device node, and the
// kubelet gives the container its own node with write permission unless
// the pod says readOnly). The next read-write stage writes again: the flag
// belongs to that attachment, not to the loop device, which another volume
// may get next.
func TestReaderOnlyBlockVolumeIsReadOnly(t *testing.T) {
	e := newEnv(t, []testDisk{{name: "xfs", fsType: "xfs", size: 4 * gi}}, nil)
	vol := e.createWith(t, "pvc-ro-block", 64*mi, blockCap())
	data := dataPath(e.paths["xfs"], "pvc-ro-block")
	write := func(device string) error {
		f, err := os.OpenFile(device, os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		if _, err := f.WriteAt(bytes.Repeat([]byte{0xff}, 4096), 0); err != nil {
			return err
		}
		return f.Sync()
	}

	ro := blockCap()
	ro.AccessMode.Mode = csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY
	before := fileSum(t, data)
	staging := e.stage(t, vol.VolumeId, ro)
	reader, err := e.publish(t, vol.VolumeId, staging, "reader", ro, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := write(reader); err == nil {
		t.Error("a pod wrote to a Block volume staged SINGLE_NODE_READER_ONLY")
	}
	e.teardownNode(t, vol.VolumeId, staging, reader)
	if fileSum(t, data) != before {
		t.Error("the reader-only Block volume changed")
	}

	rw := blockCap()
	staging = e.stage(t, vol.VolumeId, rw)
	writer, err := e.publish(t, vol.VolumeId, staging, "writer", rw, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := write(writer); err != nil {
		t.Errorf("the read-write stage after a reader-only one: %v", err)
	}
	e.teardownNode(t, vol.VolumeId, staging, writer)
}
