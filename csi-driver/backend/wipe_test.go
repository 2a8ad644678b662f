package backend

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/diskfit/diskfit/csi-driver/internal/fakelvm"
)

// The tests of this file check that what one volume stored never reaches
// the next LV on its extents: lvm2 frees the extents of a removed LV as
// they are, and zeroes only the first 4 KiB of a new one. lvm2 is faked
// (fakelvm, which keeps each extent's bytes): this machine's kernel has no
// device-mapper, so real lvm2 cannot run here.

const ext = fakelvm.ExtentSize

// newWipeLVM starts an LVM backend without a reserve on a fake volume
// group of n extents.
func newWipeLVM(t *testing.T, n int) (*LVM, *fakelvm.VG) {
	t.Helper()
	vg := fakelvm.New(int64(n) * ext)
	return startWipeLVM(t, vg, t.TempDir()), vg
}

// startWipeLVM starts another LVM backend on vg, with the lock directory
// lockDir, retrying failed wipes quickly.
func startWipeLVM(t *testing.T, vg *fakelvm.VG, lockDir string) *LVM {
	t.Helper()
	l := closing(t, NewLVM(testDiskName, fakelvm.Name, "", false, 0, vg, lockDir, lockDir))
	l.SetDeviceMapperControl(dmControl(t, true))
	fastWipes(l)
	if err := l.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return l
}

// fastWipes makes l, not yet started, try a failed wipe again within
// milliseconds.
func fastWipes(l *LVM) {
	l.wiper.retry, l.wiper.retryMax = time.Millisecond, 10*time.Millisecond
}

// secret is what a tenant writes to its volume.
var secret = bytes.Repeat([]byte("tenant A's secret "), 64)

// fill writes secret all over LV name: at the start of every extent, and
// at its end.
func fill(t *testing.T, vg *fakelvm.VG, name string) {
	t.Helper()
	n := len(vg.Extents(name))
	if n == 0 {
		t.Fatalf("no LV %s", name)
	}
	for i := range n {
		if err := vg.WriteLV(name, int64(i)*ext, secret); err != nil {
			t.Fatal(err)
		}
	}
	if err := vg.WriteLV(name, int64(n)*ext-int64(len(secret)), secret); err != nil {
		t.Fatal(err)
	}
}

// wantZero fails unless LV name reads as zeroes only.
func wantZero(t *testing.T, vg *fakelvm.VG, name string) {
	t.Helper()
	b, err := vg.ReadLV(name)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(b, secret[:32]) {
		t.Errorf("%s holds the data of a deleted volume or snapshot", name)
	} else if i := bytes.IndexFunc(b, func(r rune) bool { return r != 0 }); i >= 0 {
		t.Errorf("%s is not zero at byte %d", name, i)
	}
}

// wantReused fails unless LV name maps one of the extents was: the test
// is only worth something when the new LV lands where the old data was.
func wantReused(t *testing.T, vg *fakelvm.VG, name string, was []int) {
	t.Helper()
	if got := vg.Extents(name); !slices.ContainsFunc(got, func(e int) bool { return slices.Contains(was, e) }) {
		t.Fatalf("%s maps extents %v, none of the deleted LV's %v", name, got, was)
	}
}

// waitWiped waits until no wipe-named LV is left in vg.
func waitWiped(t *testing.T, vg *fakelvm.VG) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if !slices.ContainsFunc(vg.Names(), func(n string) bool { return strings.HasPrefix(n, "w-") }) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("LVs still being wiped after 10s: %v", vg.Names())
		}
		time.Sleep(time.Millisecond)
	}
}

// waitPaused waits until a command held with fakelvm's Hold waits.
func waitPaused(t *testing.T, paused <-chan struct{}, command string) {
	t.Helper()
	select {
	case <-paused:
	case <-time.After(10 * time.Second):
		t.Fatalf("no %s ran within 10s", command)
	}
}

// ran reports whether a command line starting with prefix ran on vg.
func ran(vg *fakelvm.VG, prefix string) bool {
	return slices.ContainsFunc(vg.Commands(), func(c string) bool { return strings.HasPrefix(c, prefix) })
}

func createVolume(t *testing.T, l *LVM, key string, size int64) {
	t.Helper()
	if _, err := l.CreateVolume(context.Background(), CreateRequest{Key: key, Name: key, SizeBytes: size}); err != nil {
		t.Fatal(err)
	}
}

