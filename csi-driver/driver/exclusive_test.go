package driver

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2/ktesting"

	"github.com/diskfit/diskfit/csi-driver/internal/fakelvm"
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

// TestSecondDriverUnstagesWhileTheFirstHoldsTheDisk: the kubelet unstages
// a volume through the driver it now talks to while the one it staged the
// volume through still holds the disk (terminating in a rollout). The
// second driver cannot serve the disk, but it frees the volume's device
// or says it did not: an unstage answered OK over a device left attached
// keeps the volume "in use" for good, every DeleteVolume refused.
func TestSecondDriverUnstagesWhileTheFirstHoldsTheDisk(t *testing.T) {
	e := newEnv(t, []testDisk{{name: "only", fsType: "xfs", size: gi}}, nil)
	vol := e.mustCreate(t, createReq("pvc-staged", 300*mi))
	staging := e.stage(t, vol.VolumeId, mountCap())
	second, err := New(e.d.cfg)
	if err != nil {
		t.Fatal(err)
	}
	second.Start(e.ctx)
	t.Cleanup(func() { stopDisks(second) })

	_, err = second.NodeUnstageVolume(e.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging})
	dev, derr := e.d.disk("only").backend.Device(e.ctx, "pvc-staged")
	if derr != nil {
		t.Fatal(derr)
	}
	if err == nil && dev != "" {
		t.Errorf("the second driver answered the unstage OK and left %s attached", dev)
	}
	stopDisks(e.d) // the first driver exits
	second.publish(e.ctx)
	if err != nil {
		// The kubelet retries.
		if _, err := second.NodeUnstageVolume(e.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging}); err != nil {
			t.Fatalf("unstage once the first driver is gone: %v", err)
		}
	}
	if _, err := second.DeleteVolume(e.ctx, &csi.DeleteVolumeRequest{VolumeId: vol.VolumeId}); err != nil {
		t.Errorf("DeleteVolume after the unstage: %v", err)
	}
}

// TestSecondDriverOnAVolumeGroupWaits is TestSecondDriverOnADiskWaits for
// an lvm disk: a second driver starts while the first clones a volume (the
// new LV made, its data being copied). It leaves the clone alone and
// answers Unavailable for the group's volumes, naming the lock; the clone
// completes, and once the first driver is gone the next status refresh
// starts the disk in the second. lvm2 is faked (fakelvm): this machine's
// kernel has no device-mapper, so real lvm2 cannot run here.
func TestSecondDriverOnAVolumeGroupWaits(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	vg := fakelvm.New(gi)
	cfg := lvmConfig(t, vg)
	start := func() *Driver {
		d, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		d.Start(ctx)
		t.Cleanup(func() { stopDisks(d) })
		return d
	}
	first := start()
	src, err := first.CreateVolume(ctx, createReq("pvc-src", 64*mi))
	if err != nil {
		t.Fatal(err)
	}
	paused, resume := vg.Hold("dd") // the clone's copy
	t.Cleanup(resume)
	type result struct {
		resp *csi.CreateVolumeResponse
		err  error
	}
	cloned := make(chan result, 1)
	go func() {
		req := createReq("pvc-clone", 64*mi)
		req.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: src.Volume.VolumeId}}}
		resp, err := first.CreateVolume(ctx, req)
		cloned <- result{resp, err}
	}()
	<-paused

	second := start()
	_, err = second.ControllerGetVolume(ctx, &csi.ControllerGetVolumeRequest{VolumeId: src.Volume.VolumeId})
	if status.Code(err) != codes.Unavailable || !strings.Contains(status.Convert(err).Message(), "another process serves") {
		t.Errorf("the second driver answered %v, want Unavailable naming the lock", err)
	}
	resume()
	r := <-cloned
	if r.err != nil {
		t.Fatalf("the first driver's clone failed: %v", r.err)
	}
	clone := &csi.ControllerGetVolumeRequest{VolumeId: r.resp.Volume.VolumeId}
	if _, err := first.ControllerGetVolume(ctx, clone); err != nil {
		t.Errorf("the clone the first driver reported created: %v", err)
	}

	stopDisks(first) // the first driver exits
	second.publish(ctx)
	if _, err := second.ControllerGetVolume(ctx, clone); err != nil {
		t.Errorf("after the first driver is gone and a refresh: %v", err)
	}
}

// deviceMapperControl returns a file that opens as /dev/mapper/control
// would, for an lvm disk whose lvm2 is faked.
func deviceMapperControl(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "control")
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// A volume group whose deleted volumes are still being zeroed is not
// retired: the driver that leaves it would never finish the wipe (only a
// driver serving the group wipes), and the group would go on holding the
// deleted data. Once the wipe is done it retires. lvm2 is faked.
func TestRetireWaitsForWipes(t *testing.T) {
	vg := fakelvm.New(gi)
	ctx, d := startLVMDriver(t, vg)
	vol, err := d.CreateVolume(ctx, createReq("pvc-gone", 64*mi))
	if err != nil {
		t.Fatal(err)
	}
	paused, resume := vg.Hold("blkdiscard")
	t.Cleanup(resume)
	if _, err := d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: vol.Volume.VolumeId}); err != nil {
		t.Fatal(err)
	}
	<-paused
	dk := d.disk("lvm")
	if msg := dk.retire(ctx); !strings.Contains(msg, "zero") {
		t.Fatalf("retire said %q while a deleted volume was being zeroed", msg)
	}
	resume()
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return dk.retire(ctx) == "", nil
	})
	if err != nil {
		t.Errorf("not retired after the wipe: %q", dk.retire(ctx))
	}
}
