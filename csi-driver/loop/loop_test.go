package loop

import (
	"context"
	"os"
	"path/filepath"
	"testing"

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
