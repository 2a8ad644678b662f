package driver

import (
	"os"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/csi-driver/internal/testdisk"
)

// xfsGoingDown is XFS_IOC_GOINGDOWN (ext4's EXT4_IOC_SHUTDOWN is the same
// number); xfsNoLogFlush shuts the filesystem down at once, as when its
// device fails.
const (
	xfsGoingDown  = 0x8004587d
	xfsNoLogFlush = 2
)

// TestDiskDisappears takes a disk away from under a running driver in the
// three ways a disk disappears (its filesystem unmounted, the loop device
// under it detached too, the device failing under the mounted filesystem)
// while a volume on it and one on another disk are published. The first
// DiskNode refresh after that marks the disk unhealthy with the reason;
// the health RPCs report the volume on it INACCESSIBLE and its stats and
// ControllerGetVolume fail naming the disk; CreateVolume for that disk is
// ResourceExhausted; the other disk and its volume go on working.
func TestDiskDisappears(t *testing.T) {
	tests := []struct {
		name      string
		disappear func(t *testing.T, mnt string)
		// wantMessage is part of the DiskNode message.
		wantMessage string
	}{
		{
			name:        "unmounted",
			disappear:   func(t *testing.T, mnt string) { testdisk.Run(t, "umount", "--lazy", mnt) },
			wantMessage: "was the disk unmounted?",
		},
		{
			name: "loop device detached",
			disappear: func(t *testing.T, mnt string) {
				dev := testdisk.Source(mnt)
				testdisk.Run(t, "umount", "--lazy", mnt)
				testdisk.Run(t, "losetup", "--detach", dev)
			},
			wantMessage: "was the disk unmounted?",
		},
		{
			name: "device failed",
			disappear: func(t *testing.T, mnt string) {
				fd, err := unix.Open(mnt, unix.O_RDONLY|unix.O_DIRECTORY, 0)
				if err != nil {
					t.Fatal(err)
				}
				defer unix.Close(fd)
				if err := unix.IoctlSetPointerInt(fd, xfsGoingDown, xfsNoLogFlush); err != nil {
					t.Fatalf("shutting the filesystem down: %v", err)
				}
			},
			wantMessage: "input/output error",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, []testDisk{{name: "one", fsType: "xfs", size: 2 * gi}, {name: "two", fsType: "xfs", size: 2 * gi}}, nil)
			cap := mountCap()
			onDisk := func(name, disk string) (id, target string) {
				req := createReq(name, 400*mi)
				req.Parameters = e.addPVC(t, name, map[string]string{diskfit.SelectedNodeAnnotation: testNode, diskfit.SelectedDiskAnnotation: disk})
				vol := e.mustCreate(t, req)
				staging := e.stage(t, vol.VolumeId, cap)
				target, err := e.publish(t, vol.VolumeId, staging, name, cap, false)
				if err != nil {
					t.Fatal(err)
				}
				return vol.VolumeId, target
			}
			idOne, targetOne := onDisk("pvc-one", "one")
			idTwo, targetTwo := onDisk("pvc-two", "two")
			// A disk unmounted from under an attached volume leaves the
			// volume's loop device to the test: the driver finds it by a
			// backing file path that no longer exists.
			devTwo, err := e.d.disk("two").backend.Device(e.ctx, "pvc-two")
			if err != nil || devTwo == "" {
				t.Fatalf("volume on disk two: device %q, %v", devTwo, err)
			}
			testdisk.DetachAtCleanup(t, devTwo) // after the unmounts below
			t.Cleanup(func() {
				for _, p := range testdisk.MountsBelow(e.kubelet) {
					if _, err := testdisk.Output("umount", p); err != nil {
						t.Errorf("unmounting %s: %v", p, err)
					}
				}
			})

			tt.disappear(t, e.paths["two"])
			e.d.publish(e.ctx)
			dn, err := e.diskfit.DiskfitV1alpha1().DiskNodes().Get(e.ctx, testNode, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if two := dn.Status.Disk("two"); two == nil || two.Healthy || !strings.Contains(two.Message, tt.wantMessage) {
				t.Errorf("DiskNode after one refresh: disk two %+v, want unhealthy with %q", two, tt.wantMessage)
			}
			if one := dn.Status.Disk("one"); one == nil || !one.Healthy || one.VolumeCount != 1 {
				t.Errorf("DiskNode: disk one %+v, want healthy with its volume", one)
			}

			// The volume on the lost disk.
			wantInaccessible := func(h *csi.VolumeHealth, err error) {
				t.Helper()
				if err != nil || len(h.GetHealthStatuses()) != 1 || h.HealthStatuses[0].Status != csi.VolumeHealthErrorType_INACCESSIBLE ||
					h.HealthStatuses[0].Reason != "DiskUnhealthy" || !strings.Contains(h.HealthStatuses[0].Message, "disk two") {
					t.Errorf("health of the volume on the lost disk: %v, %v", h, err)
				}
			}
			nh, err := e.d.NodeGetVolumeHealth(e.ctx, &csi.NodeGetVolumeHealthRequest{VolumeId: idTwo, VolumePublishPath: targetTwo})
			wantInaccessible(nh.GetVolumeHealth(), err)
			ch, err := e.d.ControllerGetVolumeHealth(e.ctx, &csi.ControllerGetVolumeHealthRequest{VolumeId: idTwo})
			wantInaccessible(ch.GetVolumeHealth(), err)
			wantFailure := func(what string, err error, code codes.Code) {
				t.Helper()
				if status.Code(err) != code || !strings.Contains(status.Convert(err).Message(), "disk two") {
					t.Errorf("%s of the volume on the lost disk: %v, want %s naming the disk", what, err, code)
				}
			}
			_, err = e.d.NodeGetVolumeStats(e.ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: idTwo, VolumePath: targetTwo})
			wantFailure("NodeGetVolumeStats", err, codes.Unavailable)
			_, err = e.d.ControllerGetVolume(e.ctx, &csi.ControllerGetVolumeRequest{VolumeId: idTwo})
			wantFailure("ControllerGetVolume", err, codes.Unavailable)
			req := createReq("pvc-new-on-two", 400*mi)
			req.Parameters = e.addPVC(t, "pvc-new-on-two", map[string]string{diskfit.SelectedNodeAnnotation: testNode, diskfit.SelectedDiskAnnotation: "two"})
			_, err = e.d.CreateVolume(e.ctx, req)
			wantFailure("CreateVolume", err, codes.ResourceExhausted)
			sh, err := e.d.NodeGetStorageHealth(e.ctx, &csi.NodeGetStorageHealthRequest{})
			if err != nil || len(sh.BackendHealth) != 1 || !strings.Contains(sh.BackendHealth[0].Message, "disk two") {
				t.Errorf("storage health %v, %v", sh, err)
			}

			// The other disk and its volume are undisturbed.
			stats, err := e.d.NodeGetVolumeStats(e.ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: idOne, VolumePath: targetOne})
			if err != nil || len(stats.Usage) != 2 || stats.Usage[0].Total == 0 {
				t.Errorf("stats of the volume on the healthy disk: %v, %v", stats, err)
			}
			nh, err = e.d.NodeGetVolumeHealth(e.ctx, &csi.NodeGetVolumeHealthRequest{VolumeId: idOne})
			if err != nil || len(nh.VolumeHealth.HealthStatuses) != 0 {
				t.Errorf("health of the volume on the healthy disk: %v, %v", nh, err)
			}
			if err := os.WriteFile(targetOne+"/data", []byte("still here"), 0o600); err != nil {
				t.Errorf("writing to the volume on the healthy disk: %v", err)
			}
			// Without an annotation the new volume goes to the healthy disk.
			vol := e.mustCreate(t, createReq("pvc-new", 400*mi))
			if !strings.HasPrefix(vol.VolumeId, "one:") {
				t.Errorf("new volume placed as %s, want on disk one", vol.VolumeId)
			}
			e.stage(t, vol.VolumeId, cap)
		})
	}
}
