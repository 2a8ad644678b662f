package loop

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/diskfit/diskfit/csi-driver/internal/testdisk"
)

func TestAttachFindRefreshDetach(t *testing.T) {
	testdisk.Require(t)
	ctx := context.Background()
	// A disk of its own, so cleanup finds every loop device the test made.
	dir := testdisk.New(t, "xfs", 320<<20)
	file := fileOn(t, dir, "/vol.img")
	if err := os.WriteFile(file.Path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(file.Path, 8<<20); err != nil {
		t.Fatal(err)
	}
	if dev, err := Find(ctx, file); err != nil || dev != "" {
		t.Fatalf("before attaching: %q, %v", dev, err)
	}
	dev, err := Attach(ctx, file, false)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := Attach(ctx, file, false); err != nil || again != dev {
		t.Errorf("second attach: %q, %v (first %q)", again, err, dev)
	}
	if _, err := Attach(ctx, file, true); !errors.Is(err, ErrReadOnlyDiffers) {
		t.Errorf("read-only attach of a file attached read-write: %v, want ErrReadOnlyDiffers", err)
	}
	if found, err := Find(ctx, file); err != nil || found != dev {
		t.Errorf("Find: %q, %v, want %q", found, err, dev)
	}
	if dio, err := DirectIO(dev); err != nil || !dio {
		t.Errorf("direct I/O: %v, %v", dio, err)
	}
	if bs, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "queue", "logical_block_size")); err != nil || string(bs) != "4096\n" {
		t.Errorf("logical block size %q, %v, want 4096", bs, err)
	}
	if err := os.Truncate(file.Path, 16<<20); err != nil {
		t.Fatal(err)
	}
	if err := Refresh(ctx, dev); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	size, err := f.Seek(0, 2)
	f.Close()
	if err != nil || size != 16<<20 {
		t.Errorf("size after refresh %d, %v", size, err)
	}
	if err := Detach(ctx, file); err != nil {
		t.Fatal(err)
	}
	if err := Detach(ctx, file); err != nil {
		t.Errorf("second detach: %v", err)
	}
	if found, _ := Find(ctx, file); found != "" {
		t.Errorf("still attached to %s", found)
	}
}

