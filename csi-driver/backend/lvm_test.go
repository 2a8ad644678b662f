package backend

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/diskfit/diskfit/csi-driver/internal/fakelvm"
	"github.com/diskfit/diskfit/csi-driver/internal/testdisk"
	"github.com/diskfit/diskfit/csi-driver/lvm"
)

// dmControl returns a path that opens like /dev/mapper/control would.
func dmControl(t *testing.T, present bool) string {
	p := filepath.Join(t.TempDir(), "control")
	if present {
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

func newLVM(t *testing.T, run *fakelvm.VG, dm bool) *LVM {
	t.Helper()
	l := closing(t, NewLVM(testDiskName, "vg0", "", false, 8*mi, run, t.TempDir(), t.TempDir()))
	l.SetDeviceMapperControl(dmControl(t, dm))
	if err := l.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return l
}

func TestLVMLifecycle(t *testing.T) {
	ctx := context.Background()
	run := fakelvm.New(1 << 30)
	l := newLVM(t, run, true)
	if err := l.Health(ctx); err != nil {
		t.Fatal(err)
	}
	u, err := l.Usage(ctx)
	if err != nil || u.CapacityBytes != 1<<30-8*mi || u.FreeBytes != u.CapacityBytes {
		t.Fatalf("usage %+v, %v", u, err)
	}
	name := "Odd Name/with slash"
	vol, err := l.CreateVolume(ctx, CreateRequest{Key: "k1", Name: name, SizeBytes: 10 * mi, PVCNamespace: "ns", PVCName: "claim"})
	if err != nil {
		t.Fatal(err)
	}
	if vol.Name != name || vol.SizeBytes != 12*mi || vol.PVCName != "claim" || vol.State != StateReady {
		t.Errorf("volume %+v (sizes round up to 4MiB extents)", vol)
	}
	wantCreate := "lvcreate --yes --name v-k1 --size 12582912b --addtag diskfit.name=" + base64.RawURLEncoding.EncodeToString([]byte(name)) +
		" --addtag diskfit.state=creating --addtag diskfit.never-referenced --addtag diskfit.content=none --addtag diskfit.pvc=ns/claim vg0"
	if !contains(run.Calls, wantCreate) {
		t.Errorf("calls %q lack %q", run.Calls, wantCreate)
	}
	if !contains(run.Calls, "lvchange --deltag diskfit.state=creating --addtag diskfit.state=ready vg0/v-k1") {
		t.Errorf("volume not marked ready: %q", run.Calls)
	}
	if _, err := l.ExpandVolume(ctx, "k1", 20*mi); err != nil {
		t.Fatal(err)
	}
	if got, _ := l.GetVolume(ctx, "k1"); got.SizeBytes != 20*mi {
		t.Errorf("size after expansion %d", got.SizeBytes)
	}
	if _, err := l.CreateSnapshot(ctx, SnapshotRequest{Key: "s1", Name: "snap", SourceKey: "k1", For: "snapcontent-1"}); err != nil {
		t.Fatal(err)
	}
	// The copy-on-write area holds the 20 MiB and dm-snapshot's metadata:
	// 6 extents; the snapshot's size is its source's.
	if !contains(run.Calls, "lvcreate --yes --name s-s1 --size 25165824b --addtag diskfit.name="+base64.RawURLEncoding.EncodeToString([]byte("snap"))+
		" --addtag diskfit.state=creating --addtag diskfit.never-referenced --addtag diskfit.content=none --addtag diskfit.source=k1"+
		" --addtag diskfit.for=snapcontent-1 --addtag diskfit.snapshot"+
		" --addtag diskfit.size=20971520 --chunksize 4k --snapshot vg0/v-k1") {
		t.Errorf("snapshot command missing: %q", run.Calls)
	}
	vols, _ := l.ListVolumes(ctx)
	snaps, _ := l.ListSnapshots(ctx)
	if len(vols) != 1 || len(snaps) != 1 || snaps[0].SourceVolume != "k1" || snaps[0].SizeBytes != 20*mi || snaps[0].For != "snapcontent-1" {
		t.Errorf("volumes %+v snapshots %+v", vols, snaps)
	}
	dev, err := l.Attach(ctx, "k1", false)
	if err != nil || dev != "/dev/vg0/v-k1" {
		t.Errorf("attach: %q, %v", dev, err)
	}
	// A read-only attachment makes the LV's device refuse writes, the next
	// read-write one takes that back.
	for _, readOnly := range []bool{true, false} {
		if _, err := l.Attach(ctx, "k1", readOnly); err != nil {
			t.Fatal(err)
		}
		if got := run.LVs["v-k1"].ReadOnly; got != readOnly {
			t.Errorf("attached with readOnly %v: the device's read-only flag is %v", readOnly, got)
		}
	}
	if _, err := l.CreateVolume(ctx, CreateRequest{Key: "huge", Name: "huge", SizeBytes: 2 << 30}); !errors.Is(err, ErrNoSpace) {
		t.Errorf("too big: %v, want ErrNoSpace", err)
	}
	if _, err := l.ExpandVolume(ctx, "k1", 2<<30); !errors.Is(err, ErrNoSpace) {
		t.Errorf("expanding too far: %v, want ErrNoSpace", err)
	}
	if err := l.DeleteVolume(ctx, "k1"); !errors.Is(err, ErrInUse) {
		t.Errorf("deleting a volume with a snapshot: %v, want ErrInUse", err)
	}
	for _, del := range []func() error{
		func() error { return l.DeleteSnapshot(ctx, "s1") },
		func() error { return l.DeleteVolume(ctx, "k1") },
		func() error { return l.DeleteVolume(ctx, "k1") },
	} {
		if err := del(); err != nil {
			t.Fatal(err)
		}
	}
	waitWiped(t, run)
	if len(run.LVs) != 0 {
		t.Errorf("LVs left: %v", run.LVs)
	}
}

// TestLVMRecovery leaves an LV tagged "creating" (a crash before it was
// marked ready, its data maybe copied already) and an LV that is not
// diskfit's, and restarts. The half-made LV is wiped and removed.
func TestLVMRecovery(t *testing.T) {
	run := fakelvm.New(1 << 30)
	run.Create("v-half", 4*mi, tagName+"aGFsZg", tagState+"creating")
	run.Create("v-done", 4*mi, tagName+"ZG9uZQ", tagState+"ready")
	run.Create("root", 4*mi)
	half := run.Extents("v-half")
	fill(t, run, "v-half")
	l := newLVM(t, run, true)
	waitWiped(t, run)
	if _, ok := run.LVs["v-half"]; ok {
		t.Error("half-made LV survived the restart")
	}
	createVolume(t, l, "new", 4*mi)
	wantReused(t, run, "v-new", half)
	wantZero(t, run, "v-new")
	if _, ok := run.LVs["root"]; !ok {
		t.Error("an LV that is not diskfit's was removed")
	}
	vol, err := l.GetVolume(context.Background(), "done")
	if err != nil || vol.Name != "done" {
		t.Errorf("ready volume after restart: %+v, %v", vol, err)
	}
}

func TestLVMWithoutDeviceMapper(t *testing.T) {
	ctx := context.Background()
	run := fakelvm.New(1 << 30)
	l := newLVM(t, run, false)
	err := l.Health(ctx)
	if err == nil || !strings.Contains(err.Error(), "device-mapper is not available") {
		t.Fatalf("health without device-mapper: %v", err)
	}
	if l.SupportsSnapshots() {
		t.Error("snapshots advertised without device-mapper")
	}
	if _, err := l.CreateVolume(ctx, CreateRequest{Key: "k", Name: "k", SizeBytes: mi}); !errors.Is(err, ErrUnhealthy) {
		t.Errorf("create without device-mapper: %v, want ErrUnhealthy", err)
	}
	if len(run.Calls) != 0 {
		t.Errorf("lvm was run without device-mapper: %q", run.Calls)
	}
}

func TestLVMMissingVolumeGroup(t *testing.T) {
	l := closing(t, NewLVM(testDiskName, "gone", "", false, 0, fakelvm.New(1<<30), t.TempDir(), t.TempDir()))
	l.SetDeviceMapperControl(dmControl(t, true))
	if err := l.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "volume group gone") {
		t.Errorf("start with a missing volume group: %v", err)
	}
}

// TestParseLVMReports reads lvs and vgs reports as the backend does:
// diskfit's LVs with their tags decoded, other LVs left out, and a report
// without the group as ErrNotFound.
func TestParseLVMReports(t *testing.T) {
	tests := []struct {
		name, out string
		wantErr   bool
		wantLVs   int
	}{
		{name: "empty group", out: `{"report":[{"lv":[]}]}`},
		{name: "one of ours, one not", out: `{"report":[{"lv":[{"lv_name":"v-a","lv_size":"4194304","lv_tags":"diskfit.name=YQ,diskfit.state=ready","lv_time":""},{"lv_name":"swap","lv_size":"1","lv_tags":"","lv_time":""}]}]}`, wantLVs: 1},
		{name: "bad size", out: `{"report":[{"lv":[{"lv_name":"v-a","lv_size":"4M","lv_tags":"diskfit.name=YQ"}]}]}`, wantErr: true},
		{name: "bad name tag", out: `{"report":[{"lv":[{"lv_name":"v-a","lv_size":"1","lv_tags":"diskfit.name=!!"}]}]}`, wantErr: true},
		{name: "not JSON", out: `  LV   VG`, wantErr: true},
		{name: "bad size tag", out: `{"report":[{"lv":[{"lv_name":"s-a","lv_size":"8388608","lv_tags":"diskfit.name=YQ,diskfit.snapshot,diskfit.size=4M"}]}]}`, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lvs, err := NewLVM(testDiskName, "vg0", "", false, 0, reportRunner(tt.out), "", "").lvs(context.Background())
			if (err != nil) != tt.wantErr || len(lvs) != tt.wantLVs {
				t.Errorf("lvs = %v, %v", lvs, err)
			}
		})
	}
	// A snapshot's size is its size tag, or its LV's size when it was made
	// before the tag, with a copy-on-write area of its source's size.
	snaps, err := NewLVM(testDiskName, "vg0", "", false, 0, reportRunner(`{"report":[{"lv":[`+
		`{"lv_name":"s-new","lv_size":"8388608","lv_tags":"diskfit.name=YQ,diskfit.state=ready,diskfit.snapshot,diskfit.size=4194304","lv_time":"","origin":"v-a"},`+
		`{"lv_name":"s-old","lv_size":"4194304","lv_tags":"diskfit.name=Yg,diskfit.state=ready,diskfit.snapshot","lv_time":"","origin":"v-a"}]}]}`), "", "").ListSnapshots(context.Background())
	if err != nil || len(snaps) != 2 || snaps[0].SizeBytes != 4*mi || snaps[1].SizeBytes != 4*mi {
		t.Errorf("snapshots = %+v, %v; want two of 4 MiB", snaps, err)
	}
	other := NewLVM(testDiskName, "vg0", "", false, 0, reportRunner(`{"report":[{"vg":[{"vg_name":"other","vg_size":"1","vg_free":"1"}]}]}`), "", "")
	if _, err := other.Usage(context.Background()); !errors.Is(err, ErrNotFound) {
		t.Errorf("usage from a report of another group: %v", err)
	}
	l := NewLVM(testDiskName, "vg0", "", false, 0, reportRunner(`{"report":[{"vg":[{"vg_name":"vg0","vg_size":"100","vg_free":"40"}]}]}`), "", "")
	if u, err := l.Usage(context.Background()); err != nil || u.CapacityBytes != 100 || u.FreeBytes != 40 {
		t.Errorf("usage = %+v, %v", u, err)
	}
}

