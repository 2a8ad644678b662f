package driver

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/diskfit/diskfit/csi-driver/internal/testdisk"
)

// TestDiskDownAtStart: a disk that is not mounted when the driver starts
// is never reported as "volume gone". Calls for its volumes and snapshots
// answer Unavailable (DeleteVolume and DeleteSnapshot above all: success
// there would have the PV deleted and the data left untracked), while
// unpublish and unstage still unmount from the mount table, so pods can
// terminate. When the disk is mounted, the next status refresh starts it
// and its volumes are served again, without a restart.
func TestDiskDownAtStart(t *testing.T) {
	e := newEnv(t, []testDisk{{name: "late", fsType: "xfs", size: 1 * gi}}, nil)
	vol := e.mustCreate(t, createReq("pvc-late", 300*mi))
	snap, err := e.d.CreateSnapshot(e.ctx, &csi.CreateSnapshotRequest{Name: "snap-late", SourceVolumeId: vol.VolumeId})
	if err != nil {
		t.Fatal(err)
	}
	snapID := snap.GetSnapshot().GetSnapshotId()

	// The node reboots and the disk is mounted late.
	path := e.paths["late"]
	dev := testdisk.Source(path)
	stopDisks(e.d)
	testdisk.Run(t, "umount", path)
	d := newDriverOn(t, e)

	// Staging and target paths as the kubelet left them: mounts made
	// before the restart, still there.
	staging := filepath.Join(e.kubelet, "plugins", "staging", "late")
	target := filepath.Join(e.kubelet, "pods", "late")
	for _, p := range []string{staging, target} {
		if err := os.MkdirAll(p, 0o750); err != nil {
			t.Fatal(err)
		}
		testdisk.Run(t, "mount", "-t", "tmpfs", "tmpfs", p)
	}

	for _, tt := range []struct {
		name string
		call func() error
	}{
		{"DeleteVolume", func() error {
			_, err := d.DeleteVolume(e.ctx, &csi.DeleteVolumeRequest{VolumeId: vol.VolumeId})
			return err
		}},
		{"DeleteSnapshot", func() error {
			_, err := d.DeleteSnapshot(e.ctx, &csi.DeleteSnapshotRequest{SnapshotId: snapID})
			return err
		}},
		{"ControllerGetVolume", func() error {
			_, err := d.ControllerGetVolume(e.ctx, &csi.ControllerGetVolumeRequest{VolumeId: vol.VolumeId})
			return err
		}},
		{"GetSnapshot", func() error {
			_, err := d.GetSnapshot(e.ctx, &csi.GetSnapshotRequest{SnapshotId: snapID})
			return err
		}},
		{"CreateVolume from the snapshot", func() error {
			req := createReq("pvc-restore", 300*mi)
			req.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
				Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snapID}}}
			_, err := d.CreateVolume(e.ctx, req)
			return err
		}},
		{"NodeStageVolume", func() error {
			_, err := d.NodeStageVolume(e.ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.VolumeId,
				StagingTargetPath: filepath.Join(e.kubelet, "plugins", "staging", "other"), VolumeCapability: mountCap()})
			return err
		}},
	} {
		t.Run(tt.name, func(t *testing.T) { wantCode(t, tt.call(), codes.Unavailable) })
	}

	if _, err := d.NodeUnpublishVolume(e.ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vol.VolumeId, TargetPath: target}); err != nil {
		t.Errorf("NodeUnpublishVolume: %v", err)
	}
	if _, err := d.NodeUnstageVolume(e.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging}); err != nil {
		t.Errorf("NodeUnstageVolume: %v", err)
	}
	for _, p := range []string{staging, target} {
		if testdisk.Source(p) != "" {
			t.Errorf("%s is still mounted", p)
		}
	}

	// The disk comes back; the next refresh starts it.
	testdisk.Run(t, "mount", dev, path)
	d.publish(e.ctx)
	if _, err := d.ControllerGetVolume(e.ctx, &csi.ControllerGetVolumeRequest{VolumeId: vol.VolumeId}); err != nil {
		t.Fatalf("the volume is not served once its disk is mounted: %v", err)
	}
	if _, err := d.DeleteSnapshot(e.ctx, &csi.DeleteSnapshotRequest{SnapshotId: snapID}); err != nil {
		t.Errorf("DeleteSnapshot: %v", err)
	}
	if _, err := d.DeleteVolume(e.ctx, &csi.DeleteVolumeRequest{VolumeId: vol.VolumeId}); err != nil {
		t.Errorf("DeleteVolume: %v", err)
	}
	if files := e.volumeFiles(t); len(files) != 0 {
		t.Errorf("files left after deleting: %v", files)
	}
}
