package config

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
)

// FuzzParse feeds arbitrary bytes to Parse. "$D" in the input stands for a
// directory holding the subdirectories a, b and a/inner, a symlink l to a
// and a plain file f, so the fuzzer can reach the path checks. Parse must
// never panic, and every config it accepts must hold the invariants the
// rest of the driver relies on.
func FuzzParse(f *testing.F) {
	dir := f.TempDir()
	for _, p := range []string{"a", "b", "a/inner"} {
		if err := os.MkdirAll(filepath.Join(dir, p), 0o755); err != nil {
			f.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Join(dir, "a"), filepath.Join(dir, "l")); err != nil {
		f.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "f"), nil, 0o600); err != nil {
		f.Fatal(err)
	}
	for _, seed := range []string{
		"disks:\n- name: nvme0\n  path: $D/a\n  reserved: 1Gi\n",
		"maxVolumes: 3\ndisks:\n- name: d\n  path: $D/a\n- name: h\n  backend: lvm\n  volumeGroup: vg0\n",
		"disks:\n- name: a\n  path: $D/a\n- name: b\n  path: $D/l\n",
		"disks:\n- name: a\n  path: $D/a\n- name: b\n  path: $D/a/inner\n",
		"disks:\n- name: a..b\n  path: $D/a\n",
		"disks:\n- name: x\n  path: $D/f\n",
		"disks:\n- name: x\n  path: $D/a\n  reserved: -1\n",
		"disks:\n- name: x\n  path: $D/a\n  reserved: 1e100\n",
		"disks:\n- name: x\n  backend: lvm\n  volumeGroup: vg\n  device: /dev/null\n  allowInitialize: true\n",
		"{\"disks\":[{\"name\":\"j\",\"path\":\"$D/b\"}]}",
		"disks: [",
		"",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 4096 {
			return
		}
		data = bytes.ReplaceAll(data, []byte("$D"), []byte(dir))
		cfg, err := Parse(data)
		if err != nil {
			if cfg != nil {
				t.Fatalf("Parse returned a config with error %v", err)
			}
			return
		}
		checkInvariants(t, cfg)
		// What Parse accepted stays valid: Validate is idempotent.
		if err := cfg.Validate(); err != nil {
			t.Fatalf("accepted config fails validation again: %v\n%s", err, data)
		}
	})
}

// checkInvariants asserts what every accepted config promises.
func checkInvariants(t *testing.T, cfg *NodeConfig) {
	t.Helper()
	if cfg.MaxVolumes < 0 {
		t.Fatalf("maxVolumes %d accepted", cfg.MaxVolumes)
	}
	if n := len(cfg.Disks); n == 0 || n > 64 {
		t.Fatalf("%d disks accepted", n)
	}
	names, vgs := map[string]bool{}, map[string]bool{}
	var paths []string
	for _, d := range cfg.Disks {
		if err := diskfit.ValidateDiskName(d.Name); err != nil {
			t.Fatalf("disk name accepted: %v", err)
		}
		if strings.Contains(d.Name, "..") || strings.ContainsAny(d.Name, "/:\x00") {
			t.Fatalf("disk name %q would not fit in a volume ID", d.Name)
		}
		if names[d.Name] {
			t.Fatalf("duplicate disk name %q accepted", d.Name)
		}
		names[d.Name] = true
		if d.ReservedBytes() < 0 {
			t.Fatalf("disk %q: reserved %v is %d bytes", d.Name, d.Reserved, d.ReservedBytes())
		}
		if len(d.DeviceClass) > 63 {
			t.Fatalf("disk %q: deviceClass of %d bytes accepted", d.Name, len(d.DeviceClass))
		}
		switch d.Backend {
		case v1alpha1.BackendFile:
			if !filepath.IsAbs(d.Path) || filepath.Clean(d.Path) != d.Path {
				t.Fatalf("disk %q: path %q is not clean and absolute", d.Name, d.Path)
			}
			if real, err := filepath.EvalSymlinks(d.Path); err != nil || real != d.Path {
				t.Fatalf("disk %q: path %q is not resolved (%q, %v)", d.Name, d.Path, real, err)
			}
			if st, err := os.Stat(d.Path); err != nil || !st.IsDir() {
				t.Fatalf("disk %q: path %q is not a directory (%v)", d.Name, d.Path, err)
			}
			if d.VolumeGroup != "" || d.Device != "" || d.AllowInitialize {
				t.Fatalf("file disk %q has lvm settings", d.Name)
			}
			for _, p := range paths {
				if overlaps(p, d.Path) {
					t.Fatalf("overlapping paths %q and %q accepted", p, d.Path)
				}
			}
			paths = append(paths, d.Path)
		case v1alpha1.BackendLVM:
			if d.Path != "" || !vgNameRE.MatchString(d.VolumeGroup) {
				t.Fatalf("lvm disk %q: path %q, volume group %q", d.Name, d.Path, d.VolumeGroup)
			}
			if vgs[d.VolumeGroup] {
				t.Fatalf("volume group %q used twice", d.VolumeGroup)
			}
			vgs[d.VolumeGroup] = true
			if d.AllowInitialize && !filepath.IsAbs(d.Device) || d.Device != "" && !filepath.IsAbs(d.Device) {
				t.Fatalf("lvm disk %q: device %q with allowInitialize %v", d.Name, d.Device, d.AllowInitialize)
			}
		default:
			t.Fatalf("disk %q: backend %q accepted", d.Name, d.Backend)
		}
	}
}
