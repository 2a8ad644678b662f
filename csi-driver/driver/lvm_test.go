package driver

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2/ktesting"

	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
	"github.com/diskfit/diskfit/csi-driver/backend"
	"github.com/diskfit/diskfit/csi-driver/config"
	"github.com/diskfit/diskfit/csi-driver/internal/fakelvm"
	"github.com/diskfit/diskfit/csi-driver/lvm"
)

// TestLVMSnapshotOfAVolumeBeingExpanded: CreateSnapshot of an lvm volume
// while NodeExpandVolume grows it. The snapshot's copy-on-write area is
// sized for the size its source has when the snapshot is made; a source
// grown between the backend reading its size and lvcreate would leave an
// area for the smaller size under a snapshot of the larger one, which a
// rewrite of the grown source overflows, the snapshot turning invalid
// and every restore of it failing. The expansion is started there: after
// the two calls, rewriting the whole grown source leaves the snapshot
// readable, and a restore at the grown size holds what the source held
// when the snapshot was taken. lvm2 is faked (fakelvm, which fills a
// snapshot's area as dm-snapshot does): this machine's kernel has no
// device-mapper.
func TestLVMSnapshotOfAVolumeBeingExpanded(t *testing.T) {
	const size, grown = 16 * mi, 32 * mi
	vg := fakelvm.New(gi)
	run := &stepRunner{VG: vg}
	ctx, d := startLVMDriver(t, run)
	// The volumes are staged: NodeExpandVolume grows only a volume whose
	// device exists, and fakelvm makes no device nodes.
	dk := d.disk("lvm")
	dk.backend = stagedLVM{dk.backend}
	snapshot := func(ctx context.Context, name, src string) (*csi.CreateSnapshotResponse, error) {
		return d.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: name, SourceVolumeId: src})
	}

	// Which of its lvs calls a snapshot's last before its lvcreate: the
	// source's size is read by then, and no allocation holds the disk.
	probe, err := d.CreateVolume(ctx, blockReq("pvc-probe", size))
	if err != nil {
		t.Fatal(err)
	}
	probeCtx, commands := run.record(ctx)
	if _, err := snapshot(probeCtx, "snap-probe", probe.Volume.VolumeId); err != nil {
		t.Fatal(err)
	}
	t.Logf("a snapshot runs %q", commands())
	last := 0
	for _, c := range commands() {
		if c == "lvcreate" {
			break
		}
		if c == "lvs" {
			last++
		}
	}

	src, err := d.CreateVolume(ctx, blockReq("pvc-src", size))
	if err != nil {
		t.Fatal(err)
	}
	then := bytes.Repeat([]byte("what the snapshot keeps "), int(size)/24+1)[:size]
	if err := vg.WriteLV("v-pvc-src", 0, then); err != nil {
		t.Fatal(err)
	}
	snapCtx, paused, resume := run.pauseAt(ctx, "lvs", last)
	t.Cleanup(resume)
	snapped := make(chan error, 1)
	var snap *csi.CreateSnapshotResponse
	go func() {
		var err error
		snap, err = snapshot(snapCtx, "snap", src.Volume.VolumeId)
		snapped <- err
	}()
	<-paused
	expanded := make(chan error, 1)
	go func() {
		_, err := d.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: src.Volume.VolumeId, VolumePath: "/unused",
			CapacityRange: &csi.CapacityRange{RequiredBytes: grown}, VolumeCapability: blockCap()})
		expanded <- err
	}()
	// The expansion runs while the snapshot is being made, or waits for it.
	select {
	case err := <-expanded:
		expanded <- err
	case <-time.After(time.Second):
	}
	resume()
	if err := <-snapped; err != nil {
		t.Fatalf("CreateSnapshot: %v", err)
	}
	if err := <-expanded; err != nil {
		t.Fatalf("NodeExpandVolume: %v", err)
	}

	if err := vg.WriteLV("v-pvc-src", 0, bytes.Repeat([]byte{0xee}, int(grown))); err != nil {
		t.Fatal(err)
	}
	if _, err := vg.ReadLV("s-snap"); err != nil {
		t.Errorf("the snapshot after its grown source was rewritten: %v", err)
	}
	req := blockReq("pvc-restored", grown)
	req.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
		Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.Snapshot.SnapshotId}}}
	if _, err := d.CreateVolume(ctx, req); err != nil {
		t.Fatalf("restoring the snapshot at the grown size: %v", err)
	}
	got, err := vg.ReadLV("v-pvc-restored")
	if err != nil {
		t.Fatal(err)
	}
	if n := snap.Snapshot.SizeBytes; n < size || !bytes.Equal(got[:size], then) {
		t.Errorf("the restore (snapshot of %d bytes) does not hold what the source held when the snapshot was taken", n)
	}
}

