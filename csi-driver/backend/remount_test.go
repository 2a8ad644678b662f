package backend

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/diskfit/diskfit/csi-driver/internal/testdisk"
)

// TestVolumeInUseOnADiskMountedAgain: a disk whose filesystem was detached
// lazily while a volume on it was attached (a failed or pulled disk) and
// then mounted again still has that volume's loop device open on the old
// mount, where the kernel names the backing file differently. The driver
// must still see the volume as attached: a driver restart must not cut
// back a file a live filesystem has grown into, DeleteVolume must not
// remove it, and Detach (NodeUnstageVolume) must free the device.
func TestVolumeInUseOnADiskMountedAgain(t *testing.T) {
	ctx := context.Background()
	f, p, dev, src := attachedOnDiskTakenAway(t)
	was, _ := testdisk.BackingOf(dev)
	testdisk.Run(t, "mount", src, p)

	if found, err := f.Device(ctx, "v"); err != nil || found != dev {
		t.Errorf("Device after the disk was mounted again: %q, %v, want %s", found, err, dev)
	}

	// An expansion interrupted after the device saw the new size and
	// before the record did: the filesystem on the device may already use
	// the extra space, so a restarted driver keeps the larger file.
	const grown = 128 * mi
	testdisk.Run(t, "fallocate", "-l", fmt.Sprint(grown), f.volumeFile("v"))
	testdisk.Run(t, "losetup", "--set-capacity", dev)
	f.Close()
	restarted := closing(t, NewFile(testDiskName, p, 0, nil))
	if err := restarted.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(f.volumeFile("v")); err != nil {
		t.Fatal(err)
	} else if st.Size() != grown {
		t.Errorf("after a restart the attached volume's file has %d bytes, want %d: cut back under the device", st.Size(), grown)
	}

	if err := restarted.DeleteVolume(ctx, "v"); !errors.Is(err, ErrInUse) {
		t.Errorf("DeleteVolume of the attached volume: %v, want ErrInUse", err)
	}
	if _, err := restarted.GetVolume(ctx, "v"); err != nil {
		t.Errorf("the attached volume is gone: %v", err)
	}

	if err := restarted.Detach(ctx, "v"); err != nil {
		t.Fatal(err)
	}
	if now, ok := testdisk.BackingOf(dev); ok && now == was {
		t.Errorf("%s is still attached after Detach", dev)
	}
	if err := restarted.DeleteVolume(ctx, "v"); err != nil {
		t.Errorf("DeleteVolume after Detach: %v", err)
	}
}

// TestDetachWhileTheDiskIsAway: the kubelet unstages the volumes of a pod
// that a failed disk's release moved away while the disk's filesystem is
// gone (detached lazily). The loop device must still be found and freed,
// or it holds the old filesystem, and the disk's device under it, forever;
// mounted again later, the volume is deleted normally.
func TestDetachWhileTheDiskIsAway(t *testing.T) {
	ctx := context.Background()
	f, p, dev, src := attachedOnDiskTakenAway(t)
	was, _ := testdisk.BackingOf(dev)
	if err := f.Health(ctx); err == nil {
		t.Fatal("the disk is away but healthy")
	}
	if found, err := f.Device(ctx, "v"); err != nil || found != dev {
		t.Errorf("Device while the disk is away: %q, %v, want %s", found, err, dev)
	}
	if err := f.Detach(ctx, "v"); err != nil {
		t.Fatal(err)
	}
	if now, ok := testdisk.BackingOf(dev); ok && now == was {
		t.Errorf("%s is still attached after Detach", dev)
	}

	testdisk.Run(t, "mount", src, p)
	if err := f.DeleteVolume(ctx, "v"); err != nil {
		t.Errorf("DeleteVolume once the disk is back: %v", err)
	}
}

// attachedOnDiskTakenAway makes volume "v" on a disk of its own, attaches
// it and detaches the disk's filesystem lazily, as a failed or pulled disk
// is. src is the disk's device, to mount it at p again.
func attachedOnDiskTakenAway(t *testing.T) (f *File, p, dev, src string) {
	t.Helper()
	ctx := context.Background()
	f, p = newFile(t, "xfs", 512*mi, 0)
	if _, err := f.CreateVolume(ctx, CreateRequest{Key: "v", Name: "v", SizeBytes: 64 * mi}); err != nil {
		t.Fatal(err)
	}
	dev, err := f.Attach(ctx, "v", false)
	if err != nil {
		t.Fatal(err)
	}
	// Runs before the disk's own cleanup, which finds devices by path.
	testdisk.DetachAtCleanup(t, dev)
	src = testdisk.Source(p)
	testdisk.Run(t, "umount", "--lazy", p)
	return f, p, dev, src
}
