package backend

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/diskfit/diskfit/csi-driver/fault"
	"github.com/diskfit/diskfit/csi-driver/internal/testdisk"
)

// TestCloneOfAGrownSourceIsFullyAllocated: a clone made while its
// source's file is larger than the source's record (an expansion between
// its fallocate and its record, or a file Start kept larger) records the
// copied size, and must be allocated and booked to it: a reflink copy does
// not share unwritten extents, so the part beyond the request would be
// holes, and once the disk's free space went to other volumes a write
// there would fail with ENOSPC.
func TestCloneOfAGrownSourceIsFullyAllocated(t *testing.T) {
	ctx := context.Background()
	f, _ := newFile(t, "xfs", 1024*mi, 0)
	if !f.SupportsSnapshots() {
		t.Fatal("XFS with reflink=1 reported no reflink")
	}
	if _, err := f.CreateVolume(ctx, CreateRequest{Key: "v", Name: "v", SizeBytes: 64 * mi}); err != nil {
		t.Fatal(err)
	}
	// The source in the middle of an expansion: the file fallocated to
	// its new size, the record not yet written (as in
	// TestCopiesOfAVolumeBeingExpandedKeepTheirData).
	const grown = 128 * mi
	testdisk.Run(t, "fallocate", "-l", fmt.Sprint(grown), f.volumeFile("v"))
	writeAt(t, f.volumeFile("v"), grown-4096, bytes.Repeat([]byte("x"), 4096))

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
	f, p := newFile(t, "xfs", 1024*mi, 0)
	if _, err := f.CreateVolume(ctx, CreateRequest{Key: "v", Name: "v", SizeBytes: 64 * mi}); err != nil {
		t.Fatal(err)
	}
	const grown = 128 * mi
	testdisk.Run(t, "fallocate", "-l", fmt.Sprint(grown), f.volumeFile("v"))
	marker := bytes.Repeat([]byte("diskfit!"), 512)
	writeAt(t, f.volumeFile("v"), grown-int64(len(marker)), marker)
	snap, err := f.CreateSnapshot(ctx, "s", "s", "v")
	if err != nil {
		t.Fatal(err)
	}
	// The record an older driver wrote for the same snapshot.
	snap.SizeBytes = 64 * mi
	if err := f.writeJSONAtomic(f.snapshots+"/s"+metaSuffix, snap, true, fault.Step{}); err != nil {
		t.Fatal(err)
	}

	if err := NewFile(p, 0, nil).Start(ctx); err != nil {
		t.Fatal(err)
	}
	if got := readAt(t, f.snapshotFile("s"), grown-int64(len(marker)), len(marker)); !bytes.Equal(got, marker) {
		t.Errorf("a restart cut the snapshot's data file back to its record: its last bytes are gone")
	}
}