// stepRunner runs lvm2 commands on a fake volume group, and lets a test
// see which commands one call runs or pause the call at one of them. A
// call is told from others by the context it is given.
type stepRunner struct {
	*fakelvm.VG
	mu     sync.Mutex
	before []func(ctx context.Context, name string)
}

// stepCall marks a call's context.
type stepCall struct{}

func (r *stepRunner) Run(ctx context.Context, name string, args ...string) (string, error) {
	r.mu.Lock()
	before := slices.Clone(r.before)
	r.mu.Unlock()
	for _, f := range before {
		f(ctx, name)
	}
	return r.VG.Run(ctx, name, args...)
}

// onCall returns a context for a call, and has f called before each
// command the call runs with it.
func (r *stepRunner) onCall(ctx context.Context, f func(ctx context.Context, name string)) context.Context {
	mark := new(int)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.before = append(r.before, func(c context.Context, name string) {
		if c.Value(stepCall{}) == mark {
			f(c, name)
		}
	})
	return context.WithValue(ctx, stepCall{}, mark)
}

// record returns a context for a call and what returns the names of the
// commands the call has run.
func (r *stepRunner) record(ctx context.Context) (context.Context, func() []string) {
	var mu sync.Mutex
	var names []string
	ctx = r.onCall(ctx, func(_ context.Context, name string) {
		mu.Lock()
		defer mu.Unlock()
		names = append(names, name)
	})
	return ctx, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(names)
	}
}

// pauseAt returns a context for a call whose nth command called name
// waits, before it runs, until resume is called (or the context ends);
// paused is closed once it waits.
func (r *stepRunner) pauseAt(ctx context.Context, name string, nth int) (_ context.Context, paused <-chan struct{}, resume func()) {
	p, done := make(chan struct{}), make(chan struct{})
	var seen atomic.Int32
	ctx = r.onCall(ctx, func(c context.Context, command string) {
		if command == name && seen.Add(1) == int32(nth) {
			close(p)
			select {
			case <-done:
			case <-c.Done():
			}
		}
	})
	return ctx, p, sync.OnceFunc(func() { close(done) })
}

// stagedLVM is an lvm disk whose volumes all have a device, as staged
// volumes do: fakelvm makes no device nodes.
type stagedLVM struct{ backend.Backend }

func (stagedLVM) Device(_ context.Context, key string) (string, error) {
	return lvm.DevicePath(fakelvm.Name, "v-"+key), nil
}

// lvmConfig is a driver's config for one lvm disk, "lvm", whose lvm2
// commands run runs.
func lvmConfig(t *testing.T, run lvm.Runner) Config {
	return Config{
		Endpoint: "unix:///unused", NodeID: testNode, KubeletDir: t.TempDir(), LockDir: t.TempDir(), StatusInterval: time.Hour,
		Node:                &config.NodeConfig{MaxVolumes: 10, Disks: []config.Disk{{Name: "lvm", Backend: v1alpha1.BackendLVM, VolumeGroup: fakelvm.Name}}},
		LVMRunner:           run,
		DeviceMapperControl: deviceMapperControl(t),
	}
}

// startLVMDriver starts a driver on lvmConfig.
func startLVMDriver(t *testing.T, run lvm.Runner) (context.Context, *Driver) {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	return ctx, startOn(ctx, t, lvmConfig(t, run))
}