// A loop device that something else (a process holding its node, udev
// probing it) has open when it is detached stays attached: the kernel only
// marks it to be freed on last close (LO_FLAGS_AUTOCLEAR). Attach, when
// the volume is staged again, finds it and hands it out; it must take the
// mark off, or the device is freed under the pod it now serves once the
// other opener closes, and the next volume attached gets its number, and
// the pod's device node with it.
func TestAttachTakesBackADeviceMarkedToBeFreed(t *testing.T) {
	testdisk.Require(t)
	ctx := context.Background()
	dir := testdisk.New(t, "xfs", 320<<20)
	for _, readOnly := range []bool{false, true} {
		t.Run(fmt.Sprintf("readOnly=%v", readOnly), func(t *testing.T) {
			file := fileOn(t, dir, fmt.Sprintf("/vol-%v.img", readOnly))
			if err := os.WriteFile(file.Path, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(file.Path, 8<<20); err != nil {
				t.Fatal(err)
			}
			dev, err := Attach(ctx, file, readOnly)
			if err != nil {
				t.Fatal(err)
			}
			// Runs after the holder below is closed.
			testdisk.DetachAtCleanup(t, dev)
			holder, err := os.Open(dev)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { holder.Close() })
			// Detach waits for the device to go, which it cannot while held.
			dctx, cancel := context.WithTimeout(ctx, time.Second)
			err = Detach(dctx, file)
			cancel()
			if err == nil {
				t.Fatalf("Detach of %s while it is held open: no error", dev)
			}
			if !autoclear(t, dev) {
				t.Fatalf("%s, detached while held open, is not marked to be freed on last close: this test shows nothing here", dev)
			}
			again, err := Attach(ctx, file, readOnly)
			if err != nil || again != dev {
				t.Fatalf("Attach after the failed detach: %q, %v, want the existing %s", again, err, dev)
			}
			if autoclear(t, dev) {
				t.Errorf("Attach handed out %s still marked to be freed on last close", dev)
			}
			// Taking the mark off changes nothing else.
			if info, err := loopStatus(dev); err != nil || (info.Flags&unix.LO_FLAGS_READ_ONLY != 0) != readOnly {
				t.Errorf("%s read-only after Attach: %v, want %v", dev, err == nil && info.Flags&unix.LO_FLAGS_READ_ONLY != 0, readOnly)
			}
			if dio, err := DirectIO(dev); err != nil || !dio {
				t.Errorf("direct I/O of %s after Attach: %v, %v", dev, dio, err)
			}
			if bs, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "queue", "logical_block_size")); err != nil || string(bs) != "4096\n" {
				t.Errorf("logical block size of %s after Attach %q, %v, want 4096", dev, bs, err)
			}
			holder.Close()
			if found, err := Find(ctx, file); err != nil || found != dev {
				t.Errorf("after the other opener closed %s: Find %q, %v, want it still attached", dev, found, err)
			}
			if err := Detach(ctx, file); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// autoclear reports whether the kernel frees dev on its last close.
func autoclear(t *testing.T, dev string) bool {
	t.Helper()
	info, err := loopStatus(dev)
	if err != nil {
		t.Fatalf("status of %s: %v", dev, err)
	}
	return info.Flags&unix.LO_FLAGS_AUTOCLEAR != 0
}

// A loop device must not turn discards into holes in its backing file, or
// mkfs and fstrim would hand a volume's preallocated space back to the disk.
func TestAttachedDeviceKeepsItsSpace(t *testing.T) {
	testdisk.Require(t)
	ctx := context.Background()
	dir := testdisk.New(t, "xfs", 512<<20)
	file := fileOn(t, dir, "/vol.img")
	f, err := os.OpenFile(file.Path, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	const size = 304 << 20
	if err := unix.Fallocate(int(f.Fd()), 0, 0, size); err != nil {
		t.Fatal(err)
	}
	f.Close()
	dev, err := Attach(ctx, file, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Detach(ctx, file) })
	for _, step := range []struct {
		name string
		run  func() error
	}{
		{"after attach", func() error { return nil }},
		{"after blkdiscard", func() error {
			// Refused or a no-op: either way no hole may appear.
			_, _ = run(ctx, "blkdiscard", dev)
			return nil
		}},
		{"after mkfs.xfs", func() error { _, err := run(ctx, "mkfs.xfs", "-q", "-f", dev); return err }},
		{"after refresh and mkfs.ext4", func() error {
			if err := Refresh(ctx, dev); err != nil {
				return err
			}
			_, err := run(ctx, "mkfs.ext4", "-q", "-F", dev)
			return err
		}},
	} {
		if err := step.run(); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		// Loop devices are reused and keep their queue limits, so a hole
		// may not show on every run; the limit itself must always be off.
		if limit, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "queue", "discard_max_bytes")); err != nil || string(limit) != "0\n" {
			t.Errorf("%s: discard_max_bytes %q, %v, want 0", step.name, limit, err)
		}
		var st unix.Stat_t
		if err := unix.Stat(file.Path, &st); err != nil {
			t.Fatal(err)
		}
		if allocated := st.Blocks * 512; allocated < size {
			t.Errorf("%s: backing file holds %d bytes, want all %d", step.name, allocated, size)
		}
	}
}

