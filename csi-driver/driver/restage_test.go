package driver

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
)

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
	pubs, _ := devicePublications(dev)
	got, _ := dk.backend.Device(e.ctx, "pvc-block-old")
	if len(pubs) > 0 && got != dev {
		t.Errorf("the re-stage detached %s (now %q) while it is published at %v", dev, got, pubs)
	}
	os.Remove(filepath.Join(e.paths["xfs"], "fill"))
	_ = target
}