// startOn starts a driver on cfg; its disks are released when the test
// ends.
func startOn(ctx context.Context, t *testing.T, cfg Config) *Driver {
	t.Helper()
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	d.Start(ctx)
	t.Cleanup(func() { stopDisks(d) })
	return d
}

func blockReq(name string, size int64) *csi.CreateVolumeRequest {
	req := createReq(name, size)
	req.VolumeCapabilities = []*csi.VolumeCapability{blockCap()}
	return req
}

// cloneReq asks for a Block volume copied from the volume src.
func cloneReq(name string, size int64, src string) *csi.CreateVolumeRequest {
	req := blockReq(name, size)
	req.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{
		Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: src}}}
	return req
}

// startWithSource starts a driver on a fake volume group holding one
// Block volume, pvc-src (LV v-pvc-src), of size bytes filled with text
// repeated; it returns the volume's ID and what it holds.
func startWithSource(t *testing.T, size int64, text string) (context.Context, *Driver, *fakelvm.VG, string, []byte) {
	t.Helper()
	vg := fakelvm.New(gi)
	ctx, d := startLVMDriver(t, vg)
	src, err := d.CreateVolume(ctx, blockReq("pvc-src", size))
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte(text), int(size)/len(text)+1)[:size]
	if err := vg.WriteLV("v-pvc-src", 0, data); err != nil {
		t.Fatal(err)
	}
	return ctx, d, vg, src.Volume.VolumeId, data
}

// TestLVMCopyCancelledLeavesNothingHalfMade: a restore or clone whose
// caller gives up mid-copy (external-provisioner's --timeout ends the
// call, and dd is killed with it) removes the LV it made: removing it
// with the call's ended context would fail, and the LV, half copied and
// holding its space, would stay until a retry of the same name or the
// next start; a claim deleted meanwhile is never retried. The retry then
// makes the volume. lvm2 is faked (fakelvm).
func TestLVMCopyCancelledLeavesNothingHalfMade(t *testing.T) {
	const size = 16 * mi
	ctx, d, vg, src, data := startWithSource(t, size, "copied ")
	snap, err := d.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snap", SourceVolumeId: src})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		source *csi.VolumeContentSource
	}{
		{"pvc-clone", cloneReq("", 0, src).VolumeContentSource},
		{"pvc-restore", &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
			Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.Snapshot.SnapshotId}}}},
	} {
		req := blockReq(c.name, size)
		req.VolumeContentSource = c.source
		paused, resume := vg.Hold("dd")
		callCtx, cancel := context.WithCancel(ctx)
		created := make(chan error, 1)
		go func() {
			_, err := d.CreateVolume(callCtx, req)
			created <- err
		}()
		<-paused
		cancel() // the provisioner's timeout
		err := <-created
		resume()
		if err == nil {
			t.Fatalf("%s: CreateVolume succeeded though its copy was killed", c.name)
		}
		for _, lv := range vg.Names() {
			if lv == "v-"+c.name {
				t.Errorf("%s: the cancelled copy left LV %s (%v)", c.name, lv, err)
			}
		}
		if _, err := d.CreateVolume(ctx, req); err != nil {
			t.Fatalf("%s: the retry: %v", c.name, err)
		}
		if got, err := vg.ReadLV("v-" + c.name); err != nil || !bytes.Equal(got[:size], data) {
			t.Errorf("%s: the retry made a volume without its source's data (%v)", c.name, err)
		}
	}
}

