package backend

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/diskfit/diskfit/csi-driver/internal/testdisk"
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
	f, p := newFile(t, "xfs", 1024*mi, 0)
	if !f.SupportsSnapshots() {
		t.Fatal("XFS with reflink=1 reported no reflink")
	}
	if _, err := f.CreateVolume(ctx, CreateRequest{Key: "v", Name: "v", SizeBytes: 64 * mi}); err != nil {
		t.Fatal(err)
	}
	// The source as a copy may find it in the middle of an expansion: the
	// file grown and written at its new end, the record not yet updated.
	const grown = 128 * mi
	testdisk.Run(t, "fallocate", "-l", fmt.Sprint(grown), f.volumeFile("v"))
	marker := bytes.Repeat([]byte("diskfit!"), 512)
	writeAt(t, f.volumeFile("v"), grown-int64(len(marker)), marker)

	snap, err := f.CreateSnapshot(ctx, "s", "s", "v")
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

	restarted := NewFile(p, 0, nil)
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
	if _, err := f.CreateSnapshot(ctx, "s", "s", "v"); err != nil {
		t.Fatal(err)
	}
	writeAt(t, f.volumeFile("v"), 0, after)

	if _, err := f.CreateSnapshot(ctx, "s", "s", "v"); !errors.Is(err, ErrExists) {
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

	l := newLVM(t, newFakeLVM(1<<30), true)
	if _, err := l.CreateVolume(ctx, CreateRequest{Key: "v", Name: "v", SizeBytes: 8 * mi}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.CreateSnapshot(ctx, "s", "s", "v"); err != nil {
		t.Fatal(err)
	}
	if _, err := l.CreateSnapshot(ctx, "s", "s", "v"); !errors.Is(err, ErrExists) {
		t.Errorf("LVM: CreateSnapshot of a snapshot that exists: %v, want ErrExists", err)
	}
	if _, err := l.CreateVolume(ctx, CreateRequest{Key: "v", Name: "v", SizeBytes: 8 * mi}); !errors.Is(err, ErrExists) {
		t.Errorf("LVM: CreateVolume of a volume that exists: %v, want ErrExists", err)
	}
	if _, err := l.GetSnapshot(ctx, "s"); err != nil {
		t.Errorf("LVM: the snapshot is gone: %v", err)
	}
}
