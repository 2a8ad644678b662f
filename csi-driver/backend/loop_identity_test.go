package backend

import (
	"bytes"
	"context"
	"errors"
	"fmt"
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
	mnt := btrfsDisk(t, "a btrfs subvolume has a device number of its own")
	ctx := context.Background()
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

// TestVolumeOnBtrfsKeepsItsSpace: on btrfs every overwrite is copied on
// write, so a volume's preallocation held only for its first write: once
// the disk was full (diskfit fills disks by design), the pod's next write
// over its own data failed with ENOSPC, its filesystem with I/O errors.
// The volumes' files are made NOCOW there (written in place, as on XFS
// and ext4), so an overwrite needs no new space; snapshots and clones,
// whose shared extents btrfs copies on the next write, are refused.
func TestVolumeOnBtrfsKeepsItsSpace(t *testing.T) {
	mnt := btrfsDisk(t, "the disk copies every overwrite")
	ctx := context.Background()
	if err := os.Mkdir(filepath.Join(mnt, stateDirName), 0o700); err != nil {
		t.Fatal(err)
	}
	f := closing(t, NewFile(testDiskName, mnt, 0, nil))
	if err := f.Start(ctx); err != nil {
		t.Fatal(err)
	}
	restoreMadeBefore(ctx, t, f)
	if _, err := f.CreateVolume(ctx, CreateRequest{Key: "v", Name: "v", SizeBytes: 64 * mi}); err != nil {
		t.Fatal(err)
	}
	write := func(b byte) error {
		data, err := os.OpenFile(f.volumeFile("v"), os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		defer data.Close()
		if _, err := data.Write(bytes.Repeat([]byte{b}, int(64*mi))); err != nil {
			return err
		}
		return data.Sync()
	}
	if err := write('a'); err != nil {
		t.Fatalf("the pod's first write: %v", err)
	}
	// A snapshot or clone would share the volume's extents, whose next
	// overwrite needs space btrfs cannot be made to keep: refused.
	if _, err := f.CreateSnapshot(ctx, SnapshotRequest{Key: "s", Name: "s", SourceKey: "v"}); !errors.Is(err, ErrUnsupported) {
		t.Errorf("snapshot of a volume on btrfs: %v, want ErrUnsupported", err)
	}
	if _, err := f.CreateVolume(ctx, CreateRequest{Key: "clone", Name: "clone", SizeBytes: 64 * mi, FromVolume: "v"}); !errors.Is(err, ErrUnsupported) {
		t.Errorf("clone of a volume on btrfs: %v, want ErrUnsupported", err)
	}

	// Other volumes fill the disk.
	for i := 0; ; i++ {
		_, err := f.CreateVolume(ctx, CreateRequest{Key: fmt.Sprintf("fill%d", i), Name: "fill", SizeBytes: 16 * mi})
		if errors.Is(err, ErrNoSpace) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := write('b'); err != nil {
		t.Errorf("the pod's write over its own data on a full btrfs disk: %v", err)
	}
}

// btrfsDisk makes a 512 MiB btrfs filesystem on a loop device, mounted
// for the test, and returns its mount point; it skips the test, saying
// why it needs btrfs, without mkfs.btrfs.
func btrfsDisk(t *testing.T, why string) string {
	t.Helper()
	testdisk.Require(t)
	if _, err := os.Stat("/usr/bin/mkfs.btrfs"); err != nil {
		if _, err := os.Stat("/sbin/mkfs.btrfs"); err != nil {
			t.Skipf("needs mkfs.btrfs (apt-get install -y btrfs-progs): %s", why)
		}
	}
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
	return mnt
}

// restoreMadeBefore checks, on a btrfs disk, that a snapshot made before
// the driver refused them there (of a volume made copy-on-write then) is
// restored as a copy of its bytes, written in place: the snapshotter
// still calls the driver for it (snapshots stay supported), and the
// restore shares nothing. It removes what it made.
func restoreMadeBefore(ctx context.Context, t *testing.T, f *File) {
	t.Helper()
	f.copiesOnWrite.Store(false)
	if _, err := f.CreateVolume(ctx, CreateRequest{Key: "before", Name: "before", SizeBytes: 32 * mi}); err != nil {
		t.Fatal(err)
	}
	want := bytes.Repeat([]byte{'p'}, int(32*mi))
	if err := os.WriteFile(f.volumeFile("before"), want, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := f.CreateSnapshot(ctx, SnapshotRequest{Key: "old", Name: "old", SourceKey: "before"}); err != nil {
		t.Fatal(err)
	}
	f.copiesOnWrite.Store(true)
	if !f.SupportsSnapshots() {
		t.Error("a btrfs disk with snapshots says it supports none: the snapshotter would stop")
	}
	if _, err := f.CreateVolume(ctx, CreateRequest{Key: "restored", Name: "restored", SizeBytes: 32 * mi, FromSnapshot: "old"}); err != nil {
		t.Fatalf("restoring a snapshot on btrfs: %v", err)
	}
	if got, err := os.ReadFile(f.volumeFile("restored")); err != nil || !bytes.Equal(got, want) {
		t.Errorf("the restore does not hold the snapshot's data (err %v)", err)
	}
	for _, err := range []error{f.DeleteVolume(ctx, "restored"), f.DeleteSnapshot(ctx, "old"), f.DeleteVolume(ctx, "before")} {
		if err != nil {
			t.Fatal(err)
		}
	}
}