// TestLVMCloneOfASourceInUse: an lvm clone is a dd of the live source,
// block by block; a pod writing meanwhile would leave a copy of blocks
// from different moments, a filesystem no journal replay repairs, which
// is recorded as holding a filesystem and never formatted. A source
// whose device is open (mounted, a pod's Block device, which the kubelet
// holds open by a loop device while a pod maps it) is refused with
// FailedPrecondition, saying what to do, and no LV is made; Kubernetes
// asks for a clone's source not to be in use. Once closed, the clone is
// made and holds what the source holds. lvm2 is faked (fakelvm).
func TestLVMCloneOfASourceInUse(t *testing.T) {
	const size = 16 * mi
	ctx, d, vg, src, data := startWithSource(t, size, "the source ")
	if err := vg.SetOpen("v-pvc-src", true); err != nil {
		t.Fatal(err)
	}
	before := vg.Names()
	_, err := d.CreateVolume(ctx, cloneReq("pvc-clone", size, src))
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "VolumeSnapshot") {
		t.Errorf("a clone of a source in use: %v; want FailedPrecondition saying to clone it once no pod uses it or to restore a VolumeSnapshot", err)
	}
	if after := vg.Names(); !slices.Equal(after, before) {
		t.Errorf("the refused clone left LVs %q; there were %q", after, before)
	}

	if err := vg.SetOpen("v-pvc-src", false); err != nil {
		t.Fatal(err)
	}
	if _, err := d.CreateVolume(ctx, cloneReq("pvc-clone", size, src)); err != nil {
		t.Fatalf("a clone of a source no pod uses: %v", err)
	}
	if got, err := vg.ReadLV("v-pvc-clone"); err != nil || !bytes.Equal(got[:size], data) {
		t.Errorf("the clone does not hold what its source holds (%v)", err)
	}
}

// cloneHeldAtItsCopy starts a clone pvc-clone of src and returns once its
// copy (dd) is held, the source's lock taken; finish lets the copy go on
// and fails the test unless the clone is made.
func cloneHeldAtItsCopy(ctx context.Context, t *testing.T, d *Driver, vg *fakelvm.VG, src string, size int64) (finish func()) {
	t.Helper()
	return createHeldAtItsCopy(ctx, t, d, vg, cloneReq("pvc-clone", size, src))
}

// createHeldAtItsCopy sends req, a copy, and returns once its copy (dd) is
// held; finish lets the copy go on and fails the test unless the volume
// is made.
func createHeldAtItsCopy(ctx context.Context, t *testing.T, d *Driver, vg *fakelvm.VG, req *csi.CreateVolumeRequest) (finish func()) {
	t.Helper()
	paused, resume := vg.Hold("dd")
	t.Cleanup(resume)
	created := make(chan error, 1)
	go func() {
		_, err := d.CreateVolume(ctx, req)
		created <- err
	}()
	<-paused
	return func() {
		t.Helper()
		resume()
		if err := <-created; err != nil {
			t.Fatalf("%s: %v", req.Name, err)
		}
	}
}

// restoreHeldAtItsCopy starts a restore pvc-restore of the snapshot snap
// and returns once its copy (dd) is held, the snapshot's lock taken;
// finish lets the copy go on and fails the test unless the volume is made.
func restoreHeldAtItsCopy(ctx context.Context, t *testing.T, d *Driver, vg *fakelvm.VG, snap string, size int64) (finish func()) {
	t.Helper()
	req := blockReq("pvc-restore", size)
	req.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
		Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap}}}
	return createHeldAtItsCopy(ctx, t, d, vg, req)
}

// The PV informer tells the driver of every PV event (VolumeReferenced).
// An event for a clone's source, whose PV was recorded long before, must
// not wait for the copy to end, which holds the source's lock and may
// take as long as csi-provisioner's timeout: the informer's handler would
// hold up every other PV's event behind it.
func TestLVMPVEventsDoNotWaitForAClone(t *testing.T) {
	const size = 16 * mi
	ctx, d, vg, src, _ := startWithSource(t, size, "source ")
	d.VolumeReferenced(ctx, src) // its PV, as the informer saw it long before
	finish := cloneHeldAtItsCopy(ctx, t, d, vg, src, size)
	told := returnsAtOnce(t, "an event of the source's PV waited for the clone's copy", func() {
		d.VolumeReferenced(ctx, src) // an update of the source's PV
	})
	finish()
	told()
}

// returnsAtOnce runs call and fails the test with msg unless it returns
// within a second; wait waits for it to return.
func returnsAtOnce(t *testing.T, msg string, call func()) (wait func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		call()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(time.Second):
		t.Error(msg)
	}
	return func() { <-done }
}

