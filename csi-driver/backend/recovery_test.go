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

// TestFileRecovery leaves the on-disk traces of interrupted operations and
// checks that Start undoes each of them and keeps ready volumes.
func TestFileRecovery(t *testing.T) {
	ctx := context.Background()
	f, p := newFile(t, "ext4", 256*mi, 0)
	if f.SupportsSnapshots() {
		t.Error("ext4 reported reflink")
	}
	if _, err := f.CreateVolume(ctx, CreateRequest{Key: "keep", Name: "keep", SizeBytes: 4 * mi}); err != nil {
		t.Fatal(err)
	}
	if blank, err := f.Blank(ctx, "keep"); err != nil || !blank {
		t.Errorf("fresh volume on ext4 blank = %v, %v", blank, err)
	}
	if _, err := f.CreateSnapshot(ctx, SnapshotRequest{Key: "s", Name: "s", SourceKey: "keep"}); !errors.Is(err, ErrUnsupported) {
		t.Errorf("snapshot on ext4: %v, want ErrUnsupported", err)
	}
	dir := filepath.Join(p, stateDirName, volumesDirName)
	write := func(name, content string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("creating.json", `{"key":"creating","name":"creating","sizeBytes":4194304,"state":"creating"}`)
	write("creating.img", "partial")
	write("orphan.img", "no record")
	write("keep.json.tmp-123", "{")

	if _, err := f.GetVolume(ctx, "creating"); !errors.Is(err, ErrNotFound) {
		t.Errorf("a volume still being created is visible: %v", err)
	}
	f.Close()
	restarted := closing(t, NewFile(testDiskName, p, 0, nil))
	if err := restarted.Start(ctx); err != nil {
		t.Fatal(err)
	}
	vols, err := restarted.ListVolumes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(vols) != 1 || vols[0].Key != "keep" {
		t.Errorf("volumes after recovery: %+v", vols)
	}
	entries, _ := os.ReadDir(dir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if strings.Join(names, ",") != "keep.img,keep.json" {
		t.Errorf("files after recovery: %v", names)
	}
}

// TestRecoveryKeepsVolumesWhoseRecordCannotBeRead: a record that cannot
// be read (an I/O error, here EISDIR) says nothing about whether the
// volume is complete, so Start keeps every file and fails, which makes
// the disk unhealthy with the reason. Only a record that reads but does
// not decode (an intent torn by a crash) or says "creating" is rolled back.
func TestRecoveryKeepsVolumesWhoseRecordCannotBeRead(t *testing.T) {
	ctx := context.Background()
	f, p := newFile(t, "xfs", 512*mi, 0)
	if _, err := f.CreateVolume(ctx, CreateRequest{Key: "data", Name: "data", SizeBytes: 16 * mi}); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(p, stateDirName, volumesDirName)
	// The record is replaced by something that fails to read, not to decode.
	record := filepath.Join(dir, "data"+metaSuffix)
	saved, err := os.ReadFile(record)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(record); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(record, 0o700); err != nil {
		t.Fatal(err)
	}

	f.Close()
	restarted := closing(t, NewFile(testDiskName, p, 0, nil))
	err = restarted.Start(ctx)
	if err == nil || !strings.Contains(err.Error(), record) {
		t.Errorf("start with an unreadable record: %v, want an error naming %s", err, record)
	}
	if st, err := os.Stat(filepath.Join(dir, "data"+dataSuffix)); err != nil || st.Size() != 16*mi {
		t.Fatalf("the volume's data file is gone or changed after start: %v", err)
	}

	// Once the record reads again, the volume is served as before.
	if err := os.Remove(record); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(record, saved, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := restarted.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if vol, err := restarted.GetVolume(ctx, "data"); err != nil || vol.SizeBytes != 16*mi {
		t.Errorf("volume after the record was repaired: %+v, %v", vol, err)
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
	f.Close()
	restarted := closing(t, NewFile(testDiskName, p, 0, nil))
	if err := restarted.Start(ctx); err == nil || !strings.Contains(err.Error(), record) {
		t.Errorf("start with a record that does not decode: %v, want an error naming %s", err, record)
	}
	if _, err := os.Stat(f.volumeFile("data")); err != nil {
		t.Errorf("a ready volume's data file is gone after its record lost one byte: %v", err)
	}
}

// TestStartNeverCutsBackBelowAnAttachedDevice: a data file larger than its
// record whose loop device already has the larger size may hold a
// filesystem grown into the extra space (the record was lost, the device
// was refreshed), so start leaves it alone. A device still at the recorded
// size proves nothing used the extra space, and the file is cut back.
func TestStartNeverCutsBackBelowAnAttachedDevice(t *testing.T) {
	ctx := context.Background()
	f, p := newFile(t, "xfs", 512*mi, 0)
	for _, key := range []string{"grown", "notyet"} {
		if _, err := f.CreateVolume(ctx, CreateRequest{Key: key, Name: key, SizeBytes: 32 * mi}); err != nil {
			t.Fatal(err)
		}
		if _, err := f.Attach(ctx, key, false); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = f.Detach(ctx, key) })
		// The file grows behind the record's back, as an interrupted
		// expansion leaves it.
		testdisk.Run(t, "fallocate", "-l", "64MiB", f.volumeFile(key))
	}
	// Only "grown"'s device is refreshed to the file's size.
	dev, err := f.Device(ctx, "grown")
	if err != nil || dev == "" {
		t.Fatalf("device of grown: %q, %v", dev, err)
	}
	testdisk.Run(t, "losetup", "--set-capacity", dev)

	f.Close()
	restarted := closing(t, NewFile(testDiskName, p, 0, nil))
	if err := restarted.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(f.volumeFile("grown")); st.Size() != 64*mi {
		t.Errorf("start cut back a file under a device of 64Mi to %d bytes", st.Size())
	}
	if st, _ := os.Stat(f.volumeFile("notyet")); st.Size() != 32*mi {
		t.Errorf("start left a file grown past its record and its device at %d bytes, want %d", st.Size(), 32*mi)
	}
}

// TestStateDirectoryBelongsToItsDisk: a state directory is served only
// under the name of the disk that first started on it, also while it
// holds nothing. A state directory without a disk record (an older
// driver's) is taken by the disk that starts on it, and removing the
// record gives the filesystem to another name.
func TestStateDirectoryBelongsToItsDisk(t *testing.T) {
	ctx := context.Background()
	f, p := newFile(t, "xfs", 1<<30, 0)
	// Each start is a driver restarted on the disk under the name given.
	start := func(name string) error {
		f.Close()
		f = closing(t, NewFile(name, p, 0, nil))
		return f.Start(ctx)
	}
	refused := func(what string) {
		t.Helper()
		err := start("other")
		if err == nil || !strings.Contains(err.Error(), `disk "disk"'s`) {
			t.Fatalf("%s started under another name: %v", what, err)
		}
		// The driver tells such a disk, whose data is intact elsewhere,
		// from a failed one by the error's type and the disk it names.
		var another *AnotherDiskError
		if !errors.Is(err, ErrAnotherDisk) || !errors.As(err, &another) || another.Holder != testDiskName || another.Disk != "other" || another.Path != p {
			t.Fatalf("%s under another name: %#v, want an AnotherDiskError naming disk %q at %s", what, err, testDiskName, p)
		}
	}
	refused("an empty disk")
	if err := start(testDiskName); err != nil {
		t.Fatalf("the disk started under its own name again: %v", err)
	}
	if _, err := f.CreateVolume(ctx, CreateRequest{Key: "vol", Name: "vol", SizeBytes: 4 * mi}); err != nil {
		t.Fatal(err)
	}
	refused("a disk holding a volume")
	if err := start(testDiskName); err != nil {
		t.Fatal(err)
	}
	if _, err := f.GetVolume(ctx, "vol"); err != nil {
		t.Fatalf("the volume after the refused start: %v", err)
	}

	// A state directory of a driver that kept no disk record.
	if err := os.Remove(filepath.Join(p, stateDirName, diskRecordName)); err != nil {
		t.Fatal(err)
	}
	if err := start(testDiskName); err != nil {
		t.Fatalf("a state directory without a disk record: %v", err)
	}
	refused("a disk whose record was written again")
}

// TestDiskWithoutRecordStartsWhereTheRecordCannotBeWritten: a state
// directory that has no disk record yet (an older driver's) is served
// when the record cannot be written, as it was before records existed:
// on a full filesystem, and on one mounted read-only. Its volumes stay
// reachable; refusing the disk would make them unavailable for want of a
// file that protects nothing yet. The record is written at the first
// creation once there is room, and then guards the disk as always.
func TestDiskWithoutRecordStartsWhereTheRecordCannotBeWritten(t *testing.T) {
	ctx := context.Background()
	for _, fsType := range []string{"xfs", "ext4"} {
		t.Run(fsType, func(t *testing.T) {
			f, p := newFile(t, fsType, 320*mi, 0)
			if _, err := f.CreateVolume(ctx, CreateRequest{Key: "vol", Name: "vol", SizeBytes: 4 * mi}); err != nil {
				t.Fatal(err)
			}
			record := filepath.Join(p, stateDirName, diskRecordName)
			if err := os.Remove(record); err != nil {
				t.Fatal(err)
			}
			// Each start is a driver restarted on the disk.
			started := func(what string) *File {
				t.Helper()
				f.Close()
				g := closing(t, NewFile(testDiskName, p, 0, nil))
				f = g
				if err := g.Start(ctx); err != nil {
					t.Fatalf("%s: Start: %v", what, err)
				}
				if _, err := g.GetVolume(ctx, "vol"); err != nil {
					t.Errorf("%s: the volume: %v", what, err)
				}
				return g
			}

			testdisk.Run(t, "mount", "-o", "remount,ro", p)
			started("read-only")
			testdisk.Run(t, "mount", "-o", "remount,rw", p)

			fill := fillDisk(t, p)
			// A driver's first start: no disk has answered the space
			// check yet, whose probe file has no room here.
			forgetSpaceVerdicts()
			g := started("full")
			if err := os.Remove(fill); err != nil {
				t.Fatal(err)
			}
			if _, err := g.CreateVolume(ctx, CreateRequest{Key: "new", Name: "new", SizeBytes: 4 * mi}); err != nil {
				t.Fatal(err)
			}
			g.Close()
			if err := closing(t, NewFile("other", p, 0, nil)).Start(ctx); err == nil {
				t.Error("after a creation with room for the record, the disk started under another name")
			}
		})
	}
}

// fillDisk fills the filesystem at p until not one more byte can be
// written, and returns the file that holds the space.
func fillDisk(t *testing.T, p string) string {
	t.Helper()
	path := filepath.Join(p, "fill")
	fill, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fill.Close()
	for _, size := range []int{1 << 20, 4096, 1} {
		buf := make([]byte, size)
		for {
			if _, err := fill.Write(buf); err != nil {
				break
			}
		}
		fill.Sync()
	}
	probe := filepath.Join(p, "probe")
	err = os.WriteFile(probe, []byte("x"), 0o600)
	os.Remove(probe)
	if err == nil {
		t.Fatal("a byte could still be written to the filled disk")
	}
	return path
}
