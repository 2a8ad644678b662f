package fakelvm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/diskfit/diskfit/csi-driver/lvm"
)

// TestData: the fake keeps data as lvm2 does on a disk. lvremove leaves
// the freed extents' data for the next LV, blkdiscard --zeroout zeroes an
// LV, a snapshot holds its origin's data and keeps it once split off.
func TestData(t *testing.T) {
	ctx := context.Background()
	vg := New(5 * ExtentSize)
	run := func(name string, args ...string) {
		t.Helper()
		if _, err := vg.Run(ctx, name, args...); err != nil {
			t.Fatal(err)
		}
	}
	read := func(name string) []byte {
		t.Helper()
		b, err := vg.ReadLV(name)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	pattern := bytes.Repeat([]byte("secret"), 1000)
	run("lvcreate", "--yes", "--name", "a", "--size", "8388608b", Name)
	run("lvcreate", "--yes", "--name", "b", "--size", "4194304b", Name)
	if err := vg.WriteLV("a", ExtentSize-3, pattern); err != nil {
		t.Fatal(err)
	}
	if got := read("a"); !bytes.Equal(got[ExtentSize-3:ExtentSize-3+len(pattern)], pattern) {
		t.Error("a does not read back what was written across its extents")
	}
	run("lvcreate", "--yes", "--name", "s", "--size", "8388608b", "--snapshot", Name+"/a")
	if !bytes.Equal(read("s"), read("a")) || vg.LVs["s"].Origin != "a" {
		t.Error("a snapshot does not hold its origin's data")
	}
	run("lvremove", "--yes", Name+"/a")
	if vg.Free != 4*ExtentSize || len(vg.LVs) != 1 {
		t.Errorf("removing an origin: free %d, LVs %v; want its snapshot removed with it", vg.Free, vg.LVs)
	}
	run("lvextend", "--size", "12582912b", Name+"/b")
	if got := vg.Extents("b"); !slices.Equal(got, []int{2, 0, 1}) {
		t.Errorf("b extended onto extents %v, want the lowest free ones", got)
	}
	if !bytes.Contains(read("b"), pattern[:100]) {
		t.Error("the extents a left hold no data any more: lvremove must not zero")
	}
	run("blkdiscard", "/dev/"+Name+"/b")
	if !bytes.Contains(read("b"), pattern[:100]) {
		t.Error("a plain discard zeroed the data: only --zeroout is sure to")
	}
	run("blkdiscard", "--zeroout", "/dev/"+Name+"/b")
	if bytes.ContainsFunc(read("b"), func(r rune) bool { return r != 0 }) {
		t.Error("blkdiscard --zeroout left data")
	}

	run("lvcreate", "--yes", "--name", "c", "--size", "4194304b", Name)
	if err := vg.WriteLV("c", 0, pattern); err != nil {
		t.Fatal(err)
	}
	run("lvcreate", "--yes", "--name", "sc", "--size", "4194304b", "--snapshot", Name+"/c")
	if _, err := vg.Run(ctx, "lvconvert", "--splitsnapshot", Name+"/sc"); err == nil {
		t.Error("split an active snapshot without --yes")
	}
	run("lvrename", Name+"/sc", Name+"/w")
	run("lvconvert", "--yes", "--splitsnapshot", Name+"/w")
	if vg.LVs["w"].Origin != "" || !bytes.HasPrefix(read("w"), pattern) {
		t.Errorf("split-off LV: origin %q, want none and the copy-on-write data kept", vg.LVs["w"].Origin)
	}
	if _, err := vg.Run(ctx, "lvconvert", "--yes", "--splitsnapshot", Name+"/w"); err == nil || !strings.Contains(err.Error(), "is not a snapshot") {
		t.Errorf("splitting a plain LV: %v", err)
	}
	if _, err := vg.Run(ctx, "lvrename", Name+"/c", Name+"/b"); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("renaming onto an existing LV: %v", err)
	}
	run("lvchange", "--activate", "n", Name+"/c")
	if _, err := vg.Run(ctx, "blkdiscard", "--zeroout", "/dev/"+Name+"/c"); err == nil {
		t.Error("blkdiscard opened an inactive LV")
	}
	if _, err := vg.Run(ctx, "lvcreate", "--yes", "--name", "big", "--size", "8388608b", Name); !strings.Contains(err.Error(), "insufficient free space") {
		t.Errorf("lvcreate beyond the free space: %v", err)
	}
}

// TestFail: a key with arguments fails only the commands it starts.
func TestFail(t *testing.T) {
	ctx := context.Background()
	vg := New(4 * ExtentSize)
	vg.Create("a", ExtentSize)
	boom := errors.New("boom")
	vg.Fail["lvchange --deltag"] = boom
	if _, err := vg.Run(ctx, "lvchange", "--activate", "y", Name+"/a"); err != nil {
		t.Errorf("activation failed: %v", err)
	}
	if _, err := vg.Run(ctx, "lvchange", "--deltag", "x", Name+"/a"); !errors.Is(err, boom) {
		t.Errorf("tag change: %v, want %v", err, boom)
	}
}