// The VolumeSnapshotContent informer tells the driver of every content
// event (SnapshotReferenced). An event for a restore's source snapshot,
// whose content was recorded long before, must not wait for the copy to
// end, which holds the snapshot's lock.
func TestLVMContentEventsDoNotWaitForARestore(t *testing.T) {
	const size = 16 * mi
	ctx, d, vg, src, _ := startWithSource(t, size, "source ")
	snap, err := d.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snap", SourceVolumeId: src})
	if err != nil {
		t.Fatal(err)
	}
	id := snap.Snapshot.SnapshotId
	d.SnapshotReferenced(ctx, id) // its content, as the informer saw it long before
	finish := restoreHeldAtItsCopy(ctx, t, d, vg, id, size)
	told := returnsAtOnce(t, "an event of the snapshot's content waited for the restore's copy", func() {
		d.SnapshotReferenced(ctx, id) // an update of the snapshot's content
	})
	finish()
	told()
}

// TestLVMSourceIsNotStagedMidClone: a clone's source is checked not to be
// in use before its copy starts, and must not come into use before the
// copy ends. A NodeStageVolume of the source (the kubelet staging it for
// a pod) sent while the copy runs does not finish before the copy does,
// so the pod, which writes once its volume is staged, writes nothing into
// the source that the clone would take in part: the clone holds what the
// source held when it was asked for. lvm2 is faked (fakelvm).
func TestLVMSourceIsNotStagedMidClone(t *testing.T) {
	const size = 16 * mi
	ctx, d, vg, src, then := startWithSource(t, size, "before the pod ")
	finish := cloneHeldAtItsCopy(ctx, t, d, vg, src, size)
	staged := make(chan error, 1)
	go func() {
		_, err := d.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: src,
			StagingTargetPath: filepath.Join(d.kubeletDir, "plugins", "staging", "src"), VolumeCapability: blockCap()})
		if err == nil {
			// The pod opens its device and writes.
			err = errors.Join(vg.SetOpen("v-pvc-src", true), vg.WriteLV("v-pvc-src", 0, bytes.Repeat([]byte{0xee}, int(size))))
		}
		staged <- err
	}()
	select {
	case err := <-staged:
		t.Errorf("the source was staged while the clone copied it (%v)", err)
		staged <- err
	case <-time.After(time.Second):
	}
	finish()
	if err := <-staged; err != nil {
		t.Fatalf("staging the source: %v", err)
	}
	if got, err := vg.ReadLV("v-pvc-clone"); err != nil || !bytes.Equal(got[:size], then) {
		t.Errorf("the clone does not hold what its source held when it was asked for (%v)", err)
	}
}

// TestLVMCallGivenUpStopsWaiting: a call that waits for a volume's lock
// (here a stage of a clone's source, which waits for the copy) ends when
// its caller gives up, answering Aborted, and does nothing later: the
// kubelet, whose call timed out, may since have decided otherwise (the
// pod deleted, the volume to be unstaged), and a stage run once the copy
// ends would leave the volume staged that nothing will unstage, its
// device open, so that it can be neither cloned nor deleted. lvm2 is
// faked (fakelvm).
func TestLVMCallGivenUpStopsWaiting(t *testing.T) {
	const size = 16 * mi
	ctx, d, vg, src, data := startWithSource(t, size, "source ")
	finish := cloneHeldAtItsCopy(ctx, t, d, vg, src, size)
	staging := filepath.Join(d.kubeletDir, "plugins", "staging", "src")
	callCtx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	staged := make(chan error, 1)
	go func() {
		_, err := d.NodeStageVolume(callCtx, &csi.NodeStageVolumeRequest{VolumeId: src,
			StagingTargetPath: staging, VolumeCapability: blockCap()})
		staged <- err
	}()
	select {
	case err := <-staged:
		if status.Code(err) != codes.Aborted {
			t.Errorf("a stage given up while it waited for the clone: %v, want Aborted", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("a stage whose caller gave up went on waiting for the clone's copy")
		finish()
		<-staged
		finish = func() {}
	}
	finish()
	if got, err := vg.ReadLV("v-pvc-clone"); err != nil || !bytes.Equal(got[:size], data) {
		t.Errorf("the clone does not hold what its source held (%v)", err)
	}
	if _, err := d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: src}); err != nil {
		t.Errorf("the source, whose stage was given up, cannot be deleted: %v", err)
	}
}