// deleteWritten creates volume key of size bytes, writes secret all over
// it and deletes it. It returns the extents the volume had.
func deleteWritten(t *testing.T, l *LVM, vg *fakelvm.VG, key string, size int64) []int {
	t.Helper()
	createVolume(t, l, key, size)
	was := vg.Extents(volumePrefix + key)
	fill(t, vg, volumePrefix+key)
	if err := l.DeleteVolume(context.Background(), key); err != nil {
		t.Fatal(err)
	}
	return was
}

// wantNewVolumeZero creates volume key of size bytes, which must land on
// extents of was, and fails unless it reads as zeroes.
func wantNewVolumeZero(t *testing.T, l *LVM, vg *fakelvm.VG, key string, size int64, was []int) {
	t.Helper()
	createVolume(t, l, key, size)
	wantReused(t, vg, volumePrefix+key, was)
	wantZero(t, vg, volumePrefix+key)
}

// TestLVMDeletedVolumeIsWiped: a Block volume's data is gone before a new
// volume gets its extents.
func TestLVMDeletedVolumeIsWiped(t *testing.T) {
	l, vg := newWipeLVM(t, 2)
	was := deleteWritten(t, l, vg, "a", 2*ext)
	waitWiped(t, vg)
	wantNewVolumeZero(t, l, vg, "b", 2*ext, was)
}

// TestLVMExpandedVolumeIsWiped: the extents an expansion adds hold no
// data of a deleted volume.
func TestLVMExpandedVolumeIsWiped(t *testing.T) {
	ctx := context.Background()
	l, vg := newWipeLVM(t, 3)
	createVolume(t, l, "b", ext)
	was := deleteWritten(t, l, vg, "a", 2*ext)
	waitWiped(t, vg)
	if _, err := l.ExpandVolume(ctx, "b", 3*ext); err != nil {
		t.Fatal(err)
	}
	wantReused(t, vg, "v-b", was)
	wantZero(t, vg, "v-b")
}