// TestHoldEndsWithContext: a held command whose context ends returns, as
// a killed process does, without running; a command run with a context
// that has ended does not start.
func TestHoldEndsWithContext(t *testing.T) {
	vg := New(4 * ExtentSize)
	vg.Create("a", ExtentSize)
	paused, resume := vg.Hold("lvremove")
	defer resume()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() {
		_, err := vg.Run(ctx, "lvremove", "--yes", Name+"/a")
		done <- err
	}()
	<-paused
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("held lvremove after its context ended: %v", err)
	}
	if vg.LVs["a"] == nil {
		t.Error("the held lvremove ran")
	}
	if _, err := vg.Run(ctx, "lvremove", "--yes", Name+"/a"); !errors.Is(err, context.Canceled) || vg.LVs["a"] == nil {
		t.Errorf("lvremove with a context that has ended: %v; want it refused, not run", err)
	}
}

// TestOriginExtendedAfterItsSnapshot: a snapshot keeps the size its origin
// had when it was made, and dm-snapshot copies no chunk beyond it, so a
// rewrite of an origin extended since fills its area only as far as that
// size. A snapshot made of the extended origin with the same area
// overflows on the same rewrite.
func TestOriginExtendedAfterItsSnapshot(t *testing.T) {
	ctx := context.Background()
	vg := New(16 * ExtentSize)
	run := func(name string, args ...string) {
		t.Helper()
		if _, err := vg.Run(ctx, name, args...); err != nil {
			t.Fatal(err)
		}
	}
	then := bytes.Repeat([]byte("then"), ExtentSize/4)
	run("lvcreate", "--yes", "--name", "a", "--size", "4194304b", Name)
	if err := vg.WriteLV("a", 0, then); err != nil {
		t.Fatal(err)
	}
	// Two extents: a rewrite of a whole 4 MiB origin and the metadata.
	run("lvcreate", "--yes", "--name", "before", "--size", "8388608b", "--snapshot", Name+"/a")
	run("lvextend", "--size", "12582912b", Name+"/a")
	run("lvcreate", "--yes", "--name", "after", "--size", "8388608b", "--snapshot", Name+"/a")
	if err := vg.WriteLV("a", 0, bytes.Repeat([]byte{0xee}, 3*ExtentSize)); err != nil {
		t.Fatal(err)
	}
	if got, err := vg.ReadLV("before"); err != nil || !bytes.Equal(got[:ExtentSize], then) {
		t.Errorf("the snapshot made before the extension: %v; want it valid, holding what the origin held", err)
	}
	if !vg.LVs["after"].Invalid {
		t.Error("a snapshot of the extended origin held a rewrite of all of it in an area for a third of it")
	}
}

// TestLvsReportsOpenLVs: lvs reports lv_attr as lvm2 does, its sixth
// character "o" for an LV whose device something holds open (a mount, a
// pod's Block device) and "-" otherwise, and "a" in the fifth for an
// active LV.
func TestLvsReportsOpenLVs(t *testing.T) {
	ctx := context.Background()
	vg := New(4 * ExtentSize)
	vg.Create("open", ExtentSize)
	vg.Create("closed", ExtentSize)
	vg.Create("inactive", ExtentSize)
	if err := vg.SetOpen("open", true); err != nil {
		t.Fatal(err)
	}
	if err := vg.SetOpen("missing", true); err == nil {
		t.Error("SetOpen of an LV that does not exist: no error")
	}
	if _, err := vg.Run(ctx, "lvchange", "--activate", "n", Name+"/inactive"); err != nil {
		t.Fatal(err)
	}
	out, err := vg.Run(ctx, "lvs", "--reportformat", "json", "-o", "lv_name,lv_attr", Name)
	if err != nil {
		t.Fatal(err)
	}
	var report struct {
		Report []struct {
			LV []struct {
				Name string `json:"lv_name"`
				Attr string `json:"lv_attr"`
			} `json:"lv"`
		} `json:"report"`
	}
	if err := json.Unmarshal([]byte(out), &report); err != nil {
		t.Fatal(err)
	}
	attrs := map[string]string{}
	for _, r := range report.Report {
		for _, lv := range r.LV {
			attrs[lv.Name] = lv.Attr
		}
	}
	want := map[string]string{"open": "-wi-ao----", "closed": "-wi-a-----", "inactive": "-wi-------"}
	if !maps.Equal(attrs, want) {
		t.Errorf("lv_attr %q, want %q", attrs, want)
	}
	if err := vg.SetOpen("open", false); err != nil {
		t.Fatal(err)
	}
	if _, err := vg.Run(ctx, "lvchange", "--activate", "n", Name+"/open"); err != nil {
		t.Errorf("deactivating an LV once closed: %v", err)
	}
}