// A disk whose filesystem was detached lazily (umount --lazy, as when it
// fails or is pulled while a volume is in use) and mounted again leaves its
// loop devices open on the old mount, and the kernel then names their
// backing files from that mount's root ("/volumes/vol.img"), not by the
// path the driver asks about. They are still that file's devices: missing
// them would let NodeUnstageVolume leave a device attached, DeleteVolume
// remove the file under it, and Attach put a second device on the file.
func TestFindAfterTheDiskIsMountedAgain(t *testing.T) {
	testdisk.Require(t)
	ctx := context.Background()
	dir := testdisk.New(t, "xfs", 320<<20)
	if err := os.Mkdir(filepath.Join(dir, "volumes"), 0o755); err != nil {
		t.Fatal(err)
	}
	file, other := fileOn(t, dir, "/volumes/vol.img"), fileOn(t, dir, "/volumes/other.img")
	for _, f := range []File{file, other} {
		if err := os.WriteFile(f.Path, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(f.Path, 8<<20); err != nil {
			t.Fatal(err)
		}
	}
	dev, err := Attach(ctx, file, false)
	if err != nil {
		t.Fatal(err)
	}
	// Runs before the disk's own cleanup, which finds devices by path.
	testdisk.DetachAtCleanup(t, dev)
	was, _ := testdisk.BackingOf(dev)

	src := testdisk.Source(dir)
	testdisk.Run(t, "umount", "--lazy", dir)
	backing, _ := os.ReadFile(filepath.Join(sysBlock, filepath.Base(dev), "loop", "backing_file"))
	if strings.TrimSpace(string(backing)) == file.Path {
		t.Fatalf("the kernel still names %s's backing file %s: this test shows nothing here", dev, file.Path)
	}
	// While the disk is not mounted at all, and after it is mounted again.
	for i, when := range []string{"while the disk is away", "after the disk was mounted again"} {
		if i == 1 {
			testdisk.Run(t, "mount", src, dir)
		}
		if found, err := FindAll(ctx, file); err != nil || !slices.Equal(found, []string{dev}) {
			t.Errorf("FindAll(%s) %s: %q, %v, want [%s] (the kernel names it %q)", file, when, found, err, dev, strings.TrimSpace(string(backing)))
		}
		if found, err := FindAll(ctx, other); err != nil || len(found) != 0 {
			t.Errorf("FindAll(%s), a file never attached, %s: %q, %v, want none", other, when, found, err)
		}
	}
	if again, err := Attach(ctx, file, false); err != nil || again != dev {
		t.Errorf("Attach after the disk was mounted again: %q, %v, want the existing %s", again, err, dev)
		if again != "" && again != dev {
			_, _ = run(ctx, "losetup", "--detach", again)
		}
	}
	if err := Detach(ctx, file); err != nil {
		t.Fatal(err)
	}
	if now, ok := testdisk.BackingOf(dev); ok && now == was {
		t.Errorf("%s is still attached after Detach(%s)", dev, file)
	}
}

// A file on another filesystem under the same name is not the same file.
func TestFindIsPerFilesystem(t *testing.T) {
	testdisk.Require(t)
	ctx := context.Background()
	a, b := fileOn(t, testdisk.New(t, "xfs", 320<<20), "/vol.img"), fileOn(t, testdisk.New(t, "xfs", 320<<20), "/vol.img")
	for _, f := range []File{a, b} {
		if err := os.WriteFile(f.Path, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(f.Path, 8<<20); err != nil {
			t.Fatal(err)
		}
	}
	dev, err := Attach(ctx, a, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Detach(ctx, a) })
	if found, err := FindAll(ctx, b); err != nil || len(found) != 0 {
		t.Errorf("FindAll(%s) with only %s attached (to %s): %q, %v, want none", b, a, dev, found, err)
	}
	if _, err := FindAll(ctx, File{Path: a.Path, Dev: a.Dev, Name: "/other.img"}); err == nil {
		t.Error("FindAll with a name that is not the end of the path: no error")
	}
}

// fileOn names the file at rel below the filesystem mounted at mnt.
func fileOn(t *testing.T, mnt, rel string) File {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(mnt, &st); err != nil {
		t.Fatal(err)
	}
	return File{Path: mnt + rel, Dev: st.Dev, Name: rel}
}

// Detach finds a file's devices, then detaches each. A device found for
// one volume may be freed in between (it was marked to be freed on last
// close and its last opener closed) and its number given to another
// volume's file by a stage running meanwhile: detaching that number would
// mark the other volume's device to be freed under the pod using it, and
// the next volume attached would get its number, and the pod's device node
// with it. The per-device step must leave a device serving another file
// alone.
func TestDetachLeavesADeviceReusedMeanwhileAlone(t *testing.T) {
	testdisk.Require(t)
	ctx := context.Background()
	dir := testdisk.New(t, "xfs", 320<<20)
	mine, other := fileOn(t, dir, "/mine.img"), fileOn(t, dir, "/other.img")
	for _, f := range []File{mine, other} {
		if err := os.WriteFile(f.Path, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(f.Path, 8<<20); err != nil {
			t.Fatal(err)
		}
	}
	// The number found for mine now serves other.
	dev, err := Attach(ctx, other, false)
	if err != nil {
		t.Fatal(err)
	}
	testdisk.DetachAtCleanup(t, dev)
	if err := detachServing(dev, mine); err != nil {
		t.Fatal(err)
	}
	if found, err := Find(ctx, other); err != nil || found != dev {
		t.Fatalf("detaching mine's device found earlier detached other's: Find(other) = %q, %v, want %s", found, err, dev)
	}
	if autoclear(t, dev) {
		t.Fatalf("detaching mine's device found earlier marked other's %s to be freed on last close", dev)
	}
	// Nor when mine cannot be reached (its disk lost, the mount
	// detached lazily), where its inode cannot tell the files apart.
	lost := File{Path: "/nonexistent" + mine.Name, Dev: mine.Dev, Name: mine.Name}
	if err := detachServing(dev, lost); err != nil {
		t.Fatal(err)
	}
	if found, err := Find(ctx, other); err != nil || found != dev || autoclear(t, dev) {
		t.Fatalf("detaching the device found for mine, unreachable, detached other's %s: Find(other) = %q, %v", dev, found, err)
	}
	// The file it serves is detached, as before.
	if err := detachServing(dev, other); err != nil {
		t.Fatal(err)
	}
	if err := waitDetached(ctx, other); err != nil {
		t.Fatal(err)
	}
}
