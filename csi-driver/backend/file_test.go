package backend

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/diskfit/diskfit/csi-driver/fault"
	"github.com/diskfit/diskfit/csi-driver/internal/testdisk"
	"github.com/diskfit/diskfit/csi-driver/loop"
)

const mi = int64(1) << 20

// testDiskName is the disk every file backend of these tests serves.
const testDiskName = "disk"

func TestKeyForName(t *testing.T) {
	tests := []struct {
		name, want string
		hashed     bool
	}{
		{name: "pvc-3f0c2a4e-8f0b-4c2e-9d59-1f2b3c4d5e6f", want: "pvc-3f0c2a4e-8f0b-4c2e-9d59-1f2b3c4d5e6f"},
		{name: "a", want: "a"},
		{name: "Upper", hashed: true},
		{name: "../etc/passwd", hashed: true},
		{name: "a/b", hashed: true},
		{name: "with space", hashed: true},
		{name: "dot.name", hashed: true},
		{name: "h-lookslikeahash", hashed: true},
		{name: strings.Repeat("a", MaxKeyLength+1), hashed: true},
		{name: "nul\x00", hashed: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := KeyForName(tt.name)
			if !ValidKey(got) {
				t.Fatalf("KeyForName(%q) = %q is not a valid key", tt.name, got)
			}
			if tt.hashed {
				if !strings.HasPrefix(got, hashPrefix) || got == tt.name {
					t.Errorf("KeyForName(%q) = %q, want a hash", tt.name, got)
				}
			} else if got != tt.want {
				t.Errorf("KeyForName(%q) = %q, want %q", tt.name, got, tt.want)
			}
			if again := KeyForName(tt.name); again != got {
				t.Errorf("not deterministic: %q then %q", got, again)
			}
		})
	}
	if KeyForName("Upper") == KeyForName("upper") {
		t.Error("names differing in case share a key")
	}
}

func newFile(t *testing.T, fsType string, size, reserved int64) (*File, string) {
	t.Helper()
	testdisk.Require(t)
	p := testdisk.New(t, fsType, size)
	f := closing(t, NewFile(testDiskName, p, reserved, nil))
	if err := f.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return f, p
}

// closing closes b, releasing its disk, when the test ends. A test that
// restarts a backend on a disk closes the first one before, as the exit of
// a restarted driver releases it.
func closing[B Backend](t testing.TB, b B) B {
	t.Helper()
	t.Cleanup(func() { b.Close() })
	return b
}

func TestFileCreateDeleteExpand(t *testing.T) {
	ctx := context.Background()
	f, p := newFile(t, "xfs", 1<<30, 64*mi)
	u0, err := f.Usage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !f.SupportsSnapshots() {
		t.Error("XFS with reflink=1 reported no reflink")
	}
	vol, err := f.CreateVolume(ctx, CreateRequest{Key: "v1", Name: "v1", SizeBytes: 100 * mi, PVCNamespace: "ns", PVCName: "claim"})
	if err != nil {
		t.Fatal(err)
	}
	if vol.State != StateReady || vol.PVCName != "claim" {
		t.Errorf("volume %+v", vol)
	}
	u1, _ := f.Usage(ctx)
	if used := u0.FreeBytes - u1.FreeBytes; used < 100*mi {
		t.Errorf("a preallocated 100MiB volume used only %d bytes", used)
	}
	if u0.CapacityBytes <= 0 || u0.FreeBytes > u0.CapacityBytes {
		t.Errorf("usage %+v", u0)
	}
	if blank, err := f.Blank(ctx, "v1"); err != nil || !blank {
		t.Errorf("fresh volume blank = %v, %v", blank, err)
	}
	dev, err := f.Attach(ctx, "v1", false)
	if err != nil {
		t.Fatal(err)
	}
	// One sector written through the loop device, far from the start.
	testdisk.Run(t, "dd", "if=/dev/urandom", "of="+dev, "bs=4096", "count=1", "seek=1000", "oflag=direct", "status=none")
	if blank, err := f.Blank(ctx, "v1"); err != nil || blank {
		t.Errorf("written volume blank = %v, %v", blank, err)
	}
	if again, _ := f.Attach(ctx, "v1", false); again != dev {
		t.Errorf("second attach gave %s, first %s", again, dev)
	}
	if dio, err := loop.DirectIO(dev); err != nil || !dio {
		t.Errorf("loop device %s direct I/O = %v, %v", dev, dio, err)
	}
	if _, err := f.ExpandVolume(ctx, "v1", 200*mi); err != nil {
		t.Fatal(err)
	}
	if size, err := devSize(dev); err != nil || size != 200*mi {
		t.Errorf("attached device has %d bytes after expansion (%v), want %d", size, err, 200*mi)
	}
	if err := f.DeleteVolume(ctx, "v1"); !errors.Is(err, ErrInUse) {
		t.Errorf("deleting an attached volume: %v, want ErrInUse", err)
	}
	if err := f.Detach(ctx, "v1"); err != nil {
		t.Fatal(err)
	}
	if err := f.DeleteVolume(ctx, "v1"); err != nil {
		t.Fatal(err)
	}
	if err := f.DeleteVolume(ctx, "v1"); err != nil {
		t.Errorf("deleting twice: %v", err)
	}
	if _, err := f.GetVolume(ctx, "v1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("deleted volume: %v", err)
	}
	assertEmpty(t, p)
}

