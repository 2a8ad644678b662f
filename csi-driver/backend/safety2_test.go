package backend

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/diskfit/diskfit/csi-driver/internal/testdisk"
)

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
	dev, err := f.Attach(ctx, "v")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Detach(ctx, "v") })
	// The state cutBack protects: file and device at 64Mi, record at 32Mi.
	testdisk.Run(t, "fallocate", "-l", "64MiB", f.volumeFile("v"))
	testdisk.Run(t, "losetup", "--set-capacity", dev)
	marker := bytes.Repeat([]byte("DATA"), 1024)
	writeAt(t, dev, 48*mi, marker)

	restarted := NewFile(p, 0, nil)
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

// A ready volume whose record no longer decodes (media corruption, a bad
// edit; never a crash: records are fsynced before their rename) keeps its
// data file; Start fails, so the disk is unavailable with the reason.
func TestStartKeepsVolumesWhoseRecordDoesNotDecode(t *testing.T) {
	ctx := context.Background()
	f, p := newFile(t, "xfs", 512*mi, 0)
	if _, err := f.CreateVolume(ctx, CreateRequest{Key: "data", Name: "data", SizeBytes: 16 * mi}); err != nil {
		t.Fatal(err)
	}
	record := filepath.Join(p, stateDirName, volumesDirName, "data"+metaSuffix)
	b, _ := os.ReadFile(record)
	b[len(b)/2] = 0 // one corrupted byte
	if err := os.WriteFile(record, b, 0o600); err != nil {
		t.Fatal(err)
	}
	restarted := NewFile(p, 0, nil)
	if err := restarted.Start(ctx); err == nil || !strings.Contains(err.Error(), record) {
		t.Errorf("start with a record that does not decode: %v, want an error naming %s", err, record)
	}
	if _, err := os.Stat(f.volumeFile("data")); err != nil {
		t.Errorf("a ready volume's data file is gone after its record lost one byte: %v", err)
	}
}

// Extents a volume shares with a file outside the state directory (cp
// --reflink of a volume for a backup, a dedupe tool) are booked too: the
// volume's rewrite needs them whoever the other sharer is.
func TestCopyOnWriteBooksExternalSharers(t *testing.T) {
	ctx := context.Background()
	f, p := newFile(t, "xfs", 512*mi, 0)
	if _, err := f.CreateVolume(ctx, CreateRequest{Key: "v", Name: "v", SizeBytes: 64 * mi}); err != nil {
		t.Fatal(err)
	}
	testdisk.Run(t, "dd", "if=/dev/urandom", "of="+f.volumeFile("v"), "bs=1M", "count=64", "conv=notrunc,fsync")
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
