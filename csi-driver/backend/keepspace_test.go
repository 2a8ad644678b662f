package backend

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/diskfit/diskfit/csi-driver/internal/testdisk"
	"github.com/diskfit/diskfit/csi-driver/loop"
)

// TestDiskWhoseLoopDevicesFreeSpaceIsRefused: before Linux 5.19 the loop
// driver turns a discard (the driver's mkfs, the host's fstrim) into a
// hole punched in the backing file although the device's discard limit
// is 0. A volume's preallocated space would go back to the disk, be
// handed to another volume, and the first volume's writes would fail
// once the disk is full. This kernel honours the limit, so such a
// kernel's devices are made by attaching the probe without the limit: a
// real loop device on a real XFS disk, which frees the blocks; only the
// old kernel cannot run here. A disk whose loop devices free space does
// not start, saying why, and leaves nothing behind; one whose devices
// keep it starts.
func TestDiskWhoseLoopDevicesFreeSpaceIsRefused(t *testing.T) {
	testdisk.Require(t)
	ctx := context.Background()
	p := testdisk.New(t, "xfs", 512*mi)
	// A loop device keeps the discard limit it was given for its next
	// user, so the probe gets one made for it, with the default limit.
	withoutLimit := func(f loop.File) (string, error) {
		dev := freshLoopDevice(t)
		_, err := testdisk.Output("losetup", "--direct-io=on", "--sector-size", "4096", dev, f.Path)
		return dev, err
	}
	setKeepsSpace(t, func(ctx context.Context, file loop.File) error {
		return loop.KeepsSpaceAttached(ctx, file, withoutLimit)
	})
	f := closing(t, NewFile(testDiskName, p, 0, nil))
	err := f.Start(ctx)
	if !errors.Is(err, loop.ErrFreesSpace) || !strings.Contains(err.Error(), "5.19") || !strings.Contains(err.Error(), "lvm") {
		t.Errorf("Start on a disk whose loop devices free space: %v, want refused, saying Linux 5.19 or the lvm backend", err)
	}
	probe := f.loopFile(probeKey)
	if _, serr := os.Stat(probe.Path); !errors.Is(serr, os.ErrNotExist) {
		t.Errorf("the probe file is left: %v", serr)
	}
	if devs, err := loop.FindAll(ctx, probe); err != nil || len(devs) > 0 {
		t.Errorf("the probe's loop devices are left: %v, %v", devs, err)
	}
	f.Close()

	setKeepsSpace(t, loop.KeepsSpace)
	if err := closing(t, NewFile(testDiskName, p, 0, nil)).Start(ctx); err != nil {
		t.Errorf("Start on a disk whose loop devices keep space: %v", err)
	}
}

// setKeepsSpace has file disks check their loop devices with check, and
// forgets earlier verdicts, until the test ends.
func setKeepsSpace(t *testing.T, check func(context.Context, loop.File) error) {
	was := keepsSpace
	keepsSpace = check
	forgetSpaceVerdicts()
	t.Cleanup(func() {
		keepsSpace = was
		forgetSpaceVerdicts()
	})
}

// freshLoopDevice makes a loop device that was never used, with the
// kernel's default queue limits, and removes it when the test ends.
func freshLoopDevice(t *testing.T) string {
	t.Helper()
	ctl, err := unix.Open("/dev/loop-control", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ctl)
	for n := uintptr(1000); n < 1100; n++ {
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(ctl), unix.LOOP_CTL_ADD, n); errno == unix.EEXIST {
			continue
		} else if errno != 0 {
			t.Fatalf("making loop device %d: %v", n, errno)
		}
		t.Cleanup(func() {
			ctl, err := unix.Open("/dev/loop-control", unix.O_RDWR|unix.O_CLOEXEC, 0)
			if err != nil {
				t.Error(err)
				return
			}
			defer unix.Close(ctl)
			if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(ctl), unix.LOOP_CTL_REMOVE, n); errno != 0 {
				t.Errorf("removing loop device %d: %v", n, errno)
			}
		})
		return fmt.Sprintf("/dev/loop%d", n)
	}
	t.Fatal("no loop device number free from 1000 to 1099")
	return ""
}

// TestSpaceCheckCutShortLeavesNothing: the driver was killed during a
// start's space check, with the probe file attached. The next start
// detaches and removes it (before anything reads the volume directory,
// where it would be taken for a volume's leftover and removed from under
// its device, which would then stay attached for good), also when no
// check runs (the filesystem type's verdict is known).
func TestSpaceCheckCutShortLeavesNothing(t *testing.T) {
	ctx := context.Background()
	f, p := newFile(t, "xfs", 512*mi, 0) // the verdict for XFS is known from here on
	f.Close()
	probe := f.loopFile(probeKey)
	testdisk.Run(t, "fallocate", "-l", "1M", probe.Path)
	dev := strings.TrimSpace(testdisk.Run(t, "losetup", "--find", "--show", probe.Path))
	testdisk.DetachAtCleanup(t, dev)
	if err := closing(t, NewFile(testDiskName, p, 0, nil)).Start(ctx); err != nil {
		t.Fatal(err)
	}
	if devs, err := loop.FindAll(ctx, probe); err != nil || len(devs) > 0 {
		t.Errorf("the probe of the check cut short is still attached: %v, %v", devs, err)
	}
	if backing, err := os.ReadFile("/sys/block/" + strings.TrimPrefix(dev, "/dev/") + "/loop/backing_file"); err == nil {
		t.Errorf("%s still serves %s", dev, strings.TrimSpace(string(backing)))
	}
	if _, err := os.Stat(probe.Path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the probe file of the check cut short is left: %v", err)
	}
}
