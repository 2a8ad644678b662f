package backend

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/diskfit/diskfit/csi-driver/internal/testdisk"
)

// TestStateDirectoryOnItsOwnDevice: a loop device reports the device
// number of its backing file's filesystem as stat gives it, which on btrfs
// is per subvolume; the volumes of a disk whose diskfit/ directory is a
// subvolume of its own (or any filesystem other than the disk path's)
// must still be found, or DeleteVolume removes an attached volume's file
// under its live device.
func TestStateDirectoryOnItsOwnDevice(t *testing.T) {
	testdisk.Require(t)
	if _, err := os.Stat("/usr/bin/mkfs.btrfs"); err != nil {
		if _, err := os.Stat("/sbin/mkfs.btrfs"); err != nil {
			t.Skip("needs mkfs.btrfs (apt-get install -y btrfs-progs): a btrfs subvolume has a device number of its own")
		}
	}
	ctx := context.Background()
	dir := t.TempDir()
	img, mnt := filepath.Join(dir, "disk.img"), filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if f, err := os.Create(img); err != nil {
		t.Fatal(err)
	} else {
		f.Truncate(512 * mi)
		f.Close()
	}
	disk := strings.TrimSpace(testdisk.Run(t, "losetup", "--find", "--show", img))
	testdisk.DetachAtCleanup(t, disk)
	testdisk.Run(t, "mkfs.btrfs", "-q", "-f", disk)
	testdisk.Run(t, "mount", disk, mnt)
	t.Cleanup(func() { testdisk.Teardown(t, mnt) })
	testdisk.Run(t, "btrfs", "subvolume", "create", filepath.Join(mnt, stateDirName))

	f := closing(t, NewFile(testDiskName, mnt, 0, nil))
	if err := f.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := f.CreateVolume(ctx, CreateRequest{Key: "v", Name: "v", SizeBytes: 64 * mi}); err != nil {
		t.Fatal(err)
	}
	dev, err := f.Attach(ctx, "v", false)
	if err != nil {
		t.Fatal(err)
	}
	testdisk.DetachAtCleanup(t, dev)
	if found, err := f.Device(ctx, "v"); err != nil || found != dev {
		t.Errorf("Device of the attached volume: %q, %v, want %s", found, err, dev)
	}
	if err := f.DeleteVolume(ctx, "v"); !errors.Is(err, ErrInUse) {
		t.Errorf("DeleteVolume of a volume attached to %s: %v, want ErrInUse", dev, err)
	}
}

// TestBackupCopyOnTheSameDiskIsNotTheVolume: a reflink backup of the
// state directory kept on the same disk (docs/csi-driver.md counts such
// `cp --reflink` backups), attached by an admin to look into it, has a
// backing file whose name ends like the volume's on the same filesystem.
// It is not the volume: Attach (NodeStageVolume) must not hand the
// backup's device out as the volume's, nor Detach free the admin's device.
func TestBackupCopyOnTheSameDiskIsNotTheVolume(t *testing.T) {
	ctx := context.Background()
	f, p := newFile(t, "xfs", 512*mi, 0)
	if _, err := f.CreateVolume(ctx, CreateRequest{Key: "v", Name: "v", SizeBytes: 64 * mi}); err != nil {
		t.Fatal(err)
	}
	backup := filepath.Join(p, "backup-2026-12-01")
	if err := os.Mkdir(backup, 0o700); err != nil {
		t.Fatal(err)
	}
	testdisk.Run(t, "cp", "-a", "--reflink=always", filepath.Join(p, stateDirName), backup)
	copyFile := filepath.Join(backup, stateDirName, volumesDirName, "v"+dataSuffix)
	admin := strings.TrimSpace(testdisk.Run(t, "losetup", "--find", "--show", "--read-only", copyFile))
	testdisk.DetachAtCleanup(t, admin)

	if found, err := f.Device(ctx, "v"); err != nil || found != "" {
		t.Errorf("Device of volume v, never attached: %q, %v, want none (%s serves the backup %s)", found, err, admin, copyFile)
	}
	dev, err := f.Attach(ctx, "v", false)
	if err != nil {
		t.Fatal(err)
	}
	if dev == admin {
		t.Errorf("Attach(v) handed out %s, the admin's device on the backup %s", dev, copyFile)
	} else {
		testdisk.DetachAtCleanup(t, dev)
	}
}
