package lvm

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"
)

func TestParseReports(t *testing.T) {
	lvs, err := ParseLVs(`{"report":[{"lv":[` +
		`{"lv_name":"v-b","lv_size":"4194304","lv_tags":"diskfit.name=YQ,diskfit.state=ready","lv_time":"2026-11-29 23:40:01 +0000","lv_attr":"owi-a-s---"},` +
		`{"lv_name":"swap","lv_size":"1","lv_tags":"","lv_time":"yesterday","lv_attr":"-wi-ao----"},` +
		`{"lv_name":"s-c","lv_size":"4194304","lv_tags":"","lv_time":"","origin":"v-b"}]}]}`)
	want := []LV{
		{Name: "s-c", SizeBytes: 4 << 20, Origin: "v-b"},
		{Name: "swap", SizeBytes: 1, Open: true},
		{Name: "v-b", SizeBytes: 4 << 20, Tags: []string{"diskfit.name=YQ", "diskfit.state=ready"}, Time: time.Date(2026, 11, 29, 23, 40, 1, 0, time.UTC)},
	}
	if err != nil || !slices.EqualFunc(lvs, want, func(a, b LV) bool {
		return a.Name == b.Name && a.SizeBytes == b.SizeBytes && slices.Equal(a.Tags, b.Tags) && a.Time.Equal(b.Time) && a.Origin == b.Origin && a.Open == b.Open
	}) {
		t.Errorf("ParseLVs = %+v, %v, want %+v sorted by name", lvs, err, want)
	}
	for name, out := range map[string]string{
		"bad size": `{"report":[{"lv":[{"lv_name":"v-a","lv_size":"4M","lv_tags":"diskfit.name=YQ"}]}]}`,
		"not JSON": `  LV   VG`,
	} {
		if lvs, err := ParseLVs(out); err == nil {
			t.Errorf("ParseLVs of %s = %+v, want an error", name, lvs)
		}
	}
	if lvs, err := ParseLVs(`{"report":[{"lv":[]}]}`); err != nil || len(lvs) != 0 {
		t.Errorf("ParseLVs of an empty group = %+v, %v", lvs, err)
	}

	if vg, ok, err := ParseVGs(`{"report":[{"vg":[{"vg_name":"other","vg_size":"1","vg_free":"1"}]}]}`, "vg0"); ok || err != nil {
		t.Errorf("ParseVGs of another group = %+v, %v, %v", vg, ok, err)
	}
	if vg, ok, err := ParseVGs(`{"report":[{"vg":[{"vg_name":"vg0","vg_size":"100","vg_free":"40"}]}]}`, "vg0"); !ok || err != nil || vg.SizeBytes != 100 || vg.FreeBytes != 40 || vg.Tags != nil {
		t.Errorf("ParseVGs = %+v, %v, %v", vg, ok, err)
	}
	// vg_tags as lvm2 2.03.16 prints them.
	if vg, ok, err := ParseVGs(`{"report":[{"vg":[{"vg_name":"vg0", "vg_size":"62914560", "vg_free":"62914560", "vg_tags":"diskfit.disk=hdd0,other"}]}]}`, "vg0"); !ok || err != nil ||
		!slices.Equal(vg.Tags, []string{"diskfit.disk=hdd0", "other"}) {
		t.Errorf("ParseVGs with tags = %+v, %v, %v", vg, ok, err)
	}
	if _, _, err := ParseVGs(`{"report":[{"vg":[{"vg_name":"vg0","vg_size":"1g","vg_free":"40"}]}]}`, "vg0"); err == nil {
		t.Error("ParseVGs of a size with a unit: no error")
	}
}

func TestInsufficientSpace(t *testing.T) {
	if !InsufficientSpace(errors.New(`lvcreate: exit status 5: Volume group "vg0" has insufficient free space (1 extents): 25 required.`)) ||
		!InsufficientSpace(errors.New("Insufficient free space: 100 extents needed, but only 1 available")) {
		t.Error("lvcreate's and lvextend's messages are not insufficient space")
	}
	if InsufficientSpace(nil) || InsufficientSpace(errors.New("Volume group not found")) {
		t.Error("other errors are insufficient space")
	}
}

// TestVGNotFound: only lvm2's own "does not exist", exit status 5 and
// those words alone, counts as a group that does not exist. The words are
// lvm2 2.03.16's, seen on a loop device; a read error comes before the
// same "not found" (lvm2's label scan logs it).
func TestVGNotFound(t *testing.T) {
	for _, tt := range []struct {
		name string
		err  error
		want bool
	}{
		{"not found", &CommandError{ExitStatus: 5, Stderr: "Volume group \"vg0\" not found\n  Cannot process volume group vg0"}, true},
		{"another group not found", &CommandError{ExitStatus: 5, Stderr: "Volume group \"vg1\" not found\n  Cannot process volume group vg1"}, false},
		{"read error", &CommandError{ExitStatus: 5, Stderr: "Error reading device /dev/sdb at 0 length 512.\n  Volume group \"vg0\" not found\n  Cannot process volume group vg0"}, false},
		{"two groups of the name", &CommandError{ExitStatus: 5, Stderr: "WARNING: VG name vg0 is used by VGs A and B.\n  Fix duplicate VG names with vgrename uuid, a device filter, or system IDs.\n  Multiple VGs found with the same name: skipping vg0\n  Use --select vg_uuid=<uuid> in place of the VG name."}, false},
		{"killed", &CommandError{ExitStatus: -1, Err: errors.New("signal: killed")}, false},
		{"other exit status", &CommandError{ExitStatus: 3, Stderr: "Volume group \"vg0\" not found"}, false},
		{"not a command's failure", errors.New(`Volume group "vg0" not found`), false},
	} {
		if got := VGNotFound(tt.err, "vg0"); got != tt.want {
			t.Errorf("%s: VGNotFound = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestProbeReports reads wipefs' and lsblk's JSON as util-linux 2.38.1
// prints them.
func TestProbeReports(t *testing.T) {
	ctx := context.Background()
	sigs, err := Signatures(ctx, runOutput(`{
   "signatures": [
      {
         "device": "loop0",
         "offset": "0x438",
         "type": "ext4",
         "uuid": "b9fd519c-aee6-4321-b3aa-a94fd75748c4",
         "label": null
      }
   ]
}
`), "/dev/loop0")
	if err != nil || len(sigs) != 1 || sigs[0].String() != "ext4 signature at offset 0x438" {
		t.Errorf("signatures %v, %v", sigs, err)
	}
	if sigs, err := Signatures(ctx, runOutput("{\n   \"signatures\": [\n\n   ]\n}\n"), "/dev/loop0"); err != nil || len(sigs) != 0 {
		t.Errorf("signatures of a blank device %v, %v", sigs, err)
	}
	children, err := Children(ctx, runOutput(`{"blockdevices": [{"name": "sdb", "type": "disk", "children": [{"name": "sdb1", "type": "part"}]}]}`), "/dev/sdb")
	if err != nil || !slices.Equal(children, []string{"sdb1 (part)"}) {
		t.Errorf("children %v, %v", children, err)
	}
	if children, err := Children(ctx, runOutput(`{"blockdevices": [{"name": "loop0", "type": "loop"}]}`), "/dev/loop0"); err != nil || len(children) != 0 {
		t.Errorf("children of a device without any %v, %v", children, err)
	}
}

// runOutput answers every command with its output.
type runOutput string

func (r runOutput) Run(context.Context, string, ...string) (string, error) { return string(r), nil }
