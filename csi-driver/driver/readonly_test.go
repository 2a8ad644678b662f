package driver

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestReadOnlyStageWritesNothing: a volume staged read-only ("ro" in the
// mount flags, as a PV made by hand to look at a retained volume's data
// may ask) is not written by the stage: not even to grow an ext4 that an
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

	ro := withFS(mountCap(), "ext4")
	ro.GetMount().MountFlags = []string{"ro"}
	staging = e.stage(t, vol.VolumeId, ro)
	reader, err := e.publish(t, vol.VolumeId, staging, "reader", ro, true)
	if err != nil {
		t.Fatal(err)
	}
	if data, err := os.ReadFile(filepath.Join(reader, "data")); err != nil || string(data) != "hello" {
		t.Errorf("the read-only stage reads %q, %v", data, err)
	}
	e.teardownNode(t, vol.VolumeId, staging, reader)
	if after := fileSum(t, dataPath(e.paths["xfs"], "pvc-read-only")); after != before {
		t.Error("a read-only stage changed the volume's data")
	}

	// A writable stage grows the filesystem as before.
	staging = e.stage(t, vol.VolumeId, cap)
	if _, err := e.d.NodeExpandVolume(e.ctx, &csi.NodeExpandVolumeRequest{VolumeId: vol.VolumeId, VolumePath: staging, StagingTargetPath: staging,
		VolumeCapability: cap, CapacityRange: &csi.CapacityRange{RequiredBytes: 1024 * mi}}); status.Code(err) != codes.OK {
		t.Errorf("NodeExpandVolume after a writable stage: %v", err)
	}
	e.teardown(t, vol.VolumeId, staging)
}