// TestLVMDeletedSnapshotIsWiped: a snapshot's copy-on-write area holds its
// origin's old data; it is split off and zeroed before its extents go to
// a new volume, and the origin keeps its data.
func TestLVMDeletedSnapshotIsWiped(t *testing.T) {
	ctx := context.Background()
	// The origin takes one extent, its snapshot two (cowSize).
	l, vg := newWipeLVM(t, 3)
	createVolume(t, l, "origin", ext)
	fill(t, vg, "v-origin")
	if _, err := l.CreateSnapshot(ctx, SnapshotRequest{Key: "s", Name: "s", SourceKey: "origin"}); err != nil {
		t.Fatal(err)
	}
	was := vg.Extents("s-s")
	if b, _ := vg.ReadLV("s-s"); !bytes.Contains(b, secret) {
		t.Fatal("the fake's snapshot does not hold its origin's data")
	}
	if err := l.DeleteSnapshot(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	waitWiped(t, vg)
	// Zeroing the snapshot itself would write its copy-on-write area
	// through the snapshot target, which cannot take a full overwrite.
	calls := vg.Commands()
	split := slices.IndexFunc(calls, func(c string) bool { return strings.HasPrefix(c, "lvconvert --yes --splitsnapshot vg0/w-") })
	zero := slices.IndexFunc(calls, func(c string) bool { return strings.HasPrefix(c, "blkdiscard --zeroout /dev/vg0/w-") })
	if split < 0 || zero < split {
		t.Errorf("the snapshot was not split off before it was zeroed: %q", calls)
	}
	wantNewVolumeZero(t, l, vg, "new", ext, was)
	if b, _ := vg.ReadLV("v-origin"); !bytes.Contains(b, secret) {
		t.Error("the origin lost its data with its snapshot")
	}
	if err := l.DeleteVolume(ctx, "origin"); err != nil {
		t.Errorf("deleting the origin after its snapshot: %v", err)
	}
}

// TestLVMFailedCloneIsWiped: a clone whose copy ran holds its source's
// data; when it then fails, the half-made LV is wiped like a deleted one.
func TestLVMFailedCloneIsWiped(t *testing.T) {
	ctx := context.Background()
	l, vg := newWipeLVM(t, 2)
	createVolume(t, l, "src", ext)
	fill(t, vg, "v-src")
	markReady := errors.New("lvchange: exit status 5: injected")
	vg.SetFail("lvchange --deltag", markReady)
	if _, err := l.CreateVolume(ctx, CreateRequest{Key: "c", Name: "c", SizeBytes: ext, FromVolume: "src"}); !errors.Is(err, markReady) {
		t.Fatalf("clone failing to be marked ready: %v", err)
	}
	if !ran(vg, "dd ") {
		t.Fatal("the clone failed before its copy")
	}
	vg.SetFail("lvchange --deltag", nil)
	waitWiped(t, vg)
	wantNewVolumeZero(t, l, vg, "new", ext, []int{1})
}

// TestLVMWipeResumesAfterRestart: a driver that stops in the middle of a
// wipe leaves the LV unwiped but still allocated; the next one's Start
// finishes the wipe, and no volume gets the extents before.
func TestLVMWipeResumesAfterRestart(t *testing.T) {
	ctx := context.Background()
	l, vg := newWipeLVM(t, 2)
	lockDir := l.lockDir
	paused, resume := vg.Hold("blkdiscard")
	t.Cleanup(resume)
	was := deleteWritten(t, l, vg, "a", 2*ext)
	waitPaused(t, paused, "blkdiscard")
	if err := l.Close(); err != nil { // the held blkdiscard is killed
		t.Fatal(err)
	}
	if ran(vg, "lvremove") {
		t.Fatalf("an LV was removed unwiped: %q", vg.Commands())
	}

	paused, resume = vg.Hold("blkdiscard")
	t.Cleanup(resume)
	next := startWipeLVM(t, vg, lockDir)
	waitPaused(t, paused, "blkdiscard")
	if _, err := next.CreateVolume(ctx, CreateRequest{Key: "b", Name: "b", SizeBytes: 2 * ext}); !errors.Is(err, ErrNoSpace) {
		t.Errorf("creating a volume while the deleted one is wiped: %v, want ErrNoSpace", err)
	}
	resume()
	waitWiped(t, vg)
	wantNewVolumeZero(t, next, vg, "b", 2*ext, was)
}

// TestLVMDeleteReturnsBeforeTheWipe: deleting answers at once. The name
// is free for a new volume of the same key straight away, the deleted
// volume is gone from every listing, and its space returns once the wipe
// ends.
func TestLVMDeleteReturnsBeforeTheWipe(t *testing.T) {
	ctx := context.Background()
	l, vg := newWipeLVM(t, 8)
	createVolume(t, l, "a", 2*ext)
	paused, resume := vg.Hold("blkdiscard")
	t.Cleanup(resume)
	if err := l.DeleteVolume(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	waitPaused(t, paused, "blkdiscard")
	free := func() int64 {
		t.Helper()
		u, err := l.Usage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return u.FreeBytes
	}
	if got := free(); got != 6*ext {
		t.Errorf("free space while the volume is wiped: %d, want %d", got, 6*ext)
	}
	if _, err := l.GetVolume(ctx, "a"); !errors.Is(err, ErrNotFound) {
		t.Errorf("deleted volume: %v, want ErrNotFound", err)
	}
	vols, err := l.ListVolumes(ctx)
	if err != nil || len(vols) != 0 {
		t.Errorf("volumes while one is wiped: %+v, %v", vols, err)
	}
	snaps, err := l.ListSnapshots(ctx)
	if err != nil || len(snaps) != 0 {
		t.Errorf("snapshots while a volume is wiped: %+v, %v", snaps, err)
	}
	createVolume(t, l, "a", 2*ext)
	if got := free(); got != 4*ext {
		t.Errorf("free space with the new volume: %d, want %d", got, 4*ext)
	}
	resume()
	waitWiped(t, vg)
	if got := free(); got != 6*ext {
		t.Errorf("free space after the wipe: %d, want %d", got, 6*ext)
	}
	if vols, err := l.ListVolumes(ctx); err != nil || len(vols) != 1 || vols[0].Key != "a" {
		t.Errorf("volumes after the wipe: %+v, %v", vols, err)
	}
}

// TestLVMFailedWipeIsRetried: an LV whose wipe fails is never removed
// unwiped; the wipe is retried until it works.
func TestLVMFailedWipeIsRetried(t *testing.T) {
	l, vg := newWipeLVM(t, 2)
	vg.SetFail("blkdiscard", errors.New("blkdiscard: /dev/vg0/x: BLKZEROOUT ioctl failed: Input/output error"))
	was := deleteWritten(t, l, vg, "a", 2*ext)
	deadline := time.Now().Add(10 * time.Second)
	for countPrefix(vg.Commands(), "blkdiscard") < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("the failed wipe was not retried: %q", vg.Commands())
		}
		time.Sleep(time.Millisecond)
	}
	if ran(vg, "lvremove") {
		t.Fatalf("an LV was removed although its wipe failed: %q", vg.Commands())
	}
	vg.SetFail("blkdiscard", nil)
	waitWiped(t, vg)
	wantNewVolumeZero(t, l, vg, "b", 2*ext, was)
}

