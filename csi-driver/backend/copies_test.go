package backend

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/diskfit/diskfit/csi-driver/fault"
	"github.com/diskfit/diskfit/csi-driver/internal/fakelvm"
	"github.com/diskfit/diskfit/csi-driver/internal/testdisk"
	"golang.org/x/sys/unix"
)

// TestCopiesOfAVolumeBeingExpandedKeepTheirData: a snapshot or clone taken
// while its source is being expanded may copy a data file already larger
// than the size the source's record said when the copy began (the
// expansion grew the file, recorded it and grew the filesystem meanwhile).
// The copy's record must then cover all it holds: a restarted driver cuts
// a data file back to its record, which would cut the grown filesystem in
// the snapshot or clone short.
func TestCopiesOfAVolumeBeingExpandedKeepTheirData(t *testing.T) {
	ctx := context.Background()
	f, p := sourceBeingExpanded(t)

	snap, err := f.CreateSnapshot(ctx, SnapshotRequest{Key: "s", Name: "s", SourceKey: "v"})
	if err != nil {
		t.Fatal(err)
	}
	clone, err := f.CreateVolume(ctx, CreateRequest{Key: "c", Name: "c", SizeBytes: 64 * mi, FromVolume: "v"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		what string
		size int64
	}{{"snapshot", snap.SizeBytes}, {"clone", clone.SizeBytes}} {
		if c.size < grown {
			t.Errorf("the %s says it holds %d bytes, but it holds %d", c.what, c.size, grown)
		}
	}

	f.Close()
	restarted := closing(t, NewFile(testDiskName, p, 0, nil))
	if err := restarted.Start(ctx); err != nil {
		t.Fatal(err)
	}
	for what, path := range map[string]string{"snapshot": f.snapshotFile("s"), "clone": f.volumeFile("c")} {
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if st.Size() < grown || !bytes.Equal(readAt(t, path, grown-int64(len(marker)), len(marker)), marker) {
			t.Errorf("after a restart the %s has %d bytes and lost what its source held at its end", what, st.Size())
		}
	}
}

// TestCreateNeverReplacesWhatIsReady: CreateVolume and CreateSnapshot
// replace what an earlier, failed attempt at the same key left, but never a
// volume or snapshot that is complete. The driver reaches them for a key
// that exists only when its lookup could not check this disk a moment
// earlier (a health check that timed out), and a retried CreateSnapshot
// would otherwise silently swap a snapshot already taken for a new one.
func TestCreateNeverReplacesWhatIsReady(t *testing.T) {
	ctx := context.Background()
	f, _ := newFile(t, "xfs", 1024*mi, 0)
	if _, err := f.CreateVolume(ctx, CreateRequest{Key: "v", Name: "v", SizeBytes: 64 * mi}); err != nil {
		t.Fatal(err)
	}
	before, after := bytes.Repeat([]byte("before!!"), 512), bytes.Repeat([]byte("after!!!"), 512)
	writeAt(t, f.volumeFile("v"), 0, before)
	if _, err := f.CreateSnapshot(ctx, SnapshotRequest{Key: "s", Name: "s", SourceKey: "v"}); err != nil {
		t.Fatal(err)
	}
	writeAt(t, f.volumeFile("v"), 0, after)

	if _, err := f.CreateSnapshot(ctx, SnapshotRequest{Key: "s", Name: "s", SourceKey: "v"}); !errors.Is(err, ErrExists) {
		t.Errorf("CreateSnapshot of a snapshot that exists: %v, want ErrExists", err)
	}
	if got := readAt(t, f.snapshotFile("s"), 0, len(before)); !bytes.Equal(got, before) {
		t.Errorf("the snapshot was replaced: it holds %.16q, took %.16q", got, before)
	}
	if _, err := f.CreateVolume(ctx, CreateRequest{Key: "v", Name: "v", SizeBytes: 64 * mi}); !errors.Is(err, ErrExists) {
		t.Errorf("CreateVolume of a volume that exists: %v, want ErrExists", err)
	}
	if got := readAt(t, f.volumeFile("v"), 0, len(after)); !bytes.Equal(got, after) {
		t.Errorf("the volume was replaced: it holds %.16q, was written %.16q", got, after)
	}

	l := newLVM(t, fakelvm.New(1<<30), true)
	if _, err := l.CreateVolume(ctx, CreateRequest{Key: "v", Name: "v", SizeBytes: 8 * mi}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.CreateSnapshot(ctx, SnapshotRequest{Key: "s", Name: "s", SourceKey: "v"}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.CreateSnapshot(ctx, SnapshotRequest{Key: "s", Name: "s", SourceKey: "v"}); !errors.Is(err, ErrExists) {
		t.Errorf("LVM: CreateSnapshot of a snapshot that exists: %v, want ErrExists", err)
	}
	if _, err := l.CreateVolume(ctx, CreateRequest{Key: "v", Name: "v", SizeBytes: 8 * mi}); !errors.Is(err, ErrExists) {
		t.Errorf("LVM: CreateVolume of a volume that exists: %v, want ErrExists", err)
	}
	if _, err := l.GetSnapshot(ctx, "s"); err != nil {
		t.Errorf("LVM: the snapshot is gone: %v", err)
	}
}

// TestCloneOfAGrownSourceIsFullyAllocated: a clone made while its
// source's file is larger than the source's record (an expansion between
// its fallocate and its record, or a file Start kept larger) records the
// copied size, and must be allocated and booked to it: a reflink copy does
// not share unwritten extents, so the part beyond the request would be
// holes, and once the disk's free space went to other volumes a write
// there would fail with ENOSPC.
func TestCloneOfAGrownSourceIsFullyAllocated(t *testing.T) {
	ctx := context.Background()
	f, _ := sourceBeingExpanded(t)

	clone, err := f.CreateVolume(ctx, CreateRequest{Key: "c", Name: "c", SizeBytes: 64 * mi, FromVolume: "v"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("clone recorded %d bytes", clone.SizeBytes)

	var st unix.Stat_t
	if err := unix.Stat(f.volumeFile("c"), &st); err != nil {
		t.Fatal(err)
	}
	if allocated := st.Blocks * 512; allocated < clone.SizeBytes {
		t.Errorf("the clone records %d bytes but only %d are allocated: the rest was never allocated nor booked", clone.SizeBytes, allocated)
	}
	// A control: an ordinary volume of the clone's recorded size.
	if _, err := f.CreateVolume(ctx, CreateRequest{Key: "ctl", Name: "ctl", SizeBytes: grown}); err != nil {
		t.Fatal(err)
	}

	// What that means: the disk hands its free space to another volume,
	// and the clone then cannot write within its own size.
	u, err := f.Usage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	filler := u.FreeBytes / mi * mi
	if _, err := f.CreateVolume(ctx, CreateRequest{Key: "filler", Name: "filler", SizeBytes: filler}); err != nil {
		t.Fatalf("a volume of the %d bytes the disk says are free: %v", filler, err)
	}
	buf := bytes.Repeat([]byte("y"), int(8*mi))
	for _, key := range []string{"ctl", "c"} {
		wfd, err := unix.Open(f.volumeFile(key), unix.O_WRONLY|unix.O_SYNC, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := unix.Pwrite(wfd, buf, 100*mi); err != nil {
			t.Errorf("writing 8 MiB at 100 MiB into volume %s (records %d bytes) once the disk's free space was handed out: %v", key, grown, err)
		}
		unix.Close(wfd)
	}
}

// TestStartNeverCutsASnapshot: nothing grows a snapshot's data file after
// it is made, so a snapshot file larger than its record is a copy taken
// while its source was being expanded, recorded with the size the source's
// record gave (as drivers before copies recorded what they copied did).
// Start must keep it whole: cutting it back loses the end of the grown
// filesystem it holds.
func TestStartNeverCutsASnapshot(t *testing.T) {
	ctx := context.Background()
	f, p := sourceBeingExpanded(t)
	snap, err := f.CreateSnapshot(ctx, SnapshotRequest{Key: "s", Name: "s", SourceKey: "v"})
	if err != nil {
		t.Fatal(err)
	}
	// The record an older driver wrote for the same snapshot.
	snap.SizeBytes = 64 * mi
	if err := f.writeJSONAtomic(f.snapshots+"/s"+metaSuffix, snap, true, fault.Step{}); err != nil {
		t.Fatal(err)
	}

	f.Close()
	if err := closing(t, NewFile(testDiskName, p, 0, nil)).Start(ctx); err != nil {
		t.Fatal(err)
	}
	if got := readAt(t, f.snapshotFile("s"), grown-int64(len(marker)), len(marker)); !bytes.Equal(got, marker) {
		t.Errorf("a restart cut the snapshot's data file back to its record: its last bytes are gone")
	}
}

// The source volume "v" of the copies above, caught in the middle of an
// expansion from 64Mi to grown: its file fallocated to the new size and
// marker written at its end, its record not yet updated.
const grown = 128 * mi

var marker = bytes.Repeat([]byte("diskfit!"), 512)

func sourceBeingExpanded(t *testing.T) (*File, string) {
	t.Helper()
	f, p := newFile(t, "xfs", 1024*mi, 0)
	if !f.SupportsSnapshots() {
		t.Fatal("XFS with reflink=1 reported no reflink")
	}
	if _, err := f.CreateVolume(context.Background(), CreateRequest{Key: "v", Name: "v", SizeBytes: 64 * mi}); err != nil {
		t.Fatal(err)
	}
	testdisk.Run(t, "fallocate", "-l", fmt.Sprint(grown), f.volumeFile("v"))
	writeAt(t, f.volumeFile("v"), grown-int64(len(marker)), marker)
	return f, p
}
