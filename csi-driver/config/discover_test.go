package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
	"github.com/diskfit/diskfit/csi-driver/internal/testdisk"
)

// tmpfsBelow mounts a small tmpfs at root/name and returns its path; it
// is unmounted when the test ends.
func tmpfsBelow(t *testing.T, root, name string) string {
	t.Helper()
	p := filepath.Join(root, name)
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
	testdisk.Run(t, "mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", p)
	t.Cleanup(func() { testdisk.Teardown(t, p) })
	return p
}

func TestDiscover(t *testing.T) {
	testdisk.Require(t)
	root := t.TempDir()
	nvme0 := tmpfsBelow(t, root, "nvme0")
	ssd0 := tmpfsBelow(t, root, "ssd0")
	tmpfsBelow(t, root, "Bad_Name")
	// A disk's mount whose class file is not one word: skipped, and said
	// to be skipped, since its volumes' PVs must not read as on a disk
	// that is not mounted (a failure).
	unclassed := tmpfsBelow(t, root, "hdd0")
	if err := os.WriteFile(filepath.Join(unclassed, ".diskfit-device-class"), []byte("nvme ssd\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A class file that cannot be read (here a directory; on a disk
	// whose filesystem shut down, EIO) is not an admin's edit: the disk
	// may have failed, and it is not among Skipped.
	unreadable := tmpfsBelow(t, root, "hdd1")
	if err := os.Mkdir(filepath.Join(unreadable, ".diskfit-device-class"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ssd0, ".diskfit-device-class"), []byte("ssd\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A plain directory is on the root filesystem: never a disk.
	if err := os.Mkdir(filepath.Join(root, "plain"), 0o755); err != nil {
		t.Fatal(err)
	}
	// Mounted deeper than directly below the path: not a disk either.
	tmpfsBelow(t, filepath.Join(root, "plain"), "deep")
	explicit := tmpfsBelow(t, t.TempDir(), "other")

	f, err := Decode([]byte(`
maxVolumes: 7
discover:
  path: ` + root + `
  deviceClass: nvme
  deviceClassFile: .diskfit-device-class
  reserved: 1Mi
disks:
- name: ssd0
  deviceClass: fast
  path: ` + explicit + `
`))
	if err != nil {
		t.Fatal(err)
	}
	c, err := f.Resolve("n", nil)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]Disk{}
	for _, d := range c.Disks {
		byName[d.Name] = d
	}
	if got := diskNames(c); got != "ssd0,nvme0" {
		t.Fatalf("disks %s, want ssd0 (explicit) and nvme0 (discovered)", got)
	}
	if d := byName["nvme0"]; d.Path != nvme0 || d.DeviceClass != "nvme" || d.Backend != v1alpha1.BackendFile || d.ReservedBytes() != 1<<20 {
		t.Errorf("discovered disk %+v", d)
	}
	if d := byName["ssd0"]; d.Path != explicit || d.DeviceClass != "fast" {
		t.Errorf("the explicit disk did not win over the discovered one: %+v", d)
	}
	if !strings.Contains(strings.Join(c.Notes, "\n"), "Bad_Name") {
		t.Errorf("notes %q do not say why Bad_Name was skipped", c.Notes)
	}
	if why := c.Skipped["hdd0"]; !strings.Contains(why, "one word") || len(c.Skipped) != 1 {
		t.Errorf("skipped %q, want hdd0 alone, with why (its class file)", c.Skipped)
	}
	if !strings.Contains(strings.Join(c.Notes, "\n"), "hdd1") {
		t.Errorf("notes %q do not say why hdd1 was not taken", c.Notes)
	}

	// Without the explicit entry, the discovered ssd0 takes its class from
	// the file in the mount.
	f.Disks = nil
	c, err = f.Resolve("n", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := diskNames(c); got != "nvme0,ssd0" {
		t.Fatalf("disks %s, want nvme0,ssd0", got)
	}
	if d := c.Disks[1]; d.Path != ssd0 || d.DeviceClass != "ssd" {
		t.Errorf("discovered disk %+v, want class ssd from the file", d)
	}
}

func TestDiscoverNothingMounted(t *testing.T) {
	root := dirs(t, "a", "b")
	f, err := Decode([]byte("discover: {path: " + root + "}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Resolve("n", nil); err == nil || !strings.Contains(err.Error(), "no disks configured") {
		t.Fatalf("got %v, want no disks configured: plain directories are not disks", err)
	}
}
