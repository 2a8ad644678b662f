package driver

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/diskfit/diskfit/csi-driver/internal/testdisk"
)

// TestPathsThroughSymlinkedMissingParents: a stage or publish path whose
// ancestor is a symlink leading out of the kubelet directory is refused
// even when the directories below the symlink do not exist yet, before
// anything is created: making them would follow the symlink out.
func TestPathsThroughSymlinkedMissingParents(t *testing.T) {
	e := newEnv(t, []testDisk{{name: "only", fsType: "xfs", size: 1 * gi}}, nil)
	vol := e.mustCreate(t, createReq("pvc-paths", 300*mi))
	outside := t.TempDir()
	// Should the driver escape, what it mounted outside goes first, so the
	// disk's own cleanup can detach and unmount.
	t.Cleanup(func() { testdisk.Teardown(t, outside) })
	link := filepath.Join(e.kubelet, "pods", "link")
	if err := os.MkdirAll(filepath.Dir(link), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, link); err != nil {
		t.Fatal(err)
	}
	staging := filepath.Join(link, "missing", "staging")
	_, err := e.d.NodeStageVolume(e.ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging, VolumeCapability: mountCap()})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("staging below a symlink out of the kubelet directory: %v, want InvalidArgument", err)
	}
	good := e.stage(t, vol.VolumeId, mountCap())
	target := filepath.Join(link, "missing", "mount")
	_, err = e.d.NodePublishVolume(e.ctx, &csi.NodePublishVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: good, TargetPath: target, VolumeCapability: mountCap()})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("publishing below a symlink out of the kubelet directory: %v, want InvalidArgument", err)
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Errorf("the driver made %v outside the kubelet directory", entries)
	}
}
