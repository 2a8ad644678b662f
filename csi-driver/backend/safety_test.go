package backend

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/diskfit/diskfit/csi-driver/fault"
	"github.com/diskfit/diskfit/csi-driver/internal/testdisk"
)

// TestFailedExpansionGivesTheSpaceBack: whatever fails after the data file
// grew (its sync, the record), ExpandVolume returns with the file at its
// recorded size, so the disk's free space is what the records say and no
// later start has to cut back a file that something may use.
func TestFailedExpansionGivesTheSpaceBack(t *testing.T) {
	for _, step := range []fault.Step{fault.NodeExpandVolumeDataAllocated, fault.NodeExpandVolumeRecordTempWritten} {
		t.Run(step.String(), func(t *testing.T) {
			ctx := context.Background()
			testdisk.Require(t)
			p := testdisk.New(t, "xfs", 512*mi)
			injected := errors.New("injected failure")
			f := closing(t, NewFile(testDiskName, p, 0, fault.FailAt(step, injected)))
			if err := f.Start(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := f.CreateVolume(ctx, CreateRequest{Key: "v", Name: "v", SizeBytes: 32 * mi}); err != nil {
				t.Fatal(err)
			}
			before, _ := f.Usage(ctx)
			if _, err := f.ExpandVolume(ctx, "v", 96*mi); !errors.Is(err, injected) {
				t.Fatalf("expansion: %v, want the injected failure", err)
			}
			if vol, err := f.GetVolume(ctx, "v"); err != nil || vol.SizeBytes != 32*mi {
				t.Errorf("record after the failed expansion: %+v, %v; want 32Mi", vol, err)
			}
			if st, err := os.Stat(f.volumeFile("v")); err != nil || st.Size() != 32*mi {
				t.Errorf("data file after the failed expansion: %v bytes (%v), want %d", st.Size(), err, 32*mi)
			}
			if after, _ := f.Usage(ctx); after.FreeBytes < before.FreeBytes-mi {
				t.Errorf("free space went from %d to %d after a failed expansion", before.FreeBytes, after.FreeBytes)
			}
		})
	}
}

// TestExpansionKeepsTheReserve: growing a volume by more than the disk
// offers beyond its reserve is refused with ErrNoSpace, and the reserve is
// still free on the filesystem afterwards.
func TestExpansionKeepsTheReserve(t *testing.T) {
	ctx := context.Background()
	const reserved = 128 * mi
	f, p := newFile(t, "xfs", 512*mi, reserved)
	if _, err := f.CreateVolume(ctx, CreateRequest{Key: "v", Name: "v", SizeBytes: 32 * mi}); err != nil {
		t.Fatal(err)
	}
	u, err := f.Usage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Fits the filesystem, not the space beside the reserve.
	if _, err := f.ExpandVolume(ctx, "v", 32*mi+u.FreeBytes+64*mi); !errors.Is(err, ErrNoSpace) {
		t.Errorf("expanding into the reserve: %v, want ErrNoSpace", err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(p, &st); err != nil {
		t.Fatal(err)
	}
	if avail := int64(st.Bavail) * st.Frsize; avail < reserved {
		t.Errorf("the filesystem has %d bytes left, less than the reserve of %d", avail, reserved)
	}
	if _, err := f.ExpandVolume(ctx, "v", 32*mi+u.FreeBytes); err != nil {
		t.Errorf("expanding by exactly what the disk offers: %v", err)
	}
}

// A failed expansion never cuts the data file below its size on entry: a
// file larger than its record whose attached loop device already has the
// larger size (the state Start's cutBack leaves alone) may hold data
// written beyond the record.
func TestFailedExpansionNeverCutsBelowAnAttachedDevice(t *testing.T) {
	ctx := context.Background()
	f, p := newFile(t, "xfs", 512*mi, 0)
	if _, err := f.CreateVolume(ctx, CreateRequest{Key: "v", Name: "v", SizeBytes: 32 * mi}); err != nil {
		t.Fatal(err)
	}
	dev, err := f.Attach(ctx, "v", false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Detach(ctx, "v") })
	// The state cutBack protects: file and device at 64Mi, record at 32Mi.
	testdisk.Run(t, "fallocate", "-l", "64MiB", f.volumeFile("v"))
	testdisk.Run(t, "losetup", "--set-capacity", dev)
	marker := bytes.Repeat([]byte("DATA"), 1024)
	writeAt(t, dev, 48*mi, marker)

	f.Close()
	restarted := closing(t, NewFile(testDiskName, p, 0, nil))
	if err := restarted.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(f.volumeFile("v")); st.Size() != 64*mi {
		t.Fatalf("precondition: Start cut the file to %d", st.Size())
	}
	// The kubelet retries NodeExpandVolume; the disk cannot offer the
	// (double-counted) growth, so it fails with ErrNoSpace.
	if _, err := restarted.ExpandVolume(ctx, "v", 4<<30); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("expansion: %v, want ErrNoSpace", err)
	}
	if st, _ := os.Stat(f.volumeFile("v")); st.Size() != 64*mi {
		t.Errorf("a failed expansion cut the file under a 64Mi device to %d bytes", st.Size())
	}
	got := readAt(t, f.volumeFile("v"), 48*mi, len(marker))
	if !bytes.Equal(got, marker) {
		t.Errorf("data written through the device at 48Mi is gone after a failed expansion")
	}
}

// Extents a volume shares with a file outside the state directory (cp
// --reflink of a volume for a backup, a dedupe tool) are booked too: the
// volume's rewrite needs them whoever the other sharer is.
func TestCopyOnWriteBooksExternalSharers(t *testing.T) {
	ctx := context.Background()
	f, p := writtenVolume(t)
	before, _ := f.cowBytes()
	testdisk.Run(t, "cp", "--reflink=always", f.volumeFile("v"), filepath.Join(p, "backup.img"))
	// The driver does not see an outside copy being made: the count picks
	// it up within cowCacheFor.
	f.cow.invalidate()
	after, _ := f.cowBytes()
	u, _ := f.Usage(ctx)
	t.Logf("cow before %d, after an external reflink copy %d, free %d", before, after, u.FreeBytes)
	if after < 64*mi {
		t.Errorf("64Mi shared with a file outside diskfit/ books %d bytes of copy-on-write", after)
	}
}

// writtenVolume makes a 512 MiB XFS disk with volume "v", its 64 MiB
// written with random data.
func writtenVolume(t *testing.T) (*File, string) {
	t.Helper()
	f, p := newFile(t, "xfs", 512*mi, 0)
	if _, err := f.CreateVolume(context.Background(), CreateRequest{Key: "v", Name: "v", SizeBytes: 64 * mi}); err != nil {
		t.Fatal(err)
	}
	testdisk.Run(t, "dd", "if=/dev/urandom", "of="+f.volumeFile("v"), "bs=1M", "count=64", "conv=notrunc,fsync")
	return f, p
}

func writeAt(t *testing.T, path string, off int64, b []byte) {
	t.Helper()
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_SYNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if _, err := unix.Pwrite(fd, b, off); err != nil {
		t.Fatal(err)
	}
}

func readAt(t *testing.T, path string, off int64, n int) []byte {
	t.Helper()
	fd, err := unix.Open(path, unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	b := make([]byte, n)
	if _, err := unix.Pread(fd, b, off); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestFullDiskAtStartKeepsSnapshotsAndTheirSpace: a disk that is full
// when the driver starts cannot make the files of the reflink probe. That
// says nothing of reflink: once there is room, the disk takes snapshots
// as before, and Usage keeps back what copy-on-write of the volumes'
// shared extents may take. Taking the failed probe for "no reflink" gave
// that space out as free: volumes created in it would have left a volume
// that rewrites its shared data failing its writes inside its pod.
func TestFullDiskAtStartKeepsSnapshotsAndTheirSpace(t *testing.T) {
	ctx := context.Background()
	f, p := writtenVolume(t)
	if _, err := f.CreateSnapshot(ctx, SnapshotRequest{Key: "s", Name: "s", SourceKey: "v"}); err != nil {
		t.Fatal(err)
	}
	fill := fillDisk(t, p)
	f.Close()
	g := closing(t, NewFile(testDiskName, p, 0, nil))
	if err := g.Start(ctx); err != nil {
		t.Fatalf("Start on the full disk: %v", err)
	}
	if err := os.Remove(fill); err != nil {
		t.Fatal(err)
	}
	if !g.SupportsSnapshots() {
		t.Error("a disk with reflink that was full at start reports no snapshots")
	}
	u, err := g.Usage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(p, &st); err != nil {
		t.Fatal(err)
	}
	// XFS frees the blocks of removed files in the background (the fill,
	// the probe's files), so the two reads may differ by a few blocks.
	if avail := int64(st.Bavail) * st.Frsize; avail-u.FreeBytes < 63*mi {
		t.Errorf("Usage reports %d bytes free of %d available, with 64Mi shared with a snapshot: the copy-on-write space is given out", u.FreeBytes, avail)
	}
}