func countPrefix(list []string, prefix string) int {
	n := 0
	for _, s := range list {
		if strings.HasPrefix(s, prefix) {
			n++
		}
	}
	return n
}

// A volume whose device is still open (mounted, a pod's Block device, the
// source of a copy) is not deleted: DeleteVolume answers ErrInUse, as
// lvremove would, and nothing zeroes it. lvrename alone would not notice,
// and the wiper would then zero a device in use.
func TestLVMDeleteOfAnOpenVolumeIsRefused(t *testing.T) {
	ctx := context.Background()
	vg := fakelvm.New(1 << 30)
	l := newLVM(t, vg, true)
	if _, err := l.CreateVolume(ctx, CreateRequest{Key: "k", Name: "pvc-k", SizeBytes: 64 * mi}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Attach(ctx, "k", false); err != nil {
		t.Fatal(err)
	}
	if err := vg.WriteLV("v-k", 0, []byte("in use")); err != nil {
		t.Fatal(err)
	}
	vg.LVs["v-k"].Open = true
	if err := l.DeleteVolume(ctx, "k"); !errors.Is(err, ErrInUse) {
		t.Fatalf("deleting an open volume: %v, want ErrInUse", err)
	}
	time.Sleep(200 * time.Millisecond) // a wiper, woken, would have run
	if _, err := l.GetVolume(ctx, "k"); err != nil {
		t.Errorf("the open volume is gone: %v", err)
	}
	if got, err := vg.ReadLV("v-k"); err != nil || !bytes.HasPrefix(got, []byte("in use")) {
		t.Errorf("the open volume was zeroed or is gone: %v", err)
	}
	vg.LVs["v-k"].Open = false
	if err := l.DeleteVolume(ctx, "k"); err != nil {
		t.Errorf("deleting it once closed: %v", err)
	}
}

// TestLVMCopiesAndWipesSurviveAPowerCut: the disk acknowledges writes from
// a volatile cache (fakelvm's PowerCut loses what was not flushed; this
// machine has no device-mapper for real lvm2). A clone is tagged ready
// once dd has copied its source: a power cut after that left a ready
// volume, content filesystem, that read as whatever its extents held
// before. A deleted volume is zeroed and then removed: a power cut after
// that left its extents, now free, holding the tenant's data for the next
// volume to read. The copy and the zeroing are flushed before the LV is
// tagged ready or removed.
func TestLVMCopiesAndWipesSurviveAPowerCut(t *testing.T) {
	ctx := context.Background()
	l, vg := newWipeLVM(t, 16)
	createVolume(t, l, "source", 2*ext)
	want := bytes.Repeat([]byte("the source's data "), 64)
	if err := vg.WriteLV("v-source", 0, want); err != nil {
		t.Fatal(err)
	}
	if _, err := l.CreateVolume(ctx, CreateRequest{Key: "clone", Name: "clone", SizeBytes: 2 * ext, FromVolume: "source"}); err != nil {
		t.Fatal(err)
	}
	was := deleteWritten(t, l, vg, "gone", 4*ext)
	waitWiped(t, vg)

	vg.PowerCut()
	got, err := vg.ReadLV("v-clone")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(got, want) {
		t.Errorf("the clone, tagged ready before the power cut, reads %q..., not its source's data", got[:32])
	}
	createVolume(t, l, "next", 4*ext)
	wantReused(t, vg, "v-next", was)
	wantZero(t, vg, "v-next")
}
