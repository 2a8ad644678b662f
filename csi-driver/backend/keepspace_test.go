package backend

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

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
	setKeepsSpace(t, freeingSpace(t))
	f := closing(t, NewFile(testDiskName, p, 0, nil))
	err := f.Start(ctx)
	if !errors.Is(err, loop.ErrFreesSpace) || !strings.Contains(err.Error(), "5.19") || !strings.Contains(err.Error(), "lvm") {
		t.Errorf("Start on a disk whose loop devices free space: %v, want refused, saying Linux 5.19 or the lvm backend", err)
	}
	noProbeLeft(t, f)
	f.Close()

	setKeepsSpace(t, loop.KeepsSpace)
	if err := closing(t, NewFile(testDiskName, p, 0, nil)).Start(ctx); err != nil {
		t.Errorf("Start on a disk whose loop devices keep space: %v", err)
	}
}

// freeingSpace is a space check that sees the loop devices of a kernel
// before 5.19, which free their backing files' blocks on discard. A loop
// device keeps the discard limit it was given for its next user, so the
// probe gets one made for it, with the default limit.
func freeingSpace(t *testing.T) func(context.Context, loop.File) error {
	withoutLimit := func(f loop.File) (string, error) {
		dev := freshLoopDevice(t)
		_, err := testdisk.Output("losetup", "--direct-io=on", "--sector-size", "4096", dev, f.Path)
		return dev, err
	}
	return func(ctx context.Context, file loop.File) error {
		return loop.KeepsSpaceAttached(ctx, file, withoutLimit)
	}
}

// TestFullDiskStartsAndIsCheckedOnceThereIsRoom: a disk full to the last
// byte is a routine condition, and a driver restarted on it must serve
// its volumes, although its space check (the probe above) has no room for
// its probe file and no disk of the same filesystem type has answered it
// in this process yet. Refusing the disk would make its volumes
// unavailable and the disk count as failed, for want of one free MiB.
// The check still runs once there is room: on a kernel whose loop devices
// free space the disk is then refused (unhealthy, saying why, and its
// volumes are not attached any more); on this kernel it stays healthy.
func TestFullDiskStartsAndIsCheckedOnceThereIsRoom(t *testing.T) {
	testdisk.Require(t)
	ctx := context.Background()
	for _, frees := range []bool{false, true} {
		name := map[bool]string{false: "devices keep space", true: "devices free space"}[frees]
		t.Run(name, func(t *testing.T) {
			f, p := newFile(t, "xfs", 320*mi, 0)
			if _, err := f.CreateVolume(ctx, CreateRequest{Key: "vol", Name: "vol", SizeBytes: 4 * mi}); err != nil {
				t.Fatal(err)
			}
			f.Close()
			fill := fillDisk(t, p)
			if frees {
				setKeepsSpace(t, freeingSpace(t))
			} else {
				setKeepsSpace(t, loop.KeepsSpace)
			}

			// The driver restarted on the full disk.
			g := closing(t, NewFile(testDiskName, p, 0, nil))
			if err := g.Start(ctx); err != nil {
				t.Fatalf("Start on a disk full to the last byte: %v", err)
			}
			t.Cleanup(func() { g.Detach(ctx, "vol") })
			if err := g.Health(ctx); err != nil {
				t.Errorf("the full disk is unhealthy: %v", err)
			}
			if _, err := g.GetVolume(ctx, "vol"); err != nil {
				t.Errorf("the full disk's volume: %v", err)
			}
			if _, err := g.Attach(ctx, "vol", false); err != nil {
				t.Errorf("attaching the full disk's volume: %v", err)
			}
			g.Detach(ctx, "vol")

			// Room again, once the filesystem has let go of the fill's
			// blocks (XFS frees a removed file's in the background).
			if err := os.Remove(fill); err != nil {
				t.Fatal(err)
			}
			waitForRoom(t, p, 2*mi)
			herr := g.Health(ctx)
			_, aerr := g.Attach(ctx, "vol", false)
			if frees {
				if !errors.Is(herr, loop.ErrFreesSpace) || !strings.Contains(herr.Error(), "5.19") {
					t.Errorf("Health once the space check could run: %v, want refused, saying Linux 5.19", herr)
				}
				if !errors.Is(aerr, loop.ErrFreesSpace) {
					t.Errorf("attaching the volume once the space check could run: %v, want refused", aerr)
				}
			} else {
				if herr != nil {
					t.Errorf("Health once there is room: %v", herr)
				}
				if aerr != nil {
					t.Errorf("attaching the volume once there is room: %v", aerr)
				}
			}
			noProbeLeft(t, g)
		})
	}
}

// waitForRoom waits until the filesystem at p has bytes free.
func waitForRoom(t *testing.T, p string, bytes int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var st unix.Statfs_t
		if err := unix.Statfs(p, &st); err != nil {
			t.Fatal(err)
		}
		if free := int64(st.Bfree) * st.Frsize; free >= bytes {
			return
		} else if time.Now().After(deadline) {
			t.Fatalf("%s has %d bytes free, not %d", p, free, bytes)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// noProbeLeft checks that f's space check left neither its probe file
// nor a loop device of it.
func noProbeLeft(t *testing.T, f *File) {
	t.Helper()
	probe := f.loopFile(probeKey)
	if _, err := os.Stat(probe.Path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the probe file is left: %v", err)
	}
	if devs, err := loop.FindAll(context.Background(), probe); err != nil || len(devs) > 0 {
		t.Errorf("the probe's loop devices are left: %v, %v", devs, err)
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