// TestLVMRetriedCopyIsTheSameVolume: csi-provisioner that crashed, or lost
// the reply of a CreateVolume that made a restore or clone, asks again
// with the same name and source, and must get the volume made: otherwise
// the claim never gets its PV and the copy waits for the orphan sweep. A
// request of that name with no source, or another one, is another volume
// than the one made, AlreadyExists. The lvm backend records a copy's
// source in a tag of its LV, read back for the comparison. lvm2 is faked
// (fakelvm).
func TestLVMRetriedCopyIsTheSameVolume(t *testing.T) {
	const size = 16 * mi
	ctx, d, _, src, _ := startWithSource(t, size, "source ")
	other, err := d.CreateVolume(ctx, blockReq("pvc-other", size))
	if err != nil {
		t.Fatal(err)
	}
	snapshotOf := func(name, vol string) *csi.VolumeContentSource {
		t.Helper()
		s, err := d.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: name, SourceVolumeId: vol})
		if err != nil {
			t.Fatal(err)
		}
		return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
			Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: s.Snapshot.SnapshotId}}}
	}
	volumeSource := func(id string) *csi.VolumeContentSource { return cloneReq("", 0, id).VolumeContentSource }
	snap, otherSnap := snapshotOf("snap", src), snapshotOf("snap-other", other.Volume.VolumeId)
	for _, c := range []struct {
		name   string
		source *csi.VolumeContentSource
		others []*csi.VolumeContentSource
	}{
		{"pvc-clone", volumeSource(src), []*csi.VolumeContentSource{nil, volumeSource(other.Volume.VolumeId), snap}},
		{"pvc-restore", snap, []*csi.VolumeContentSource{nil, otherSnap, volumeSource(src)}},
	} {
		req := blockReq(c.name, size)
		req.VolumeContentSource = c.source
		first, err := d.CreateVolume(ctx, req)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		again, err := d.CreateVolume(ctx, req)
		if err != nil {
			t.Errorf("%s: CreateVolume again with the same name and source: %v, want the volume made", c.name, err)
		} else if again.Volume.VolumeId != first.Volume.VolumeId || again.Volume.CapacityBytes != first.Volume.CapacityBytes ||
			again.Volume.ContentSource.String() != c.source.String() {
			t.Errorf("%s: the retry returned %v, the first call %v", c.name, again.Volume, first.Volume)
		}
		for _, o := range c.others {
			req := blockReq(c.name, size)
			req.VolumeContentSource = o
			if _, err := d.CreateVolume(ctx, req); status.Code(err) != codes.AlreadyExists {
				t.Errorf("%s: CreateVolume of its name with source %v: %v, want AlreadyExists", c.name, o, err)
			}
		}
	}
}