func devSize(dev string) (int64, error) {
	fh, err := os.Open(dev)
	if err != nil {
		return 0, err
	}
	defer fh.Close()
	return fh.Seek(0, 2)
}

func assertEmpty(t *testing.T, p string) {
	t.Helper()
	for _, sub := range []string{volumesDirName, snapshotDirName} {
		entries, err := os.ReadDir(filepath.Join(p, stateDirName, sub))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			t.Errorf("left behind: %s/%s", sub, e.Name())
		}
	}
}

// TestFileNoSpace asks a small disk for more than it has: fallocate really
// fails with ENOSPC, nothing of a new volume remains, and a volume that
// cannot grow keeps its size and gives back what the failed allocation
// took (ext4 keeps the part of a fallocate it managed before ENOSPC).
func TestFileNoSpace(t *testing.T) {
	for _, fsType := range []string{"xfs", "ext4"} {
		t.Run(fsType, func(t *testing.T) {
			ctx := context.Background()
			f, p := newFile(t, fsType, 320*mi, 0)
			u, err := f.Usage(ctx)
			if err != nil {
				t.Fatal(err)
			}
			_, err = f.CreateVolume(ctx, CreateRequest{Key: "big", Name: "big", SizeBytes: u.FreeBytes + mi})
			if !errors.Is(err, ErrNoSpace) {
				t.Fatalf("got %v, want ErrNoSpace", err)
			}
			assertEmpty(t, p)
			after, _ := f.Usage(ctx)
			if after.FreeBytes < u.FreeBytes-mi {
				t.Errorf("free space went from %d to %d after a failed create", u.FreeBytes, after.FreeBytes)
			}
			vol, err := f.CreateVolume(ctx, CreateRequest{Key: "small", Name: "small", SizeBytes: 10 * mi})
			if err != nil {
				t.Fatal(err)
			}
			u, _ = f.Usage(ctx)
			if _, err := f.ExpandVolume(ctx, vol.Key, u.FreeBytes*2); !errors.Is(err, ErrNoSpace) {
				t.Errorf("expanding past the disk: %v, want ErrNoSpace", err)
			}
			if got, _ := f.GetVolume(ctx, vol.Key); got.SizeBytes != 10*mi {
				t.Errorf("failed expansion changed the recorded size to %d", got.SizeBytes)
			}
			if st, err := os.Stat(f.volumeFile(vol.Key)); err != nil || st.Size() != 10*mi {
				t.Errorf("failed expansion left the data file at %v bytes (%v), want %d", st.Size(), err, 10*mi)
			}
			if after, _ := f.Usage(ctx); after.FreeBytes < u.FreeBytes-mi {
				t.Errorf("free space went from %d to %d after a failed expansion", u.FreeBytes, after.FreeBytes)
			}
		})
	}
}

