package config

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
)

func TestParse(t *testing.T) {
	dir := t.TempDir()
	a, b, nested := filepath.Join(dir, "a"), filepath.Join(dir, "b"), filepath.Join(dir, "a", "inner")
	for _, p := range []string{a, b, nested} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	link := filepath.Join(dir, "link-to-a")
	if err := os.Symlink(a, link); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "plain-file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		yaml    string
		wantErr string
		check   func(*testing.T, *NodeConfig)
	}{
		{name: "file and lvm disks", yaml: `
maxVolumes: 50
disks:
- name: nvme0
  deviceClass: nvme
  path: ` + a + `
  reserved: 1Gi
- name: hdd0
  backend: lvm
  deviceClass: hdd
  volumeGroup: vg-hdd0
`, check: func(t *testing.T, c *NodeConfig) {
			if c.MaxVolumes != 50 || len(c.Disks) != 2 {
				t.Fatalf("config %+v", c)
			}
			if c.Disks[0].Backend != v1alpha1.BackendFile || c.Disks[0].ReservedBytes() != 1<<30 {
				t.Errorf("first disk %+v", c.Disks[0])
			}
			if c.Disks[1].ReservedBytes() != 0 || c.Disks[1].VolumeGroup != "vg-hdd0" {
				t.Errorf("second disk %+v", c.Disks[1])
			}
		}},
		{name: "unknown key", yaml: "disks:\n- name: d\n  path: " + a + "\n  size: 10Gi\n", wantErr: `unknown field "size"`},
		{name: "unknown top-level key", yaml: "disk: []\n", wantErr: "unknown field"},
		{name: "duplicate key", yaml: "disks:\n- name: d\n  name: e\n  path: " + a + "\n", wantErr: `key "name" already set`},
		{name: "no disks", yaml: "disks: []\n", wantErr: "no disks configured"},
		{name: "duplicate names", yaml: "disks:\n- name: d\n  path: " + a + "\n- name: d\n  path: " + b + "\n", wantErr: `duplicate disk name "d"`},
		{name: "bad name", yaml: "disks:\n- name: Disk_A\n  path: " + a + "\n", wantErr: "lower-case"},
		{name: "missing path", yaml: "disks:\n- name: d\n  path: " + filepath.Join(dir, "nope") + "\n", wantErr: "no such file"},
		{name: "path is a file", yaml: "disks:\n- name: d\n  path: " + file + "\n", wantErr: "not a directory"},
		{name: "relative path", yaml: "disks:\n- name: d\n  path: a\n", wantErr: "not absolute"},
		{name: "no path", yaml: "disks:\n- name: d\n", wantErr: "needs a path"},
		{name: "two disks on one filesystem", yaml: "disks:\n- name: d\n  path: " + a + "\n- name: e\n  path: " + b + "\n", wantErr: "are on the same filesystem"},
		{name: "nested paths", yaml: "disks:\n- name: d\n  path: " + a + "\n- name: e\n  path: " + nested + "\n", wantErr: "overlapping paths"},
		{name: "same path through a symlink", yaml: "disks:\n- name: d\n  path: " + a + "\n- name: e\n  path: " + link + "\n", wantErr: "overlapping paths"},
		{name: "negative reserve", yaml: "disks:\n- name: d\n  path: " + a + "\n  reserved: -1Gi\n", wantErr: "reserved must not be negative"},
		{name: "unknown backend", yaml: "disks:\n- name: d\n  backend: zfs\n  path: " + a + "\n", wantErr: `unknown backend "zfs"`},
		{name: "lvm without volume group", yaml: "disks:\n- name: d\n  backend: lvm\n", wantErr: "needs a valid volumeGroup"},
		// Without allowInitialize the device is only the one the group is
		// on, which lvm2 reads even when it is a loop device (lvm.LoopFilter).
		{name: "lvm device without allowInitialize", yaml: "disks:\n- name: d\n  backend: lvm\n  volumeGroup: vg\n  device: /dev/loop7\n", check: func(t *testing.T, c *NodeConfig) {
			if d := c.Disks[0]; d.Device != "/dev/loop7" || d.AllowInitialize {
				t.Errorf("disk %+v, want device /dev/loop7 without allowInitialize", d)
			}
		}},
		// The device is only used when the group does not exist, and
		// checked then (backend.LVM's Start): a device gone since the
		// group was made on it (its disk died, a boot renamed it) must not
		// keep the driver from serving the node's other disks.
		{name: "lvm missing device", yaml: "disks:\n- name: d\n  backend: lvm\n  volumeGroup: vg\n  device: /dev/nope\n  allowInitialize: true\n", check: func(t *testing.T, c *NodeConfig) {
			if d := c.Disks[0]; d.Device != "/dev/nope" || !d.AllowInitialize {
				t.Errorf("disk %+v, want device /dev/nope with allowInitialize", d)
			}
		}},
		{name: "lvm relative device", yaml: "disks:\n- name: d\n  backend: lvm\n  volumeGroup: vg\n  device: sdb\n  allowInitialize: true\n", wantErr: "not absolute"},
		{name: "lvm initialize without device", yaml: "disks:\n- name: d\n  backend: lvm\n  volumeGroup: vg\n  allowInitialize: true\n", wantErr: "allowInitialize needs a device"},
		{name: "two disks on one volume group", yaml: "disks:\n- name: d\n  backend: lvm\n  volumeGroup: vg\n- name: e\n  backend: lvm\n  volumeGroup: vg\n", wantErr: "already used by disk"},
		{name: "file disk with volume group", yaml: "disks:\n- name: d\n  path: " + a + "\n  volumeGroup: vg\n", wantErr: "only for the lvm backend"},
		{name: "negative max volumes", yaml: "maxVolumes: -1\ndisks:\n- name: d\n  path: " + a + "\n", wantErr: "maxVolumes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Parse([]byte(tt.yaml))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, cfg)
		})
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "node.yaml")
	if err := os.WriteFile(p, []byte("disks:\n- name: d\n  path: "+dir+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := (&Source{Path: p, NodeName: "n"}).Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := (&Source{Path: filepath.Join(dir, "missing.yaml"), NodeName: "n"}).Load(context.Background()); err == nil {
		t.Error("loading a missing file succeeded")
	}
}