// TestLVMSnapshotIsNotDeletedMidRestore: a restore is a dd from the
// snapshot's LV, and a deleted snapshot's LV is renamed for the wiper,
// which zeroes and removes it. A DeleteSnapshot sent while a restore
// copies (csi-snapshotter deleting a VolumeSnapshot whose restore is
// still being provisioned) waits until the copy ends, and the restored
// volume holds what the snapshot held; then the snapshot is gone. lvm2
// is faked (fakelvm).
func TestLVMSnapshotIsNotDeletedMidRestore(t *testing.T) {
	const size = 16 * mi
	ctx, d, vg, src, then := startWithSource(t, size, "when the snapshot was taken ")
	snap, err := d.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snap", SourceVolumeId: src})
	if err != nil {
		t.Fatal(err)
	}
	if err := vg.WriteLV("v-pvc-src", 0, bytes.Repeat([]byte{0xee}, int(size))); err != nil {
		t.Fatal(err)
	}
	finish := restoreHeldAtItsCopy(ctx, t, d, vg, snap.Snapshot.SnapshotId, size)
	deleted := make(chan error, 1)
	go func() {
		_, err := d.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: snap.Snapshot.SnapshotId})
		deleted <- err
	}()
	select {
	case err := <-deleted:
		t.Errorf("the snapshot was deleted while a restore copied it (%v)", err)
		deleted <- err
	case <-time.After(time.Second):
	}
	finish()
	if got, err := vg.ReadLV("v-pvc-restore"); err != nil || !bytes.Equal(got[:size], then) {
		t.Errorf("the restored volume does not hold what the snapshot held (%v)", err)
	}
	if err := <-deleted; err != nil {
		t.Fatalf("DeleteSnapshot after the restore: %v", err)
	}
	if list, err := d.ListSnapshots(ctx, &csi.ListSnapshotsRequest{SnapshotId: snap.Snapshot.SnapshotId}); err != nil || len(list.Entries) != 0 {
		t.Errorf("after DeleteSnapshot the snapshot is listed: %v (%v)", list, err)
	}
}

// TestLVMCreateOnAGroupNotProvenTheDisksIsUnavailable: a group the first
// start could not tag with its disk's name is tagged by the first
// creation. Found then tagged for another disk (the node config swapped
// since), the creation answers Unavailable, which external-provisioner
// retries, and makes nothing: not Internal, which reads as a bug.
// lvm2 is faked (fakelvm): this machine's kernel has no device-mapper.
func TestLVMCreateOnAGroupNotProvenTheDisksIsUnavailable(t *testing.T) {
	for _, tt := range []struct {
		name  string
		after func(vg *fakelvm.VG)
	}{
		{"tagged for another disk", func(vg *fakelvm.VG) { vg.Tags = []string{"diskfit.disk=other"} }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			vg := fakelvm.New(1 << 30)
			vg.Fail["vgchange"] = errors.New("vgchange: exit status 5: metadata area full")
			ctx, d := startLVMDriver(t, vg)
			tt.after(vg)
			_, err := d.CreateVolume(ctx, createReq("pvc-1", 16*mi))
			wantCode(t, err, codes.Unavailable)
			if names := vg.Names(); len(names) != 0 {
				t.Errorf("LVs made: %v", names)
			}
		})
	}
}

// TestLVMGroupFoundTwiceIsNotAFailure: lvm2 refuses a volume group it
// finds twice under its name: a disk moved from another node whose group
// has the same name (the docs' naming is the same on every node), or
// another driver's block volume a tenant wrote a group into. The group's
// own device is not lost: the disk is published unhealthy with reason
// DuplicateVolumeGroup, which diskfit-controller releases no claim for,
// not as failed, whose claims it releases. Both at start and once served.
// lvm2 is faked (fakelvm): this machine's kernel has no device-mapper.
func TestLVMGroupFoundTwiceIsNotAFailure(t *testing.T) {
	duplicate := &lvm.CommandError{Command: "vgs", ExitStatus: 5, Stderr: "WARNING: VG name vg0 is used by VGs UxFR5e and 8iIwX2.\n" +
		"  Fix duplicate VG names with vgrename uuid, a device filter, or system IDs.\n" +
		"  Multiple VGs found with the same name: skipping vg0\n  Use --select vg_uuid=<uuid> in place of the VG name."}
	for _, when := range []string{"at start", "once served"} {
		t.Run(when, func(t *testing.T) {
			vg := fakelvm.New(1 << 30)
			if when == "at start" {
				vg.Fail["vgs"] = duplicate
			}
			ctx, d := startLVMDriver(t, vg)
			vg.Fail["vgs"] = duplicate
			ds := d.observe(ctx, false).Disk("lvm")
			if ds == nil || ds.Healthy || ds.Reason != v1alpha1.DiskDuplicateVolumeGroup || ds.Failed() {
				t.Errorf("disk whose group lvm2 finds twice: %+v; want unhealthy, reason %s, not failed", ds, v1alpha1.DiskDuplicateVolumeGroup)
			}
		})
	}
}
