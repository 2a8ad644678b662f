package driver

import (
	"context"
	"errors"
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

	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
	"github.com/diskfit/diskfit/csi-driver/internal/fakelvm"
	"github.com/diskfit/diskfit/csi-driver/internal/testdisk"
)

// TestSecondDriverOnADiskWaits: a second driver on the node (a driver pod
// still terminating while its replacement starts, two installations side
// by side) does not serve a disk that the first one serves: calls for the
// disk's volumes answer Unavailable naming why, and its status says that
// another process serves the disk, which diskfit-controller does not
// count as a failure: it releases none of the disk's claims, whose data
// the first driver still serves. Once the first driver is gone, the next
// status refresh starts the disk.
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
	if ds := second.observe(e.ctx, true).Disk("only"); ds == nil || ds.Healthy || ds.Reason != v1alpha1.DiskServedByAnotherProcess || ds.Failed() {
		t.Errorf("the second driver's status of the disk: %+v, want unhealthy with reason %s, not failed", ds, v1alpha1.DiskServedByAnotherProcess)
	}

	stopDisks(e.d) // the first driver exits
	second.publish(e.ctx)
	if _, err := second.ControllerGetVolume(e.ctx, get); err != nil {
		t.Errorf("after the first driver is gone and a refresh: %v", err)
	}
	if ds := second.Observe(e.ctx).Disk("only"); ds == nil || !ds.Healthy || ds.Reason != "" {
		t.Errorf("the disk once the second driver serves it: %+v", ds)
	}
}

// TestSecondDriverCountsADeadDiskAsFailed: a disk that another process
// holds (TestSecondDriverOnADiskWaits) is no failure only while it still
// answers. The first driver may hang because its disk died (I/O stuck on
// the dead device keeps the process, and its lock, alive): a disk whose
// filesystem or volume group fails is reported failed, so that
// diskfit-controller releases its opted-in claims as for any failed disk.
func TestSecondDriverCountsADeadDiskAsFailed(t *testing.T) {
	check := func(t *testing.T, second *Driver, ctx context.Context, die func()) {
		t.Helper()
		if ds := second.observe(ctx, true).Disk(second.disks()[0].name); ds == nil || ds.Reason != v1alpha1.DiskServedByAnotherProcess || ds.Failed() {
			t.Fatalf("the held disk while it answers: %+v, want reason %s, not failed", ds, v1alpha1.DiskServedByAnotherProcess)
		}
		die()
		if ds := second.observe(ctx, true).Disk(second.disks()[0].name); ds == nil || !ds.Failed() {
			t.Errorf("the held disk once dead: %+v, want failed", ds)
		}
	}
	for _, fsType := range []string{"xfs", "ext4"} {
		t.Run(fsType, func(t *testing.T) {
			e := newEnv(t, []testDisk{{name: "only", fsType: fsType, size: 320 * mi}}, nil)
			second, err := New(e.d.cfg)
			if err != nil {
				t.Fatal(err)
			}
			second.Start(e.ctx)
			t.Cleanup(func() { stopDisks(second) })
			check(t, second, e.ctx, func() {
				// What the filesystem does when its device fails:
				// reads answer EIO (XFS also stat, ext4 not).
				testdisk.Run(t, "xfs_io", "-x", "-c", "shutdown", e.paths["only"])
			})
		})
	}
	t.Run("lvm", func(t *testing.T) {
		vg := fakelvm.New(gi)
		_, ctx := ktesting.NewTestContext(t)
		cfg := lvmConfig(t, vg)
		var drivers []*Driver
		for range 2 {
			d, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			d.Start(ctx)
			t.Cleanup(func() { stopDisks(d) })
			drivers = append(drivers, d)
		}
		check(t, drivers[1], ctx, func() {
			vg.SetFail("vgs", errors.New("/dev/sdb: read failed after 0 of 4096 at 0: Input/output error"))
		})
	})
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
	start := func() *Driver { return startOn(ctx, t, cfg) }
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
