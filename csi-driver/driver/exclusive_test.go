package driver

import (
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestSecondDriverOnADiskWaits: a second driver on the node (a driver pod
// still terminating while its replacement starts, two installations side
// by side) does not serve a disk that the first one serves: calls for the
// disk's volumes answer Unavailable naming why. Once the first driver is
// gone, the next status refresh starts the disk.
func TestSecondDriverOnADiskWaits(t *testing.T) {
	e := newEnv(t, []testDisk{{name: "only", fsType: "xfs", size: gi}}, nil)
	vol := e.mustCreate(t, createReq("pvc-first", 300*mi))
	second, err := New(e.d.cfg)
	if err != nil {
		t.Fatal(err)
	}
	second.Start(e.ctx)
	t.Cleanup(func() { stopDisks(second) })

	get := &csi.ControllerGetVolumeRequest{VolumeId: vol.VolumeId}
	_, err = second.ControllerGetVolume(e.ctx, get)
	wantCode(t, err, codes.Unavailable)
	if msg := status.Convert(err).Message(); !strings.Contains(msg, "another process serves the disk") {
		t.Errorf("Unavailable does not say why: %s", msg)
	}
	if _, err := e.d.ControllerGetVolume(e.ctx, get); err != nil {
		t.Errorf("the first driver stopped serving the volume: %v", err)
	}

	stopDisks(e.d) // the first driver exits
	second.publish(e.ctx)
	if _, err := second.ControllerGetVolume(e.ctx, get); err != nil {
		t.Errorf("after the first driver is gone and a refresh: %v", err)
	}
}