// reportRunner answers every command with out.
type reportRunner string

func (r reportRunner) Run(context.Context, string, ...string) (string, error) { return string(r), nil }

// TestLVMReal runs the backend against real lvm2 on a loop device. It
// needs device-mapper, which the kind e2e machines have and this project's
// test machines do not; there it is skipped with that reason.
func TestLVMReal(t *testing.T) {
	if err := lvm.CheckDeviceMapper(lvm.DeviceMapperControl); err != nil {
		t.Skipf("no device-mapper here (%v): real LVM runs where it exists, e.g. the kind e2e", err)
	}
	testdisk.Require(t)
	ctx := context.Background()
	img := filepath.Join(t.TempDir(), "pv.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 1<<30); err != nil {
		t.Fatal(err)
	}
	dev := strings.TrimSpace(testdisk.Run(t, "losetup", "--find", "--show", img))
	vg := "diskfit-test-" + filepath.Base(dev)
	testdisk.DetachAtCleanup(t, dev) // after the volume group is removed
	t.Cleanup(func() {
		_, _ = testdisk.Output("vgremove", "--yes", "--force", vg)
		_, _ = testdisk.Output("pvremove", "--yes", dev)
	})
	l := closing(t, NewLVM(testDiskName, vg, dev, true, 0, lvm.ExecRunner{Device: dev}, t.TempDir(), t.TempDir()))
	if err := l.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := l.CreateVolume(ctx, CreateRequest{Key: "k1", Name: "k1", SizeBytes: 64 * mi}); err != nil {
		t.Fatal(err)
	}
	path, err := l.Attach(ctx, "k1", false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Errorf("attached LV has no device node: %v", err)
	}
	if _, err := l.ExpandVolume(ctx, "k1", 128*mi); err != nil {
		t.Fatal(err)
	}
	if _, err := l.CreateSnapshot(ctx, SnapshotRequest{Key: "s1", Name: "s1", SourceKey: "k1"}); err != nil {
		t.Fatal(err)
	}
	if v, err := l.CreateVolume(ctx, CreateRequest{Key: "k2", Name: "k2", SizeBytes: 128 * mi, FromSnapshot: "s1"}); err != nil {
		t.Fatal(err)
	} else if v.SourceSnapshot != "s1" {
		t.Errorf("restore of s1 reads as from snapshot %q", v.SourceSnapshot)
	}
	// A clone of a volume whose device is open (as a mount or a pod's
	// Block device holds it) is refused; once closed it is made.
	open, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	clone := CreateRequest{Key: "k3", Name: "k3", SizeBytes: 128 * mi, FromVolume: "k1"}
	if _, err := l.CreateVolume(ctx, clone); !errors.Is(err, ErrInUse) {
		t.Errorf("cloning a volume whose device is open: %v, want ErrInUse", err)
	}
	open.Close()
	if v, err := l.CreateVolume(ctx, clone); err != nil {
		t.Fatal(err)
	} else if v.SourceVolume != "k1" {
		t.Errorf("clone of k1 reads as from volume %q", v.SourceVolume)
	}
	if err := l.DeleteVolume(ctx, "k1"); !errors.Is(err, ErrInUse) {
		t.Errorf("deleting a volume with a snapshot: %v, want ErrInUse", err)
	}
	for _, err := range []error{l.DeleteSnapshot(ctx, "s1"), l.Detach(ctx, "k1"), l.DeleteVolume(ctx, "k1"), l.DeleteVolume(ctx, "k2"), l.DeleteVolume(ctx, "k3")} {
		if err != nil {
			t.Fatal(err)
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestLVMRefs: what the driver records of a volume's PV lives in LV tags
// and reads back the same, through every change the sweep makes.
func TestLVMRefs(t *testing.T) {
	ctx := context.Background()
	l := newLVM(t, fakelvm.New(1<<30), true)
	if _, err := l.CreateVolume(ctx, CreateRequest{Key: "k", Name: "k", SizeBytes: 4 * mi}); err != nil {
		t.Fatal(err)
	}
	since := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	for _, want := range []Refs{
		{NeverReferenced: true},
		{NeverReferenced: true, UnreferencedSince: since},
		{},
		{UnreferencedSince: since.Add(time.Hour)},
		{UnreferencedSince: since},
		{},
	} {
		if err := l.SetVolumeRefs(ctx, "k", want); err != nil {
			t.Fatal(err)
		}
		got, err := l.GetVolume(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		if !got.Refs.Equal(want) {
			t.Errorf("refs %+v after setting %+v", got.Refs, want)
		}
	}
}

// TestLVMContent: what a volume holds lives in an LV tag. A new LV holds
// nothing, a copy its source's filesystem; staging replaces the tag; an LV
// made before the tag existed reads as unknown.
func TestLVMContent(t *testing.T) {
	ctx := context.Background()
	run := fakelvm.New(1 << 30)
	l := newLVM(t, run, true)
	content := func(key string) Content {
		t.Helper()
		v, err := l.GetVolume(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		return v.Content
	}
	if _, err := l.CreateVolume(ctx, CreateRequest{Key: "k", Name: "k", SizeBytes: 4 * mi}); err != nil {
		t.Fatal(err)
	}
	if got := content("k"); got != ContentNone {
		t.Errorf("new volume holds %q, want %q", got, ContentNone)
	}
	// A copy holds what its source held: a copy of a volume never
	// staged is formatted by its first stage as a new volume is (recorded
	// as a filesystem, no stage could mount it, and none would format
	// it), and a copy of a Block volume is never formatted either. A
	// snapshot records what its origin held when it was taken, for its
	// restores.
	if _, err := l.CreateSnapshot(ctx, SnapshotRequest{Key: "s-blank", Name: "s-blank", SourceKey: "k"}); err != nil {
		t.Fatal(err)
	}
	for _, held := range []Content{ContentNone, ContentFilesystem, ContentBlock} {
		if err := l.SetVolumeContent(ctx, "k", held); err != nil {
			t.Fatal(err)
		}
		clone, snap, restore := "clone-"+string(held), "s-"+string(held), "restore-"+string(held)
		if _, err := l.CreateVolume(ctx, CreateRequest{Key: clone, Name: clone, SizeBytes: 4 * mi, FromVolume: "k"}); err != nil {
			t.Fatal(err)
		}
		if _, err := l.CreateSnapshot(ctx, SnapshotRequest{Key: snap, Name: snap, SourceKey: "k"}); err != nil {
			t.Fatal(err)
		}
		if err := l.SetVolumeContent(ctx, "k", ContentFilesystem); err != nil {
			t.Fatal(err)
		}
		if _, err := l.CreateVolume(ctx, CreateRequest{Key: restore, Name: restore, SizeBytes: 4 * mi, FromSnapshot: snap}); err != nil {
			t.Fatal(err)
		}
		if got := content(clone); got != held {
			t.Errorf("clone of a volume holding %q holds %q", held, got)
		}
		if got := content(restore); got != held {
			t.Errorf("restore of a snapshot of a volume holding %q holds %q", held, got)
		}
	}
	if err := l.SetVolumeContent(ctx, "k", ContentNone); err != nil {
		t.Fatal(err)
	}
	for _, want := range []Content{ContentFilesystem, ContentFilesystem, ContentBlock} {
		if err := l.SetVolumeContent(ctx, "k", want); err != nil {
			t.Fatal(err)
		}
		if got := content("k"); got != want {
			t.Errorf("volume holds %q after setting %q", got, want)
		}
		if n := strings.Count(strings.Join(run.LVs["v-k"].Tags, ","), tagContent); n != 1 {
			t.Errorf("%d content tags: %q", n, run.LVs["v-k"].Tags)
		}
	}
	run.Create("v-older", 4*mi, tagName+"b2xkZXI", tagState+"ready")
	if got := content("older"); got != ContentUnknown {
		t.Errorf("an LV without the tag holds %q, want unknown", got)
	}
	if err := l.SetVolumeContent(ctx, "older", ContentFilesystem); err != nil {
		t.Fatal(err)
	}
	if got := content("older"); got != ContentFilesystem {
		t.Errorf("older LV holds %q after recording a filesystem", got)
	}
}

// TestLVMCopySource: a restore or clone records its source in a tag of its
// LV, added by the lvcreate that makes it (no later command a crash could
// skip), and reads it back; a volume made from nothing, or an LV made
// before the tag existed, has no source. A source key of the longest kind
// makes a tag that lvm2 takes (fakelvm checks its rules). A clone's source
// is not held by its clone: it is deleted as any volume.
func TestLVMCopySource(t *testing.T) {
	ctx := context.Background()
	run := fakelvm.New(1 << 30)
	l := newLVM(t, run, true)
	long := strings.Repeat("k", MaxKeyLength)
	for _, req := range []CreateRequest{
		{Key: long, Name: "source", SizeBytes: 4 * mi},
		{Key: "other", Name: "other", SizeBytes: 4 * mi},
	} {
		if _, err := l.CreateVolume(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.CreateSnapshot(ctx, SnapshotRequest{Key: "s", Name: "s", SourceKey: long}); err != nil {
		t.Fatal(err)
	}
	run.Create("v-older", 4*mi, tagName+"b2xkZXI", tagState+"ready", tagContent+"filesystem")
	for _, c := range []struct {
		req                           CreateRequest
		tag, fromSnapshot, fromVolume string
	}{
		{req: CreateRequest{Key: "restore", Name: "restore", SizeBytes: 4 * mi, FromSnapshot: "s"}, tag: "diskfit.source-snapshot=s", fromSnapshot: "s"},
		{req: CreateRequest{Key: "clone", Name: "clone", SizeBytes: 4 * mi, FromVolume: long}, tag: "diskfit.source-volume=" + long, fromVolume: long},
		{req: CreateRequest{Key: "clone-other", Name: "clone-other", SizeBytes: 4 * mi, FromVolume: "other"}, tag: "diskfit.source-volume=other", fromVolume: "other"},
	} {
		made, err := l.CreateVolume(ctx, c.req)
		if err != nil {
			t.Fatal(err)
		}
		var create string
		for _, call := range run.Calls {
			if strings.HasPrefix(call, "lvcreate --yes --name v-"+c.req.Key+" ") {
				create = call
			}
		}
		if !slices.Contains(strings.Fields(create), c.tag) {
			t.Errorf("%s: lvcreate %q does not add the tag %s", c.req.Key, create, c.tag)
		}
		got, err := l.GetVolume(ctx, c.req.Key)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range []*Volume{made, got} {
			if v.SourceSnapshot != c.fromSnapshot || v.SourceVolume != c.fromVolume {
				t.Errorf("%s: source snapshot %q, volume %q; want %q, %q", c.req.Key, v.SourceSnapshot, v.SourceVolume, c.fromSnapshot, c.fromVolume)
			}
		}
	}
	vols, err := l.ListVolumes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sources := map[string]string{}
	for _, v := range vols {
		sources[v.Key] = v.SourceSnapshot + "|" + v.SourceVolume
	}
	want := map[string]string{long: "|", "other": "|", "older": "|", "restore": "s|", "clone": "|" + long, "clone-other": "|other"}
	if !maps.Equal(sources, want) {
		t.Errorf("listed sources %q, want %q", sources, want)
	}
	if err := l.DeleteVolume(ctx, "other"); err != nil {
		t.Errorf("deleting a clone's source: %v", err)
	}
}

// TestLVMSnapshotSurvivesARewriteOfItsOrigin: a thick snapshot keeps what
// its origin held when it was taken even after every byte of the origin
// is written again (a restore of a database dump, a new filesystem made
// on it). Its copy-on-write area then holds a copy of every chunk, plus
// dm-snapshot's header and metadata chunks; an area of the origin's size
// overflows and the snapshot turns invalid, every restore failing. lvm2
// is faked (fakelvm fills the area as the kernel's exception store does):
// this machine's kernel has no device-mapper.
func TestLVMSnapshotSurvivesARewriteOfItsOrigin(t *testing.T) {
	ctx := context.Background()
	for _, size := range []int64{ext, 3 * ext} {
		l, vg := newWipeLVM(t, 16)
		createVolume(t, l, "origin", size)
		then := bytes.Repeat([]byte("what the snapshot keeps "), int(size)/24+1)[:size]
		if err := vg.WriteLV("v-origin", 0, then); err != nil {
			t.Fatal(err)
		}
		snap, err := l.CreateSnapshot(ctx, SnapshotRequest{Key: "s", Name: "s", SourceKey: "origin"})
		if err != nil {
			t.Fatal(err)
		}
		if snap.SizeBytes != size {
			t.Errorf("%d-byte origin: snapshot's size %d, want the origin's", size, snap.SizeBytes)
		}
		if err := vg.WriteLV("v-origin", 0, bytes.Repeat([]byte{0xee}, int(size))); err != nil {
			t.Fatal(err)
		}
		if _, err := l.CreateVolume(ctx, CreateRequest{Key: "restored", Name: "restored", SizeBytes: snap.SizeBytes, FromSnapshot: "s"}); err != nil {
			t.Fatalf("%d-byte origin rewritten: restoring its snapshot: %v", size, err)
		}
		got, err := vg.ReadLV("v-restored")
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got[:size], then) {
			t.Errorf("%d-byte origin rewritten: the restored volume does not hold what the origin held at the snapshot", size)
		}
		if s, err := l.GetSnapshot(ctx, "s"); err != nil || s.SizeBytes != size {
			t.Errorf("snapshot after the restore: %+v, %v; want size %d", s, err, size)
		}
	}
}

// TestLVMOlderSnapshotIsEnlarged: a snapshot made with a copy-on-write
// area of its origin's size, as before, is given the room at start, its
// size kept, and then survives a rewrite of its whole origin. When the
// group has no room for that, it starts all the same and tries again at
// the next start.
func TestLVMOlderSnapshotIsEnlarged(t *testing.T) {
	ctx := context.Background()
	then := bytes.Repeat([]byte{0x5a}, int(ext))
	vg, lockDir, l := withOlderSnapshot(t, then)
	vg.Create("other", 2*ext) // not diskfit's: leaves no room
	l.Close()

	l = startWipeLVM(t, vg, lockDir)
	if got := len(vg.Extents("s-old")); got != 1 {
		t.Errorf("snapshot enlarged without room: %d extents", got)
	}
	l.Close()
	if _, err := vg.Run(ctx, "lvremove", "--yes", "vg0/other"); err != nil {
		t.Fatal(err)
	}

	l = startWipeLVM(t, vg, lockDir)
	snap, err := l.GetSnapshot(ctx, "old")
	if err != nil || snap.SizeBytes != ext {
		t.Fatalf("snapshot after the start: %+v, %v; want size %d", snap, err, ext)
	}
	if got := len(vg.Extents("s-old")); got != 2 {
		t.Errorf("snapshot's area: %d extents, want 2", got)
	}
	if err := vg.WriteLV("v-origin", 0, bytes.Repeat([]byte{0xee}, int(ext))); err != nil {
		t.Fatal(err)
	}
	if _, err := l.CreateVolume(ctx, CreateRequest{Key: "restored", Name: "restored", SizeBytes: snap.SizeBytes, FromSnapshot: "old"}); err != nil {
		t.Fatalf("restoring the older snapshot after its origin was rewritten: %v", err)
	}
	if got, _ := vg.ReadLV("v-restored"); !bytes.Equal(got[:ext], then) {
		t.Error("the restored volume does not hold what the origin held at the snapshot")
	}
	l.Close()
	startWipeLVM(t, vg, lockDir)
	if got := len(vg.Extents("s-old")); got != 2 {
		t.Errorf("snapshot's area after another start: %d extents, want 2", got)
	}
	if n := strings.Count(strings.Join(vg.LVs["s-old"].Tags, ","), tagSize); n != 1 {
		t.Errorf("%d size tags: %q", n, vg.LVs["s-old"].Tags)
	}
}

// TestLVMOlderSnapshotExtendedByLVM2KeepsItsSourcesSize: a snapshot made
// before the size tag whose area lvm2 already made larger than its origin
// (dmeventd's snapshot_autoextend_threshold, or an lvextend by hand) is
// still of its origin's size: what a restore needs and gets. Its area
// holds a rewrite of the whole origin already and is left as it is.
func TestLVMOlderSnapshotExtendedByLVM2KeepsItsSourcesSize(t *testing.T) {
	ctx := context.Background()
	vg, lockDir, l := withOlderSnapshot(t, nil)
	// lvm2's own bound for a 4 MiB origin is two extents.
	if _, err := vg.Run(ctx, "lvextend", "--size", "8388608b", "vg0/s-old"); err != nil {
		t.Fatal(err)
	}
	l.Close()

	l = startWipeLVM(t, vg, lockDir)
	defer l.Close()
	snap, err := l.GetSnapshot(ctx, "old")
	if err != nil || snap.SizeBytes != ext {
		t.Errorf("snapshot after the start: %+v, %v; want its origin's size %d", snap, err, ext)
	}
	if got := len(vg.Extents("s-old")); got != 2 {
		t.Errorf("snapshot's area: %d extents, want 2 (as lvm2 left it)", got)
	}
	for _, tag := range vg.LVs["s-old"].Tags {
		if strings.HasPrefix(tag, tagSize) && tag != tagSize+strconv.FormatInt(ext, 10) {
			t.Errorf("size tag %q, want the origin's size %d", tag, ext)
		}
	}
}

// withOlderSnapshot starts a backend on a group of four extents with a
// volume "origin" of one, holding data when given, and its snapshot "old"
// made as a driver did before the size tag: an area of its origin's size.
func withOlderSnapshot(t *testing.T, data []byte) (*fakelvm.VG, string, *LVM) {
	t.Helper()
	vg := fakelvm.New(4 * ext)
	lockDir := t.TempDir()
	l := startWipeLVM(t, vg, lockDir)
	createVolume(t, l, "origin", ext)
	if data != nil {
		if err := vg.WriteLV("v-origin", 0, data); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := vg.Run(context.Background(), "lvcreate", "--yes", "--name", "s-old", "--size", "4194304b",
		"--addtag", tagName+"b2xk", "--addtag", tagState+"ready", "--addtag", tagSource+"origin", "--addtag", tagSnapshot,
		"--snapshot", "vg0/v-origin"); err != nil {
		t.Fatal(err)
	}
	return vg, lockDir, l
}

// killedAfterItsWork runs lvm2 commands on a fake volume group; while
// kill is set, an lvcreate makes its LV and is then reported killed, as
// exec.CommandContext reports an lvcreate whose caller's context ended
// after lvm2 had committed the LV.
type killedAfterItsWork struct {
	*fakelvm.VG
	kill bool
}

func (k *killedAfterItsWork) Run(ctx context.Context, name string, args ...string) (string, error) {
	out, err := k.VG.Run(ctx, name, args...)
	if err == nil && k.kill && name == "lvcreate" {
		return "", errors.New("lvcreate: signal: killed")
	}
	return out, err
}

// TestLVMCreationKilledLeavesNothing: a CreateVolume or CreateSnapshot
// whose lvcreate made the LV but was then killed (the caller gave up)
// fails, and removes the LV it made: left, it would hold its space until
// a retry of the same name, which never comes for a deleted claim or
// VolumeSnapshot, or until the driver restarts.
func TestLVMCreationKilledLeavesNothing(t *testing.T) {
	ctx := context.Background()
	run := &killedAfterItsWork{VG: fakelvm.New(1 << 30)}
	l := closing(t, NewLVM(testDiskName, "vg0", "", false, 8*mi, run, t.TempDir(), t.TempDir()))
	l.SetDeviceMapperControl(dmControl(t, true))
	if err := l.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := l.CreateVolume(ctx, CreateRequest{Key: "src", Name: "src", SizeBytes: 16 * mi}); err != nil {
		t.Fatal(err)
	}
	run.kill = true
	for _, c := range []struct {
		lv     string
		create func() error
	}{
		{"v-vol", func() error {
			_, err := l.CreateVolume(ctx, CreateRequest{Key: "vol", Name: "vol", SizeBytes: 16 * mi})
			return err
		}},
		{"s-snap", func() error {
			_, err := l.CreateSnapshot(ctx, SnapshotRequest{Key: "snap", Name: "snap", SourceKey: "src"})
			return err
		}},
	} {
		if err := c.create(); err == nil {
			t.Errorf("%s: made though its lvcreate was killed", c.lv)
		}
		if slices.Contains(run.Names(), c.lv) {
			t.Errorf("the killed creation left LV %s", c.lv)
		}
	}
}

// TestLVMInitializesOnlyABlankDevice: with allowInitialize, Start makes
// the volume group on the disk's device only when lvm2 says the group
// does not exist and the device holds nothing: no signature (a
// filesystem, another group's PV), no partitions. A vgs that fails
// otherwise (the group's disk failing reads, two groups of the name, a
// vgs killed at its deadline) says nothing of whether the group exists,
// and the device may since be another disk (the kernel hands the name to
// another disk after the group's died): Start fails, naming the device,
// and writes nothing to it. Before, any vgs failure ran pvcreate --yes on
// the device, at every DiskNode refresh, which wipes the signature found
// there. lvm2 is faked (fakelvm, which answers and refuses as lvm2 2.03
// and util-linux 2.38 do): this machine's kernel has no device-mapper.
func TestLVMInitializesOnlyABlankDevice(t *testing.T) {
	const device = "/dev/sdb"
	fs := func(typ string, offset int64) *fakelvm.Device {
		return &fakelvm.Device{Data: []byte("the blocks of a filesystem holding other volumes"), Signatures: []fakelvm.Signature{{Type: typ, Offset: offset}}}
	}
	for _, tt := range []struct {
		name string
		// host is the host's lvm2 and devices at start.
		host func() *fakelvm.VG
		// want are words the error must have, besides the device.
		want []string
	}{
		{name: "the group's disk fails reads, its name now another disk's", want: []string{"Error reading device /dev/sdc"},
			host: func() *fakelvm.VG {
				vg := fakelvm.New(1 << 30)
				vg.PV = "/dev/sdc"
				vg.Devices["/dev/sdc"] = &fakelvm.Device{ReadError: true, Signatures: []fakelvm.Signature{{Type: "LVM2_member", Offset: 0x218}}, VG: fakelvm.Name}
				vg.Devices[device] = fs("xfs", 0)
				return vg
			}},
		{name: "two groups of the name", want: []string{"Multiple VGs found with the same name"},
			host: func() *fakelvm.VG {
				vg := fakelvm.NewUncreated(1<<30, device)
				// lvm2 2.03.16's words for two groups of one name.
				vg.Fail["vgs"] = &lvm.CommandError{Command: "vgs", ExitStatus: 5, Stderr: "WARNING: VG name vg0 is used by VGs UxFR5e and 8iIwX2.\n" +
					"  Fix duplicate VG names with vgrename uuid, a device filter, or system IDs.\n" +
					"  Multiple VGs found with the same name: skipping vg0\n  Use --select vg_uuid=<uuid> in place of the VG name."}
				return vg
			}},
		{name: "vgs killed at its deadline", want: []string{"signal: killed"},
			host: func() *fakelvm.VG {
				vg := fakelvm.NewUncreated(1<<30, device)
				vg.Fail["vgs"] = &lvm.CommandError{Command: "vgs", ExitStatus: -1, Err: errors.New("signal: killed")}
				return vg
			}},
		{name: "the device holds a filesystem", want: []string{"xfs"},
			host: func() *fakelvm.VG {
				vg := fakelvm.NewUncreated(1<<30, device)
				vg.Devices[device] = fs("xfs", 0)
				return vg
			}},
		{name: "the device is another group's PV", want: []string{"LVM2_member"},
			host: func() *fakelvm.VG {
				vg := fakelvm.NewUncreated(1<<30, device)
				vg.Devices[device] = fs("LVM2_member", 0x218)
				vg.Devices[device].VG = "vg9"
				return vg
			}},
		{name: "the device does not exist", want: []string{"No such file or directory"},
			host: func() *fakelvm.VG {
				vg := fakelvm.NewUncreated(1<<30, device)
				delete(vg.Devices, device)
				return vg
			}},
		{name: "the device is partitioned", want: []string{"sdb1"},
			host: func() *fakelvm.VG {
				vg := fakelvm.NewUncreated(1<<30, device)
				vg.Devices[device] = fs("dos", 0x1fe)
				vg.Devices[device].Children = []string{"sdb1"}
				return vg
			}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			vg := tt.host()
			before := vg.DeviceState(device)
			l := closing(t, NewLVM(testDiskName, fakelvm.Name, device, true, 0, vg, t.TempDir(), t.TempDir()))
			l.SetDeviceMapperControl(dmControl(t, true))
			err := l.Start(context.Background())
			if err == nil {
				t.Error("Start: no error")
			} else {
				for _, w := range append(tt.want, device) {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("Start: %v; want it to say %q", err, w)
					}
				}
			}
			for _, c := range vg.Commands() {
				if strings.HasPrefix(c, "pvcreate") || strings.HasPrefix(c, "vgcreate") {
					t.Errorf("ran %q", c)
				}
			}
			after := vg.DeviceState(device)
			if before == nil || after == nil {
				if before != after {
					t.Errorf("the device was %v, now %v", before, after)
				}
				return
			}
			if !bytes.Equal(after.Data, before.Data) || !slices.Equal(after.Signatures, before.Signatures) {
				// (The zeroes before the fake's PV label left out.)
				t.Errorf("the device changed: held %q with %v, now %q with %v", before.Data, before.Signatures, bytes.Trim(after.Data, "\x00"), after.Signatures)
			}
		})
	}
}

// TestLVMStartsWithItsDeviceGone: the device is only for making the
// group. A group that exists starts when the device named for it is gone
// (its disk replaced by another PV, a boot that renamed it), and nothing
// probes or writes a device. lvm2 is faked (fakelvm): this machine's
// kernel has no device-mapper.
func TestLVMStartsWithItsDeviceGone(t *testing.T) {
	vg := fakelvm.New(1 << 30)
	l := closing(t, NewLVM(testDiskName, fakelvm.Name, "/dev/gone", true, 0, vg, t.TempDir(), t.TempDir()))
	l.SetDeviceMapperControl(dmControl(t, true))
	if err := l.Start(context.Background()); err != nil {
		t.Fatalf("Start of an existing group whose device is gone: %v", err)
	}
	for _, c := range vg.Commands() {
		if strings.Contains(c, "/dev/gone") {
			t.Errorf("ran %q", c)
		}
	}
}

// TestLVMDoesNotMakeAgainAGroupItServed: allowInitialize makes a group
// once. The group served, its disk then gone (it died, or is slow to
// appear at boot: lvm2 says "not found") and the configured device name
// handed to a blank disk (a replacement, a spare, another driver's LUN),
// no group is made there: the disk's volumes would read as gone, and new
// ones land on a disk that is not the group's. A group of the name with
// another UUID (made since by hand, or planted on a device lvm2 reads) is
// not served in its place. Both say which record to remove to have the
// group made anew. lvm2 is faked (fakelvm): this machine's kernel has no
// device-mapper.
func TestLVMDoesNotMakeAgainAGroupItServed(t *testing.T) {
	const device = "/dev/sdb"
	ctx := context.Background()
	lockDir, stateDir := t.TempDir(), t.TempDir()
	start := func(vg *fakelvm.VG) error {
		t.Helper()
		l := closing(t, NewLVM(testDiskName, fakelvm.Name, device, true, 0, vg, lockDir, stateDir))
		l.SetDeviceMapperControl(dmControl(t, true))
		err := l.Start(ctx)
		l.Close()
		return err
	}
	served := fakelvm.NewUncreated(1<<30, device)
	if err := start(served); err != nil {
		t.Fatal(err)
	}

	gone := fakelvm.NewUncreated(1<<30, device)
	err := start(gone)
	if err == nil || !strings.Contains(err.Error(), "not made again") {
		t.Errorf("Start with the served group gone and a blank disk at %s: %v; want a refusal", device, err)
	}
	if gone.Exists() {
		t.Errorf("the group was made again on the disk now at %s: %q", device, gone.Commands())
	}

	other := fakelvm.New(1 << 30)
	if err := start(other); err == nil || !strings.Contains(err.Error(), "not the group") || !strings.Contains(err.Error(), other.UUID) {
		t.Errorf("Start with another group of the name (UUID %s): %v; want a refusal naming it", other.UUID, err)
	}
	if err := start(served); err != nil {
		t.Errorf("Start with the served group back: %v", err)
	}
}

// TestLVMGroupReplacedWhileServedIsUnhealthy: the group's UUID is checked
// at every health check, not only at start. The group's own device gone
// and another group of its name (and tag) there in its place, planted on
// a device lvm2 reads, the disk is unhealthy: new volumes must not be
// made in that group. lvm2 is faked (fakelvm): this machine's kernel has
// no device-mapper.
func TestLVMGroupReplacedWhileServedIsUnhealthy(t *testing.T) {
	ctx := context.Background()
	vg := fakelvm.New(1 << 30)
	l := closing(t, NewLVM(testDiskName, fakelvm.Name, "", false, 0, vg, t.TempDir(), t.TempDir()))
	l.SetDeviceMapperControl(dmControl(t, true))
	if err := l.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Health(ctx); err != nil {
		t.Fatalf("Health of the group served: %v", err)
	}
	createVolume(t, l, "v", 4*mi)
	vg.UUID = "planted"
	if err := l.Health(ctx); err == nil || !strings.Contains(err.Error(), "planted") {
		t.Errorf("Health with another group of the name in place of the one served: %v; want an error naming its UUID", err)
	}
	// Nor are its LVs served: a planted LV of a volume's name would be
	// staged for the volume's pod, and written to a device its planter
	// reads.
	if v, err := l.GetVolume(ctx, "v"); err == nil || errors.Is(err, ErrNotFound) {
		t.Errorf("GetVolume in the group in place of the one served: %+v, %v; want an error that is not NotFound", v, err)
	}
	if dev, err := l.Attach(ctx, "v", false); err == nil {
		t.Errorf("Attach in the group in place of the one served: %s", dev)
	}
}

// TestLVMServesItsGroupWhenItsRecordCannotBeKept: the record of a group
// served only guards against making or taking a group anew. A group found
// and proven the disk's (its tag) is served when the record cannot be
// written (the kubelet directory's filesystem full or read-only) or read,
// rather than the disk read as failed and its claims released; a group
// not found is then not made, as whether it was served cannot be told.
// lvm2 is faked (fakelvm): this machine's kernel has no device-mapper.
func TestLVMServesItsGroupWhenItsRecordCannotBeKept(t *testing.T) {
	const device = "/dev/sdb"
	ctx := context.Background()
	notADir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notADir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	unreadable := t.TempDir()
	// The record's path is a directory: reading it fails.
	if err := os.Mkdir(filepath.Join(unreadable, fakelvm.Name+".json"), 0o700); err != nil {
		t.Fatal(err)
	}
	// No directory can be made below /proc: the record is missing and
	// cannot be written.
	for name, stateDir := range map[string]string{"is not a directory": filepath.Join(notADir, "state"), "cannot be written": "/proc/diskfit-test-state", "cannot be read": unreadable} {
		t.Run(name, func(t *testing.T) {
			start := func(vg *fakelvm.VG) error {
				t.Helper()
				l := closing(t, NewLVM(testDiskName, fakelvm.Name, device, true, 0, vg, t.TempDir(), stateDir))
				l.SetDeviceMapperControl(dmControl(t, true))
				err := l.Start(ctx)
				l.Close()
				return err
			}
			if err := start(fakelvm.New(1 << 30)); err != nil {
				t.Errorf("Start of a group found, its record %s: %v", name, err)
			}
			if name == "cannot be read" {
				gone := fakelvm.NewUncreated(1<<30, device)
				if err := start(gone); err == nil || gone.Exists() {
					t.Errorf("Start with no group and a record that cannot be read: %v, group made: %v; want a refusal", err, gone.Exists())
				}
			}
		})
	}
}

// TestLVMInitializesABlankDevice: with allowInitialize, a blank device
// (no signature, no partitions) of a group that does not exist becomes
// the group, with no --yes or --force that would wipe a signature found
// after the probe: lvm2 then asks, reads no answer and refuses. A restart
// finds the group and makes nothing. lvm2 is faked (fakelvm): this
// machine's kernel has no device-mapper.
func TestLVMInitializesABlankDevice(t *testing.T) {
	const device = "/dev/sdb"
	ctx := context.Background()
	vg := fakelvm.NewUncreated(1<<30, device)
	start := func() *LVM {
		t.Helper()
		l := closing(t, NewLVM(testDiskName, fakelvm.Name, device, true, 0, vg, t.TempDir(), t.TempDir()))
		l.SetDeviceMapperControl(dmControl(t, true))
		if err := l.Start(ctx); err != nil {
			t.Fatal(err)
		}
		return l
	}
	l := start()
	if !vg.Exists() {
		t.Fatalf("no group made on the blank device: %q", vg.Commands())
	}
	for _, c := range vg.Commands() {
		if (strings.HasPrefix(c, "pvcreate") || strings.HasPrefix(c, "vgcreate")) &&
			(strings.Contains(c, "--yes") || strings.Contains(c, " -y") || strings.Contains(c, "-f")) {
			t.Errorf("%q overrides what lvm2 finds on the device", c)
		}
	}
	if !slices.Equal(vg.Tags, []string{"diskfit.disk=" + testDiskName}) {
		t.Errorf("the group made has tags %q, want its disk's (%q)", vg.Tags, vg.Commands())
	}
	createVolume(t, l, "v", 4*mi)
	l.Close()
	made := len(vg.Commands())
	start()
	for _, c := range vg.Commands()[made:] {
		if strings.HasPrefix(c, "pvcreate") || strings.HasPrefix(c, "vgcreate") {
			t.Errorf("the restart ran %q", c)
		}
	}
}

// TestLVMSwappedVolumeGroupsAreNotServedUnderEachOthersNames: a volume ID
// names its disk, and an lvm disk is the volume group the node config
// gives it. When a config swaps two disks' groups (disk a gets vg2, disk
// b vg1), neither disk starts on the other's group: the start is refused
// as for file disks mounted at each other's paths (AnotherDiskError,
// naming the disk whose group it is), so the driver answers Unavailable
// for both disks' volumes and deletes nothing. Before, after a restart
// DeleteVolume("a:pvc-x") looked in vg2, found nothing and answered OK
// (Kubernetes deletes the PV, and the LV in vg1 is tracked by nothing),
// and disk a listed disk b's volumes as its own, which invites their
// reclaim. With the config put right, both disks serve their volumes.
// lvm2 is faked (fakelvm): this machine's kernel has no device-mapper.
func TestLVMSwappedVolumeGroupsAreNotServedUnderEachOthersNames(t *testing.T) {
	ctx := context.Background()
	vg1, vg2 := fakelvm.NewGroup("vg1", 1<<30), fakelvm.NewGroup("vg2", 1<<30)
	host := fakelvm.Host{vg1, vg2}
	lockDir := t.TempDir()
	start := func(disk, vg string) (*LVM, error) {
		l := closing(t, NewLVM(disk, vg, "", false, 0, host, lockDir, lockDir))
		l.SetDeviceMapperControl(dmControl(t, true))
		return l, l.Start(ctx)
	}
	for disk, vg := range map[string]string{"a": "vg1", "b": "vg2"} {
		l, err := start(disk, vg)
		if err != nil {
			t.Fatal(err)
		}
		createVolume(t, l, "pvc-on-"+disk, 4*mi)
		l.Close()
	}

	// The node config swaps the groups, and the driver restarts.
	for _, tt := range []struct{ disk, vg, holder string }{{"a", "vg2", "b"}, {"b", "vg1", "a"}} {
		l, err := start(tt.disk, tt.vg)
		var another *AnotherDiskError
		if !errors.Is(err, ErrAnotherDisk) || !errors.As(err, &another) || another.Disk != tt.disk || another.Holder != tt.holder ||
			!strings.Contains(err.Error(), tt.vg) {
			t.Errorf("disk %s started on %s, disk %s's group: %v; want an AnotherDiskError naming disk %s and %s", tt.disk, tt.vg, tt.holder, err, tt.holder, tt.vg)
		}
		if err == nil {
			// Served: what the driver answered for the disk's volumes.
			if err := l.DeleteVolume(ctx, "pvc-on-"+tt.disk); err == nil {
				t.Errorf("DeleteVolume(%s:pvc-on-%s) answered OK, its LV left in the other group", tt.disk, tt.disk)
			}
			if vols, _ := l.ListVolumes(ctx); len(vols) > 0 {
				t.Errorf("disk %s lists disk %s's volume %s as its own", tt.disk, tt.holder, vols[0].Key)
			}
		}
		l.Close()
	}
	if vg1.LVs["v-pvc-on-a"] == nil || vg2.LVs["v-pvc-on-b"] == nil {
		t.Fatalf("LVs left: vg1 %v, vg2 %v", vg1.Names(), vg2.Names())
	}

	// The config put right: both disks serve their volumes.
	for disk, vg := range map[string]string{"a": "vg1", "b": "vg2"} {
		l, err := start(disk, vg)
		if err != nil {
			t.Fatalf("disk %s on its own group %s: %v", disk, vg, err)
		}
		if _, err := l.GetVolume(ctx, "pvc-on-"+disk); err != nil {
			t.Errorf("disk %s's volume: %v", disk, err)
		}
		l.Close()
	}
}

// TestLVMVolumeGroupIsTaggedWithItsDisk: a group made before disks were
// recorded (or by an admin) has no disk tag: the first start tags it with
// the disk's name (vgchange --addtag diskfit.disk=<name>), and from then
// on it serves no other name. Removing the tag by hand gives it to
// another. lvm2 is faked (fakelvm): this machine's kernel has no
// device-mapper.
func TestLVMVolumeGroupIsTaggedWithItsDisk(t *testing.T) {
	ctx := context.Background()
	vg := fakelvm.New(1 << 30)
	vg.Create("v-old", 4*mi, tagName+"b2xk", tagState+"ready")
	lockDir := t.TempDir()
	start := func(disk string) error {
		l := closing(t, NewLVM(disk, fakelvm.Name, "", false, 0, vg, lockDir, lockDir))
		l.SetDeviceMapperControl(dmControl(t, true))
		err := l.Start(ctx)
		l.Close()
		return err
	}
	if err := start("a"); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(vg.Tags, []string{"diskfit.disk=a"}) {
		t.Fatalf("group's tags after disk a's first start: %q (calls %q)", vg.Tags, vg.Calls)
	}
	if err := start("b"); !errors.Is(err, ErrAnotherDisk) {
		t.Errorf("disk b on disk a's group: %v, want ErrAnotherDisk", err)
	}
	if !slices.Equal(vg.Tags, []string{"diskfit.disk=a"}) {
		t.Errorf("the refused start changed the group's tags: %q", vg.Tags)
	}
	if _, err := vg.Run(ctx, "vgchange", "--deltag", "diskfit.disk=a", fakelvm.Name); err != nil {
		t.Fatal(err)
	}
	if err := start("b"); err != nil || !slices.Equal(vg.Tags, []string{"diskfit.disk=b"}) {
		t.Errorf("disk b on the untagged group: %v, tags %q", err, vg.Tags)
	}
}