// TestFileFinishesInterruptedExpand leaves a record larger than the
// attached loop device, as a crash between the record and losetup -c
// does: the retried expansion, and an Attach (the next stage), refresh the
// device to the recorded size.
func TestFileFinishesInterruptedExpand(t *testing.T) {
	ctx := context.Background()
	f, _ := newFile(t, "xfs", 1024*mi, 0)
	if _, err := f.CreateVolume(ctx, CreateRequest{Key: "v", Name: "v", SizeBytes: 64 * mi}); err != nil {
		t.Fatal(err)
	}
	dev, err := f.Attach(ctx, "v", false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.Detach(ctx, "v"); err != nil {
			t.Error(err)
		}
	})
	for _, tt := range []struct {
		name string
		size int64
		redo func() error
	}{
		{"retried expansion", 128 * mi, func() error { _, err := f.ExpandVolume(ctx, "v", 128*mi); return err }},
		{"attach", 192 * mi, func() error { _, err := f.Attach(ctx, "v", false); return err }},
	} {
		// What ExpandVolume does before losetup -c.
		vol, err := f.GetVolume(ctx, "v")
		if err != nil {
			t.Fatal(err)
		}
		testdisk.Run(t, "fallocate", "-l", fmt.Sprint(tt.size), f.volumeFile("v"))
		vol.SizeBytes = tt.size
		if err := f.writeJSONAtomic(filepath.Join(f.volumes, "v"+metaSuffix), vol, true, fault.Step{}); err != nil {
			t.Fatal(err)
		}
		if err := tt.redo(); err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if size, err := devSize(dev); err != nil || size != tt.size {
			t.Errorf("%s: device has %d bytes (%v), want %d", tt.name, size, err, tt.size)
		}
	}
}

func TestFileHealthAfterUnmount(t *testing.T) {
	ctx := context.Background()
	f, p := newFile(t, "xfs", 320*mi, 0)
	if err := f.Health(ctx); err != nil {
		t.Fatal(err)
	}
	// Lazily: the backend keeps its disk busy (lockDisk).
	testdisk.Run(t, "umount", "--lazy", p)
	err := f.Health(ctx)
	if err == nil || !strings.Contains(err.Error(), "unmounted") {
		t.Errorf("health after unmount: %v", err)
	}
	if _, err := f.CreateVolume(ctx, CreateRequest{Key: "x", Name: "x", SizeBytes: mi}); !errors.Is(err, ErrUnhealthy) {
		t.Errorf("create on an unmounted disk: %v, want ErrUnhealthy", err)
	}
}

// TestFileRefusesUnmountedPath starts a backend on a plain directory, as
// when the disk failed to mount: it must refuse rather than fill the root
// filesystem, until the directory opts in with a diskfit directory.
func TestFileRefusesUnmountedPath(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	f := closing(t, NewFile(testDiskName, dir, 0, nil))
	if err := f.Start(ctx); err == nil || !strings.Contains(err.Error(), "is the disk mounted?") {
		t.Fatalf("start on a plain directory: %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("refused start left %v", entries)
	}
	if err := os.Mkdir(filepath.Join(dir, stateDirName), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := f.Start(ctx); err != nil {
		t.Errorf("start on an opted-in directory: %v", err)
	}
}

// In the driver's container a disk's path may itself be a hostPath
// volume: a bind mount of the host's directory, whose device differs from
// its parent's (the container's own filesystem) whether or not the host
// has the disk mounted there. When it has not, the bind shows a plain
// directory of the host's root filesystem, and volumes made there would
// fill the node's root disk and be hidden once the disk is mounted over
// them. A disk is a filesystem mounted from its root; a bind of another
// filesystem's directory is refused like a plain directory, unless it was
// opted in (diskfit/ made by hand).
func TestFileRefusesABindOfAPlainDirectory(t *testing.T) {
	testdisk.Require(t)
	ctx := context.Background()
	hostRoot := testdisk.New(t, "xfs", 300<<20)
	unmounted := filepath.Join(hostRoot, "mnt", "disks", "d0")
	if err := os.MkdirAll(unmounted, 0o755); err != nil {
		t.Fatal(err)
	}
	container := t.TempDir()
	testdisk.Run(t, "mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", container)
	t.Cleanup(func() { testdisk.Teardown(t, container) })
	bind := func(source, name string) string {
		p := filepath.Join(container, name)
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
		testdisk.Run(t, "mount", "--bind", source, p)
		return p
	}

	p := bind(unmounted, "d0")
	f := closing(t, NewFile(testDiskName, p, 0, nil))
	if err := f.Start(ctx); err == nil || !strings.Contains(err.Error(), "is the disk mounted?") {
		t.Errorf("start on a bind of a plain directory: %v, want refused", err)
	}
	if entries, _ := os.ReadDir(unmounted); len(entries) != 0 {
		t.Errorf("refused start left %v on the host's root filesystem", entries)
	}

	// The disk mounted on the host and bound in: its filesystem's root.
	disk := testdisk.New(t, "xfs", 300<<20)
	g := closing(t, NewFile(testDiskName, bind(disk, "d1"), 0, nil))
	if err := g.Start(ctx); err != nil {
		t.Errorf("start on a bind of a disk's filesystem: %v", err)
	}
}
