package lvm

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/diskfit/diskfit/csi-driver/internal/testdisk"
)

// TestExecRunnerReadsNoTenantLoopDevice: the file backend's Block volumes
// are loop devices whose every byte a tenant writes. One that writes an LVM
// label and a volume group of the node's group's name must neither make
// the node's group unreadable nor be served as it. Real lvm2 on loop
// devices: reading and writing metadata needs no device-mapper.
func TestExecRunnerReadsNoTenantLoopDevice(t *testing.T) {
	testdisk.Require(t)
	if _, err := exec.LookPath("vgcreate"); err != nil {
		t.Skip("needs lvm2 (hack/install-deps.sh installs it)")
	}
	ctx := context.Background()
	disk := loopDevice(t, 64<<20)
	tenant := loopDevice(t, 128<<20)
	vg := "diskfit-test-" + filepath.Base(disk)
	// The node's volume group on the disk's configured device, and the
	// tenant's of the same name, written with lvm2 told to see only the
	// tenant's device (a tenant writes the same bytes by hand).
	only := func(dev string) string { return `devices { global_filter = [ "a|^` + dev + `$|", "r|.*|" ] }` }
	for _, dev := range []string{disk, tenant} {
		testdisk.Run(t, "pvcreate", "--config", only(dev), dev)
		testdisk.Run(t, "vgcreate", "--config", only(dev), vg, dev)
		t.Cleanup(func() {
			_, _ = testdisk.Output("vgremove", "--config", only(dev), "--yes", vg)
			_, _ = testdisk.Output("pvremove", "--config", only(dev), "--yes", dev)
		})
	}

	got, ok, err := ReadVG(ctx, ExecRunner{Device: disk}, vg)
	if err != nil || !ok {
		t.Fatalf("reading the node's volume group beside the tenant's copy: %v (reported: %v)", err, ok)
	}
	if got.SizeBytes > 64<<20 {
		t.Errorf("read a group of %d bytes: the tenant's (128 MiB), not the disk's (64 MiB)", got.SizeBytes)
	}
	// A disk configured without a device (its group made by hand on a
	// real disk) sees no loop device at all: not the tenant's group.
	if got, ok, err := ReadVG(ctx, ExecRunner{}, vg); ok {
		t.Errorf("a runner without a device read %+v (%v): the tenant's group", got, err)
	}
}

// loopDevice attaches a sparse file of size bytes and detaches it at
// cleanup.
func loopDevice(t *testing.T, size int64) string {
	t.Helper()
	img := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, size); err != nil {
		t.Fatal(err)
	}
	dev := strings.TrimSpace(testdisk.Run(t, "losetup", "--find", "--show", img))
	testdisk.DetachAtCleanup(t, dev)
	return dev
}

func TestLoopFilter(t *testing.T) {
	for device, want := range map[string]string{
		"":             `devices { global_filter = [ "r|^/dev/loop|" ] }`,
		"/dev/sdb":     `devices { global_filter = [ "r|^/dev/loop|" ] }`,
		"/dev/loop0":   `devices { global_filter = [ "a|^/dev/loop0$|", "r|^/dev/loop|" ] }`,
		"/nonexisting": `devices { global_filter = [ "r|^/dev/loop|" ] }`,
	} {
		if _, err := os.Stat(device); device == "/dev/loop0" && err != nil {
			continue
		}
		if got := LoopFilter(device); got != want {
			t.Errorf("LoopFilter(%q) = %s, want %s", device, got, want)
		}
	}
}