// TestTagsAsLVM2Allows: lvcreate and lvchange refuse a tag lvm2 refuses
// (a character outside A-Za-z0-9_+.-/=!:&#, empty, longer than 1024,
// starting with a hyphen) and change nothing; the others are added.
func TestTagsAsLVM2Allows(t *testing.T) {
	ctx := context.Background()
	vg := New(4 * ExtentSize)
	good := []string{"diskfit.name=YQ", "a_b+c.d-e/f=g!h:i&j#k", strings.Repeat("t", 1024)}
	for _, bad := range []string{"", "with space", "comma,separated", "ünicode", "-hyphen", strings.Repeat("t", 1025)} {
		if _, err := vg.Run(ctx, "lvcreate", "--yes", "--name", "bad", "--size", "4194304b", "--addtag", good[0], "--addtag", bad, Name); err == nil {
			t.Errorf("lvcreate with tag %q: no error", bad)
		}
		if vg.LVs["bad"] != nil {
			t.Fatalf("lvcreate with tag %q made the LV", bad)
		}
	}
	args := []string{"--yes", "--name", "good", "--size", "4194304b"}
	for _, tag := range good {
		args = append(args, "--addtag", tag)
	}
	if _, err := vg.Run(ctx, "lvcreate", append(args, Name)...); err != nil {
		t.Fatal(err)
	}
	if _, err := vg.Run(ctx, "lvchange", "--deltag", good[0], "--addtag", "with space", Name+"/good"); err == nil {
		t.Error("lvchange with tag \"with space\": no error")
	}
	if got := vg.LVs["good"].Tags; !slices.Equal(got, good) {
		t.Errorf("tags %q, want %q", got, good)
	}
}

// TestMakingTheGroup: vgs answers for a group not made yet as lvm2 does;
// pvcreate and vgcreate refuse a signature without --yes, a partitioned
// device and another group's PV as lvm2 does, and vgcreate makes the
// group on a blank device; wipefs lists what is on a device.
func TestMakingTheGroup(t *testing.T) {
	ctx := context.Background()
	vg := NewUncreated(8*ExtentSize, "/dev/sdb")
	vg.Devices["/dev/sdc"] = &Device{Data: []byte("xfs"), Signatures: []Signature{{Type: "xfs"}}}
	vg.Devices["/dev/sdd"] = &Device{Signatures: []Signature{{Type: "dos", Offset: 0x1fe}}, Children: []string{"sdd1"}}
	vg.Devices["/dev/sde"] = &Device{Signatures: []Signature{{Type: "LVM2_member", Offset: 0x218}}, VG: "vg9"}
	_, err := vg.Run(ctx, "vgs", Name)
	if !lvm.VGNotFound(err, Name) {
		t.Errorf("vgs of the group not made yet: %v", err)
	}
	for dev, want := range map[string]string{"/dev/sdc": "Wipe it? [y/n]: [n]", "/dev/sdd": "device is partitioned", "/dev/sde": "without -ff"} {
		for _, cmd := range []string{"pvcreate", "vgcreate"} {
			args := []string{dev}
			if cmd == "vgcreate" {
				args = []string{Name, dev}
			}
			if _, err := vg.Run(ctx, cmd, args...); err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("%s %s: %v, want %q", cmd, dev, err, want)
			}
		}
	}
	if d := vg.DeviceState("/dev/sdc"); string(d.Data) != "xfs" || d.Signatures[0].Type != "xfs" {
		t.Errorf("a refused pvcreate changed the device: %+v", d)
	}
	out, err := vg.Run(ctx, "wipefs", "--no-act", "--json", "/dev/sdc")
	if sigs, perr := lvm.Signatures(ctx, staticRunner(out), "/dev/sdc"); err != nil || perr != nil || len(sigs) != 1 || sigs[0].Type != "xfs" {
		t.Errorf("wipefs: %q, %v, %v", out, err, perr)
	}
	if _, err := vg.Run(ctx, "vgcreate", "--addtag", "diskfit.disk=a", Name, "/dev/sdb"); err != nil {
		t.Fatal(err)
	}
	if _, err := vg.Run(ctx, "vgs", Name); err != nil || !vg.Exists() {
		t.Errorf("vgs of the group made: %v", err)
	}
	if d := vg.DeviceState("/dev/sdb"); len(d.Signatures) != 1 || d.Signatures[0].Type != "LVM2_member" || d.VG != Name {
		t.Errorf("the group's device: %+v", d)
	}
	if _, err := vg.Run(ctx, "vgcreate", Name, "/dev/sdb"); err == nil {
		t.Error("vgcreate of a group that exists: no error")
	}
}

type staticRunner string

func (r staticRunner) Run(context.Context, string, ...string) (string, error) { return string(r), nil }
