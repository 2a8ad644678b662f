package loop

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/diskfit/diskfit/csi-driver/internal/testdisk"
)

func TestAttachFindRefreshDetach(t *testing.T) {
	testdisk.Require(t)
	ctx := context.Background()
	// A disk of its own, so cleanup finds every loop device the test made.
	dir := testdisk.New(t, "xfs", 320<<20)
	file := filepath.Join(dir, "vol.img")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(file, 8<<20); err != nil {
		t.Fatal(err)
	}
	if dev, err := Find(ctx, file); err != nil || dev != "" {
		t.Fatalf("before attaching: %q, %v", dev, err)
	}
	dev, err := Attach(ctx, file)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := Attach(ctx, file); err != nil || again != dev {
		t.Errorf("second attach: %q, %v (first %q)", again, err, dev)
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
	if err := os.Truncate(file, 16<<20); err != nil {
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

// A loop device must not turn discards into holes in its backing file, or
// mkfs and fstrim would hand a volume's preallocated space back to the disk.
func TestAttachedDeviceKeepsItsSpace(t *testing.T) {
	testdisk.Require(t)
	ctx := context.Background()
	dir := testdisk.New(t, "xfs", 512<<20)
	file := filepath.Join(dir, "vol.img")
	f, err := os.OpenFile(file, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	const size = 304 << 20
	if err := unix.Fallocate(int(f.Fd()), 0, 0, size); err != nil {
		t.Fatal(err)
	}
	f.Close()
	dev, err := Attach(ctx, file)
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
		if err := unix.Stat(file, &st); err != nil {
			t.Fatal(err)
		}
		if allocated := st.Blocks * 512; allocated < size {
			t.Errorf("%s: backing file holds %d bytes, want all %d", step.name, allocated, size)
		}
	}
}
