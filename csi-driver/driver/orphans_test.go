package driver

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/informers"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/component-base/metrics/testutil"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/csi-driver/backend"
	"github.com/diskfit/diskfit/csi-driver/internal/testdisk"
	"github.com/diskfit/diskfit/csi-driver/kube"
)

const orphanGrace = 10 * time.Minute

// orphanEnv is a driver on a real XFS disk whose orphan sweep asks a
// kube.OrphanFinder backed by fake API clients.
type orphanEnv struct {
	*env
	dynamic *dynamicfake.FakeDynamicClient
	// stopPVs stops the PV and VolumeSnapshotContent informers; the PV
	// cache then lags the API.
	stopPVs context.CancelFunc
	// mu guards e.d, which the informers' handlers read, against
	// runDriver replacing it.
	mu sync.Mutex
}

// driver returns the driver the informers tell of PVs and contents.
func (e *orphanEnv) driver() *Driver {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.d
}

// runDriver is runDriver for e.
func (e *orphanEnv) runDriver(t *testing.T, cfg Config) context.Context {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	return runDriver(t, e.env, e.ctx, cfg)
}

func newOrphanEnv(t *testing.T, startInformer bool, snapshotContents ...*unstructured.Unstructured) *orphanEnv {
	t.Helper()
	e := &orphanEnv{env: newEnv(t, []testDisk{{name: "only", fsType: "xfs", size: 4 * gi}}, nil)}
	objs := make([]runtime.Object, 0, len(snapshotContents))
	for _, c := range snapshotContents {
		objs = append(objs, c)
	}
	e.dynamic = dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{kube.VolumeSnapshotContents: "VolumeSnapshotContentList"}, objs...)
	// The snapshot CRDs are installed.
	e.kube.Resources = []*metav1.APIResourceList{{GroupVersion: kube.VolumeSnapshotContents.GroupVersion().String(),
		APIResources: []metav1.APIResource{{Name: kube.VolumeSnapshotContents.Resource, Kind: "VolumeSnapshotContent"}}}}
	factory := informers.NewSharedInformerFactory(e.kube, 0)
	finder, err := kube.NewOrphanFinder(e.kube, e.dynamic, factory, testNode)
	if err != nil {
		t.Fatal(err)
	}
	// As diskfit-csi wires it: every PV and every VolumeSnapshotContent
	// the informers see counts.
	if err := finder.OnVolumeHandle(func(handle string) { e.driver().VolumeReferenced(e.ctx, handle) }); err != nil {
		t.Fatal(err)
	}
	if err := finder.OnSnapshotHandle(func(handle string) { e.driver().SnapshotReferenced(e.ctx, handle) }); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(e.ctx)
	e.stopPVs = cancel
	var contents sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		factory.Shutdown()
		contents.Wait()
	})
	if startInformer {
		factory.Start(ctx.Done())
		factory.WaitForCacheSync(ctx.Done())
		contents.Go(func() { finder.RunContentInformer(ctx) })
		// The fake client sends a watch only what is made after it.
		if err := waitFor(ctx, func() (bool, error) { return watching(e.dynamic, kube.VolumeSnapshotContents.Resource), nil }); err != nil {
			t.Fatal("the VolumeSnapshotContent informer never watched")
		}
	}
	e.d.cfg.Orphans = finder
	e.d.cfg.OrphanGracePeriod = orphanGrace
	return e
}

// watching tells whether c was asked to watch resource.
func watching(c *dynamicfake.FakeDynamicClient, resource string) bool {
	for _, a := range c.Actions() {
		if a.GetVerb() == "watch" && a.GetResource().Resource == resource {
			return true
		}
	}
	return false
}

// refs returns the Refs the record of a volume on the only disk holds.
func (e *orphanEnv) refs(t *testing.T, id string) backend.Refs {
	t.Helper()
	return e.refsOf(t, e.d.volumeRefs(), id)
}

// refsOf returns the Refs the record of a volume or snapshot on the only
// disk holds.
func (e *orphanEnv) refsOf(t *testing.T, kind refKind, id string) backend.Refs {
	t.Helper()
	_, key, err := parseID(kind.name, id)
	if err != nil {
		t.Fatal(err)
	}
	_, refs, err := kind.get(e.ctx, e.d.disk("only"), key)
	if err != nil {
		t.Fatal(err)
	}
	return refs
}

// addPV adds a PV naming handle without node affinity, as one made by hand
// may be.
func (e *orphanEnv) addPV(t *testing.T, name, driver, handle string) {
	t.Helper()
	e.createPV(t, csiPV(name, driver, handle))
}

// addPVOn adds a PV of this driver on disk "only" of node, with the node
// affinity external-provisioner gives it.
func (e *orphanEnv) addPVOn(t *testing.T, name, handle, node string) {
	t.Helper()
	pv := csiPV(name, diskfit.DriverName, handle)
	pv.Spec.CSI.VolumeAttributes = map[string]string{diskfit.VolumeContextDiskKey: "only"}
	pv.Spec.NodeAffinity = &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
		MatchExpressions: []corev1.NodeSelectorRequirement{{Key: diskfit.TopologyKey, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
	}}}}
	e.createPV(t, pv)
}

func csiPV(name, driver, handle string) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PersistentVolumeSpec{
		PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: handle}}}}
}

func (e *orphanEnv) createPV(t *testing.T, pv *corev1.PersistentVolume) {
	t.Helper()
	if _, err := e.kube.CoreV1().PersistentVolumes().Create(e.ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// waitForPVCache waits until the PV informer has seen n PVs.
func (e *orphanEnv) waitForPVCache(t *testing.T, n int) {
	t.Helper()
	finder := e.d.cfg.Orphans.(*kube.OrphanFinder)
	if err := waitFor(e.ctx, func() (bool, error) { return finder.CachedPVs() == n, nil }); err != nil {
		t.Fatalf("the PV cache never held %d PVs", n)
	}
}

// snapshotContent is a VolumeSnapshotContent naming handle in its status
// (a snapshot the driver made) or in its spec (a pre-provisioned one).
func snapshotContent(name, handle string, preProvisioned bool) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
		"metadata": map[string]any{"name": name},
		"spec":     map[string]any{"driver": diskfit.DriverName, "source": map[string]any{"volumeHandle": "only:pvc-x"}},
	}}
	if preProvisioned {
		_ = unstructured.SetNestedField(u.Object, map[string]any{"snapshotHandle": handle}, "spec", "source")
	} else {
		_ = unstructured.SetNestedField(u.Object, handle, "status", "snapshotHandle")
	}
	return u
}

func (e *orphanEnv) snapshot(t *testing.T, name, volumeID string) {
	t.Helper()
	if _, err := e.d.CreateSnapshot(e.ctx, &csi.CreateSnapshotRequest{Name: name, SourceVolumeId: volumeID}); err != nil {
		t.Fatal(err)
	}
}

// remaining lists the IDs of the volumes and snapshots left.
func (e *orphanEnv) remaining(t *testing.T) []string {
	t.Helper()
	vols, err := e.d.ListVolumes(e.ctx, &csi.ListVolumesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	snaps, err := e.d.ListSnapshots(e.ctx, &csi.ListSnapshotsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, v := range vols.Entries {
		ids = append(ids, v.Volume.VolumeId)
	}
	for _, s := range snaps.Entries {
		ids = append(ids, "snapshot "+s.Snapshot.SnapshotId)
	}
	slices.Sort(ids)
	return ids
}

func (e *orphanEnv) removed(t *testing.T) map[string]float64 {
	t.Helper()
	got := map[string]float64{}
	for _, kind := range []string{orphanVolume, orphanSnapshot} {
		v, err := testutil.GetCounterMetricValue(e.d.diskMetrics.orphansRemoved.WithLabelValues(kind))
		if err != nil {
			t.Fatal(err)
		}
		got[kind] = v
	}
	return got
}

// TestOrphanSweep makes one volume or snapshot for each case of the sweep
// on one disk and sweeps twice, a grace period apart: the first sweep
// finds what has no PV or content, the second removes what never had one.
// Exactly the volumes and snapshots that never had their API object go,
// they are counted, and the DiskNode reports the volumes without a PV.
// Above all, a volume whose PV existed and was deleted (reclaim policy
// Retain, then the PV deleted by an admin) is kept.
func TestOrphanSweep(t *testing.T) {
	e := newOrphanEnv(t, true,
		snapshotContent("content-bound", "only:snap-bound", false),
		snapshotContent("content-preprovisioned", "only:snap-preprovisioned", true))
	create := func(name string) string { return e.mustCreate(t, createReq(name, 300*mi)).VolumeId }

	// CreateVolume succeeded but no PV was ever made (the PVC was deleted
	// while it was provisioned).
	create("pvc-never-bound")
	// The PV existed (for a moment only: no sweep saw it) and was deleted
	// without DeleteVolume, as deleting a Released PV with reclaim policy
	// Retain does.
	retained := create("pvc-retained")
	e.addPV(t, "pv-retained", diskfit.DriverName, retained)
	if err := waitFor(e.ctx, func() (bool, error) { return !e.refs(t, retained).NeverReferenced, nil }); err != nil {
		t.Fatalf("the PV informer never recorded the PV of %s", retained)
	}
	if err := e.kube.CoreV1().PersistentVolumes().Delete(e.ctx, "pv-retained", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// A PV of another driver with the same handle is not this volume's.
	e.addPV(t, "pv-other-driver", "other.csi.example.com", create("pvc-other-driver"))
	// Bound volumes, one known to the informer, one made while it lagged.
	bound := create("pvc-bound")
	e.addPV(t, "pv-bound", diskfit.DriverName, bound)
	e.waitForPVCache(t, 2)
	e.stopPVs()
	e.addPV(t, "pv-late", diskfit.DriverName, create("pvc-late-pv"))
	// Staged on this node: only a PV's volume is, whatever the API says.
	attached := create("pvc-attached")
	e.stage(t, attached, mountCap())
	// Snapshots with and without their content.
	e.snapshot(t, "snap-orphan", bound)
	e.snapshot(t, "snap-bound", bound)
	e.snapshot(t, "snap-preprovisioned", bound)

	first := time.Now()
	e.d.now = func() time.Time { return first }
	e.d.sweepOrphans(e.ctx)
	create("pvc-young")
	e.snapshot(t, "snap-young", bound)
	e.d.now = func() time.Time { return first.Add(orphanGrace + time.Second) }
	e.d.sweepOrphans(e.ctx)

	want := []string{"only:pvc-attached", "only:pvc-bound", "only:pvc-late-pv", "only:pvc-retained", "only:pvc-young",
		"snapshot only:snap-bound", "snapshot only:snap-preprovisioned", "snapshot only:snap-young"}
	if got := e.remaining(t); !slices.Equal(got, want) {
		t.Errorf("after the sweeps:\n got  %v\n want %v", got, want)
	}
	if got, want := e.removed(t), map[string]float64{orphanVolume: 2, orphanSnapshot: 1}; !maps.Equal(got, want) {
		t.Errorf("diskfit_orphans_removed_total %v, want %v", got, want)
	}
	for _, gone := range []string{"pvc-never-bound", "pvc-other-driver"} {
		for _, suffix := range []string{".json", ".img"} {
			if files, _ := filepath.Glob(filepath.Join(e.paths["only"], "diskfit", "volumes", gone+suffix)); len(files) != 0 {
				t.Errorf("files of the removed volume left: %v", files)
			}
		}
	}
	e.d.publish(e.ctx)
	dn, err := e.diskfit.DiskfitV1alpha1().DiskNodes().Get(e.ctx, testNode, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st := dn.Status.Disk("only")
	if st.VolumeCount != 5 {
		t.Errorf("DiskNode counts %d volumes, want the 5 left", st.VolumeCount)
	}
	// The volumes without a PV are no room for the scheduler to hand out.
	if want := st.FreeBytes + int64(st.VolumeCount-st.VolumesWithoutPV)*300*mi; st.CapacityBytes != want {
		t.Errorf("DiskNode capacity %d, want free space plus the volumes with a PV, %d", st.CapacityBytes, want)
	}
	// The retained volume, the staged one (kept, but the API has no PV
	// for it), the one whose PV the stopped cache never saw, and the young
	// one whose PV does not exist yet.
	var handles []string
	for _, w := range st.WithoutPV {
		handles = append(handles, w.VolumeHandle)
		if w.VolumeHandle == retained && (w.NeverHadPV || w.Claim != "" || !w.Since.Time.Equal(first.UTC().Truncate(time.Second))) {
			t.Errorf("the retained volume is reported as %+v", w)
		}
	}
	slices.Sort(handles)
	if want := []string{"only:pvc-attached", "only:pvc-late-pv", "only:pvc-retained", "only:pvc-young"}; !slices.Equal(handles, want) ||
		st.VolumesWithoutPV != 4 || st.BytesWithoutPV != 4*300*mi {
		t.Errorf("DiskNode reports %d volumes (%d bytes) without a PV: %v; want %v", st.VolumesWithoutPV, st.BytesWithoutPV, handles, want)
	}
	// Much later, the young volume and snapshot, which never got their
	// API objects, are gone; the retained and the staged volumes are
	// still there, however long they have been without a PV.
	e.d.now = func() time.Time { return first.Add(100 * orphanGrace) }
	e.d.sweepOrphans(e.ctx)
	e.d.sweepOrphans(e.ctx)
	want = slices.DeleteFunc(want, func(id string) bool { return strings.Contains(id, "young") })
	if got := e.remaining(t); !slices.Equal(got, want) {
		t.Errorf("after later sweeps:\n got  %v\n want %v", got, want)
	}
}

// TestOrphanSweepKeepsSnapshotWhoseContentWasRetained: a VolumeSnapshot of
// a class with deletionPolicy Retain gets its VolumeSnapshotContent, the
// snapshotter records the snapshot's handle in it, and before the next
// sweep an admin deletes the VolumeSnapshot and the content, to import the
// snapshot again later as a pre-provisioned content. No sweep ever saw
// the content, but the driver was told of it: the snapshot, a backup, is
// kept however long it is without a content. A snapshot that never had
// one goes after the grace period.
func TestOrphanSweepKeepsSnapshotWhoseContentWasRetained(t *testing.T) {
	e := newOrphanEnv(t, true)
	vol := e.mustCreate(t, createReq("pvc-src", 300*mi)).VolumeId
	e.addPV(t, "pv-src", diskfit.DriverName, vol)
	e.snapshot(t, "snap-retained", vol)
	e.snapshot(t, "snap-never", vol)
	const retained = "only:snap-retained"

	first := time.Now()
	e.d.now = func() time.Time { return first }
	e.d.sweepOrphans(e.ctx)

	// snapshot-controller makes the content; the snapshotter, once
	// CreateSnapshot answered, records the handle in its status.
	contents := e.dynamic.Resource(kube.VolumeSnapshotContents)
	content := snapshotContent("content-retained", retained, false)
	_ = unstructured.SetNestedField(content.Object, "Retain", "spec", "deletionPolicy")
	withoutHandle := content.DeepCopy()
	unstructured.RemoveNestedField(withoutHandle.Object, "status")
	if _, err := contents.Create(e.ctx, withoutHandle, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := contents.Update(e.ctx, content, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := waitFor(e.ctx, func() (bool, error) { return !e.refsOf(t, e.d.snapshotRefs(), retained).NeverReferenced, nil }); err != nil {
		t.Errorf("the driver never recorded the VolumeSnapshotContent of %s", retained)
	}
	if err := contents.Delete(e.ctx, "content-retained", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	e.d.now = func() time.Time { return first.Add(orphanGrace + time.Second) }
	e.d.sweepOrphans(e.ctx)
	e.d.now = func() time.Time { return first.Add(100 * orphanGrace) }
	e.d.sweepOrphans(e.ctx)
	e.d.sweepOrphans(e.ctx)
	if got, want := e.remaining(t), []string{vol, "snapshot " + retained}; !slices.Equal(got, want) {
		t.Errorf("after the sweeps:\n got  %v\n want %v", got, want)
	}
	if got, want := e.removed(t), map[string]float64{orphanVolume: 0, orphanSnapshot: 1}; !maps.Equal(got, want) {
		t.Errorf("diskfit_orphans_removed_total %v, want %v", got, want)
	}
}

// TestOrphanSweepKeepsSnapshotWhoseContentIsBeingMade: CreateSnapshot
// answered, but csi-snapshotter has not recorded the handle in the
// VolumeSnapshotContent yet (it restarts in a loop, or backs off longer
// than the grace period). The content names the snapshot's volume as its
// source and no handle: the snapshot is waited for and must be kept.
// Removed, the snapshotter's next CreateSnapshot would take a new one of
// the volume as it is then, and the VolumeSnapshot would read as the
// earlier point in time.
func TestOrphanSweepKeepsSnapshotWhoseContentIsBeingMade(t *testing.T) {
	e := newOrphanEnv(t, true)
	vol := e.mustCreate(t, createReq("pvc-src", 300*mi)).VolumeId
	e.addPV(t, "pv-src", diskfit.DriverName, vol)
	// csi-snapshotter names a snapshot <prefix>-<VolumeSnapshot UID>
	// (the UID without dashes, cut, with --snapshot-name-uuid-length).
	e.snapshot(t, "snapshot-0b5e-41aa", vol)
	e.snapshot(t, "snapshot-7c11d2", vol)
	e.snapshot(t, "snapshot-dead-0001", vol)
	beingMade := func(name, uid string) {
		t.Helper()
		content := snapshotContent(name, "", false)
		unstructured.RemoveNestedField(content.Object, "status")
		_ = unstructured.SetNestedField(content.Object, vol, "spec", "source", "volumeHandle")
		_ = unstructured.SetNestedField(content.Object, uid, "spec", "volumeSnapshotRef", "uid")
		content.SetAnnotations(map[string]string{"snapshot.storage.kubernetes.io/volumesnapshot-being-created": "yes"})
		if _, err := e.dynamic.Resource(kube.VolumeSnapshotContents).Create(e.ctx, content, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	beingMade("content-pending", "0b5e-41aa")
	beingMade("content-cut", "7c11d2ab-0000")
	// Another VolumeSnapshot of the same volume, being made for ever (a
	// failing CreateSnapshot), keeps no snapshot but its own: not the
	// one whose VolumeSnapshot was deleted while it was made.
	beingMade("content-other", "9f00-1234")
	first := time.Now()
	e.d.now = func() time.Time { return first }
	e.d.sweepOrphans(e.ctx)
	e.d.now = func() time.Time { return first.Add(orphanGrace + time.Second) }
	e.d.sweepOrphans(e.ctx)
	e.d.now = func() time.Time { return first.Add(100 * orphanGrace) }
	e.d.sweepOrphans(e.ctx)
	if got, want := e.remaining(t), []string{vol, "snapshot only:snapshot-0b5e-41aa", "snapshot only:snapshot-7c11d2"}; !slices.Equal(got, want) {
		t.Errorf("after the sweeps, with two snapshots' contents still being made:\n got  %v\n want %v", got, want)
	}
	// Without their contents, the snapshots go.
	for _, name := range []string{"content-pending", "content-cut"} {
		if err := e.dynamic.Resource(kube.VolumeSnapshotContents).Delete(e.ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	e.d.sweepOrphans(e.ctx)
	e.d.now = func() time.Time { return first.Add(200 * orphanGrace) }
	e.d.sweepOrphans(e.ctx)
	if got, want := e.remaining(t), []string{vol}; !slices.Equal(got, want) {
		t.Errorf("after the sweeps, the contents gone:\n got  %v\n want %v", got, want)
	}
}

// TestFirstSweepRunsAtStart: the informers' events that arrive before the
// driver is ready are not recorded (it cannot read its disks yet), and a
// VolumeSnapshotContent made while the driver was down (a restart, an
// upgrade) may be deleted again (deletionPolicy Retain, the snapshot to be
// imported later) before the first periodic sweep, half a grace period
// after the start. So the driver sweeps once as soon as it is ready: what
// refers to a volume or snapshot when it starts is recorded then.
func TestFirstSweepRunsAtStart(t *testing.T) {
	e := newOrphanEnv(t, false) // no informer: no event reaches the driver
	vol := e.mustCreate(t, createReq("pvc-src", 300*mi)).VolumeId
	e.addPV(t, "pv-src", diskfit.DriverName, vol)
	e.snapshot(t, "snap-retained", vol)
	const retained = "only:snap-retained"
	if _, err := e.dynamic.Resource(kube.VolumeSnapshotContents).Create(e.ctx,
		snapshotContent("content-retained", retained, false), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg := e.d.cfg
	cfg.Endpoint = "unix://" + filepath.Join(t.TempDir(), "csi.sock")
	cfg.MetricsAddress = freePort(t)
	cfg.OrphanGracePeriod = time.Hour
	e.runDriver(t, cfg)
	_, key, err := parseID(orphanSnapshot, retained)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	if err := waitFor(ctx, func() (bool, error) {
		_, refs, err := e.driver().snapshotRefs().get(ctx, e.driver().disk("only"), key)
		return err == nil && !refs.NeverReferenced, nil
	}); err != nil {
		t.Errorf("the VolumeSnapshotContent of %s, there when the driver started, was not recorded within 10 s (the first periodic sweep comes %s after the start)",
			retained, orphanSweepInterval(cfg.OrphanGracePeriod))
	}
}

// TestOrphanSweepIgnoresPVsOfOtherNodes: volume IDs do not name the node
// and disk names repeat across nodes, so a PV of another node can carry the
// handle of a volume of this one. That happens when CreateVolume succeeded
// here but the provisioner saw an error, and the claim was provisioned again
// on another node under the same name. Such a PV is not this volume's,
// whether the informer or only the API server's list has it: the volume is
// reported without a PV and removed after the grace period. A PV on this
// node, and a PV of this driver without node affinity (made by hand), still
// count.
func TestOrphanSweepIgnoresPVsOfOtherNodes(t *testing.T) {
	e := newOrphanEnv(t, true)
	create := func(name string) string { return e.mustCreate(t, createReq(name, 300*mi)).VolumeId }
	elsewhere := create("pvc-elsewhere")
	e.addPVOn(t, "pv-elsewhere", elsewhere, "node-b")
	here := create("pvc-here")
	e.addPVOn(t, "pv-here", here, testNode)
	byHand := create("pvc-by-hand")
	e.addPV(t, "pv-by-hand", diskfit.DriverName, byHand)
	// The informer hands PVs over in order: once it recorded the last one,
	// it has seen the others.
	if err := waitFor(e.ctx, func() (bool, error) { return !e.refs(t, byHand).NeverReferenced, nil }); err != nil {
		t.Fatalf("the PV informer never recorded the PV of %s", byHand)
	}
	e.waitForPVCache(t, 3)
	// Only the API server's list has this one.
	e.stopPVs()
	elsewhereLate := create("pvc-elsewhere-late")
	e.addPVOn(t, "pv-elsewhere-late", elsewhereLate, "node-b")

	first := time.Now()
	e.d.now = func() time.Time { return first }
	e.d.sweepOrphans(e.ctx)
	e.d.publish(e.ctx)
	dn, err := e.diskfit.DiskfitV1alpha1().DiskNodes().Get(e.ctx, testNode, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st := dn.Status.Disk("only")
	var handles []string
	for _, w := range st.WithoutPV {
		handles = append(handles, w.VolumeHandle)
		if !w.NeverHadPV {
			t.Errorf("%s is reported as having had a PV", w.VolumeHandle)
		}
	}
	slices.Sort(handles)
	if want := []string{elsewhere, elsewhereLate}; !slices.Equal(handles, want) || st.VolumesWithoutPV != 2 || st.BytesWithoutPV != 2*300*mi {
		t.Errorf("DiskNode reports %d volumes (%d bytes) without a PV: %v; want %v", st.VolumesWithoutPV, st.BytesWithoutPV, handles, want)
	}

	e.d.now = func() time.Time { return first.Add(orphanGrace + time.Second) }
	e.d.sweepOrphans(e.ctx)
	if got, want := e.remaining(t), []string{byHand, here}; !slices.Equal(got, want) {
		t.Errorf("after the sweeps:\n got  %v\n want %v", got, want)
	}
	if got, want := e.removed(t), map[string]float64{orphanVolume: 2, orphanSnapshot: 0}; !maps.Equal(got, want) {
		t.Errorf("diskfit_orphans_removed_total %v, want %v", got, want)
	}
}

// TestOrphanSweepRemovesNothingWhenUnsure sweeps a disk holding one volume
// and one snapshot, neither with an API object, twice an hour apart,
// whenever the API cannot say for sure that they are orphans: nothing is
// removed.
func TestOrphanSweepRemovesNothingWhenUnsure(t *testing.T) {
	apiDown := errors.New("the API server is unreachable")
	// The snapshot has its content, so only the volume is in question.
	content := snapshotContent("content", "only:snap-old", false)
	tests := []struct {
		name     string
		setup    func(e *orphanEnv)
		synced   bool
		contents []*unstructured.Unstructured
	}{
		{name: "PV cache not synced", setup: func(*orphanEnv) {}, contents: []*unstructured.Unstructured{content}},
		{name: "listing PVs fails", synced: true, contents: []*unstructured.Unstructured{content}, setup: func(e *orphanEnv) {
			e.kube.PrependReactor("list", "persistentvolumes", func(k8stesting.Action) (bool, runtime.Object, error) { return true, nil, apiDown })
		}},
		{name: "listing VolumeSnapshotContents fails", synced: true, setup: func(e *orphanEnv) {
			// The volume has its PV, so only the snapshot is in question.
			e.addPV(t, "pv", diskfit.DriverName, "only:pvc-old")
			e.dynamic.PrependReactor("list", "volumesnapshotcontents", func(k8stesting.Action) (bool, runtime.Object, error) { return true, nil, apiDown })
		}},
		{name: "grace period 0 removes nothing", synced: true, setup: func(e *orphanEnv) { e.d.cfg.OrphanGracePeriod = 0 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newOrphanEnv(t, tt.synced, tt.contents...)
			vol := e.mustCreate(t, createReq("pvc-old", 300*mi))
			e.snapshot(t, "snap-old", vol.VolumeId)
			tt.setup(e)
			e.d.sweepOrphans(e.ctx)
			e.d.now = func() time.Time { return time.Now().Add(time.Hour) }
			e.d.sweepOrphans(e.ctx)
			if got, want := e.remaining(t), []string{"only:pvc-old", "snapshot only:snap-old"}; !slices.Equal(got, want) {
				t.Errorf("left %v, want %v", got, want)
			}
			if got := e.removed(t); got[orphanVolume]+got[orphanSnapshot] != 0 {
				t.Errorf("counted removals %v", got)
			}
		})
	}
}

// TestOrphanSweepRuns runs the driver with a 1 ms grace period (sweeps
// every second): a volume made without a PV goes on its own, one whose PV
// exists stays, and /metrics counts the removal.
func TestOrphanSweepRuns(t *testing.T) {
	e := newOrphanEnv(t, true)
	e.addPV(t, "pv-bound", diskfit.DriverName, "only:pvc-bound")
	e.waitForPVCache(t, 1)
	cfg := e.d.cfg
	cfg.Endpoint = "unix://" + filepath.Join(t.TempDir(), "csi.sock")
	cfg.MetricsAddress = freePort(t)
	cfg.OrphanGracePeriod = time.Millisecond
	ctx := e.runDriver(t, cfg)
	conn := dial(t, cfg.Endpoint)
	for _, name := range []string{"pvc-bound", "pvc-orphan"} {
		if err := invoke(ctx, conn, createReq(name, 300*mi)); err != nil {
			t.Fatal(err)
		}
	}
	counter := fmt.Sprintf(`diskfit_orphans_removed_total{kind=%q}`, orphanVolume)
	if err := waitFor(ctx, func() (bool, error) { return scrape(t, cfg.MetricsAddress)[counter] == 1, nil }); err != nil {
		t.Fatalf("%s never reached 1: %v", counter, err)
	}
	list, err := csi.NewControllerClient(conn).ListVolumes(ctx, &csi.ListVolumesRequest{})
	if err != nil || len(list.Entries) != 1 || list.Entries[0].Volume.VolumeId != "only:pvc-bound" {
		t.Errorf("volumes left %v, %v; want only:pvc-bound", list, err)
	}
}

// raceFinder answers like the API server at the moment of each call, and
// lets the test run something between the confirming list and the removal.
type raceFinder struct {
	noOtherPVs
	afterConfirm func()
}

func (f *raceFinder) VolumesWithoutPV(_ context.Context, ids []string, confirm bool) ([]string, error) {
	if confirm && f.afterConfirm != nil {
		// The list said "no PV"; before the sweep takes the volume's lock,
		// the provisioner's CreateVolume retry succeeds and it saves the PV.
		f.afterConfirm()
	}
	return ids, nil
}

func (f *raceFinder) SnapshotsWithoutContent(_ context.Context, ids []string) ([]string, error) {
	return nil, nil
}

func (f *raceFinder) DisksOfPVs(string) map[string]int { return nil }

func (f *raceFinder) ClaimWaits(context.Context, string, string, string, string) (bool, error) {
	return false, nil
}
func (f *raceFinder) SnapshotWaits(context.Context, string, string) (bool, error) { return false, nil }

// sweepPastGrace sweeps twice with finder and a one-minute grace period,
// two minutes apart: the first sweep finds what has no API object, the
// second removes it. between runs between the sweeps.
func sweepPastGrace(e *env, finder OrphanFinder, between func()) {
	e.d.cfg.Orphans = finder
	e.d.cfg.OrphanGracePeriod = time.Minute
	first := time.Now()
	e.d.now = func() time.Time { return first }
	e.d.sweepOrphans(e.ctx)
	between()
	e.d.now = func() time.Time { return first.Add(2 * time.Minute) }
	e.d.sweepOrphans(e.ctx)
}

// A volume whose CreateVolume (an idempotent retry of a provisioner that
// could not save its PV for a while) succeeds between the sweep's
// confirming list and the removal is kept: the provisioner is about to
// save a PV naming it.
func TestSweepKeepsWhatCreateVolumeJustReturned(t *testing.T) {
	e := newEnv(t, []testDisk{{name: "only", fsType: "xfs", size: 1 << 30}}, nil)
	req := createReq("pvc-slow", 64<<20)
	vol := e.mustCreate(t, req)
	finder := &raceFinder{}
	retried := false
	sweepPastGrace(e, finder, func() {
		finder.afterConfirm = func() {
			if _, err := e.d.CreateVolume(e.ctx, req); err != nil {
				t.Errorf("retry: %v", err)
			}
			retried = true
		}
	})
	if !retried {
		t.Fatal("no confirm happened")
	}
	if _, _, err := e.d.getVolume(e.ctx, vol.VolumeId); err != nil {
		t.Errorf("CreateVolume just answered success for %s, and the sweep then removed it: %v", vol.VolumeId, err)
	}
}

// snapshotRaceFinder finds no VolumeSnapshotContent for any snapshot and
// runs afterList each time it is asked: a snapshotter's retry landing
// between the sweep's lists and the removal.
type snapshotRaceFinder struct {
	noOtherPVs
	afterList func()
}

func (f *snapshotRaceFinder) VolumesWithoutPV(context.Context, []string, bool) ([]string, error) {
	return nil, nil
}

func (f *snapshotRaceFinder) SnapshotsWithoutContent(_ context.Context, ids []string) ([]string, error) {
	if f.afterList != nil {
		f.afterList()
	}
	return ids, nil
}

func (f *snapshotRaceFinder) DisksOfPVs(string) map[string]int { return nil }

func (f *snapshotRaceFinder) ClaimWaits(context.Context, string, string, string, string) (bool, error) {
	return false, nil
}
func (f *snapshotRaceFinder) SnapshotWaits(context.Context, string, string) (bool, error) {
	return false, nil
}

// A snapshot whose CreateSnapshot (an idempotent retry of a snapshotter
// that could not record the snapshot's handle for a while) succeeds during
// a sweep that found no VolumeSnapshotContent for it is kept: the
// snapshotter is about to record the handle it was just given, and the
// VolumeSnapshot will say ready.
func TestSweepKeepsWhatCreateSnapshotJustReturned(t *testing.T) {
	e := newEnv(t, []testDisk{{name: "only", fsType: "xfs", size: 1 << 30}}, nil)
	vol := e.mustCreate(t, createReq("pvc-src", 64<<20))
	req := &csi.CreateSnapshotRequest{Name: "snapshot-slow", SourceVolumeId: vol.VolumeId}
	snap, err := e.d.CreateSnapshot(e.ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	finder := &snapshotRaceFinder{}
	retried := 0
	sweepPastGrace(e, finder, func() {
		finder.afterList = func() {
			if _, err := e.d.CreateSnapshot(e.ctx, req); err != nil {
				t.Errorf("retry: %v", err)
			}
			retried++
		}
	})
	if retried == 0 {
		t.Fatal("the sweep did not ask about the snapshot")
	}
	restore := createReq("pvc-restored", 64<<20)
	restore.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
		Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.Snapshot.SnapshotId}}}
	if _, err := e.d.CreateVolume(e.ctx, restore); err != nil {
		t.Errorf("CreateSnapshot just answered ready for %s, and the sweep then removed it: restoring it: %v", snap.Snapshot.SnapshotId, err)
	}
}

// TestOrphanSweepKeepsVolumeWhoseClaimStillWaits: CreateVolume succeeded
// but external-provisioner could not save the PV for longer than the grace
// period (the API server unreachable, or diskfit-webhook, which a node's
// PV creation must pass, without a replica), and it saves it only when its
// backoff (up to about 17 minutes) ends. The claim the volume was made for
// still exists and waits for it, so the sweep keeps the volume, data and
// all (for a restore or a clone, the copy): the PV, once saved, must point
// at it. Only a volume whose claim is gone (deleted, or made again under
// another UID) or bound to another PV is removed.
func TestOrphanSweepKeepsVolumeWhoseClaimStillWaits(t *testing.T) {
	const uid = "0b5c3f2e-1111-2222-3333-444455556666"
	selected := testNode
	claimFor := func(e *orphanEnv, name string, uid types.UID, volumeName string) {
		pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: uid,
			Annotations: map[string]string{"volume.kubernetes.io/selected-node": selected}}}
		pvc.Spec.VolumeName = volumeName
		if _, err := e.kube.CoreV1().PersistentVolumeClaims("default").Create(e.ctx, pvc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range []struct {
		name    string
		claim   func(e *orphanEnv)
		apiDown bool // PVs cannot be listed until after the grace period
		kept    bool
	}{
		{name: "claim waits", claim: func(e *orphanEnv) { claimFor(e, "data", uid, "") }, kept: true},
		{name: "claim waits after an API outage", claim: func(e *orphanEnv) { claimFor(e, "data", uid, "") }, apiDown: true, kept: true},
		{name: "claim bound to the volume's PV name", claim: func(e *orphanEnv) { claimFor(e, "data", uid, "pvc-"+uid) }, kept: true},
		// Taken off this node (a reschedule) and scheduled again: no PV
		// of this node's can be made for it any more (diskfit-webhook).
		{name: "claim scheduled to another node", claim: func(e *orphanEnv) {
			selected = "node-b"
			defer func() { selected = testNode }()
			claimFor(e, "data", uid, "")
		}},
		{name: "claim gone", claim: func(*orphanEnv) {}},
		{name: "claim made again", claim: func(e *orphanEnv) { claimFor(e, "data", "another-uid", "") }},
		{name: "claim bound to another PV", claim: func(e *orphanEnv) { claimFor(e, "data", uid, "pv-static") }},
		// Provisioned again on another node, whose PV has the same name.
		{name: "claim bound on another node", claim: func(e *orphanEnv) {
			claimFor(e, "data", uid, "pvc-"+uid)
			e.addPVOn(t, "pvc-"+uid, "only:pvc-"+uid, "node-b")
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newOrphanEnv(t, true)
			var down atomic.Bool
			e.kube.PrependReactor("list", "persistentvolumes", func(k8stesting.Action) (bool, runtime.Object, error) {
				if down.Load() {
					return true, nil, errors.New("the API server is unreachable")
				}
				return false, nil, nil
			})
			tt.claim(e)
			req := createReq("pvc-"+uid, 300*mi)
			req.Parameters = map[string]string{diskfit.PVCNamespaceKey: "default", diskfit.PVCNameKey: "data"}
			vol := e.mustCreate(t, req).VolumeId
			down.Store(tt.apiDown)
			first := time.Now()
			for _, after := range []time.Duration{0, orphanGrace / 2, orphanGrace + time.Minute} {
				e.d.now = func() time.Time { return first.Add(after) }
				e.d.sweepOrphans(e.ctx)
			}
			down.Store(false)
			e.d.now = func() time.Time { return first.Add(orphanGrace + 2*time.Minute) }
			e.d.sweepOrphans(e.ctx)
			if got := slices.Contains(e.remaining(t), vol); got != tt.kept {
				t.Errorf("volume %s kept: %v, want %v", vol, got, tt.kept)
			}
		})
	}
}

// DeleteVolume judges the PVs as the API server has them, not as its
// cache does: external-provisioner calls it once it saw the PV Released,
// which the driver's cache may not have seen yet. The volume of a PV the
// cache still has Bound, and that is Released now, is deleted; so is one
// whose other PV the cache still has and that was deleted. The e2e suite
// met the first: the refusal named the PV being deleted itself.
func TestDeleteVolumeReadsThePVsAgain(t *testing.T) {
	for _, deleteOther := range []bool{false, true} {
		t.Run(fmt.Sprintf("other PV deleted %v", deleteOther), func(t *testing.T) {
			e := newOrphanEnv(t, true)
			id := e.mustCreate(t, createReq("pvc-lag", 300*mi)).VolumeId
			pv := csiPV("pv-lag", diskfit.DriverName, id)
			pv.Spec.PersistentVolumeReclaimPolicy, pv.Status.Phase = corev1.PersistentVolumeReclaimDelete, corev1.VolumeBound
			e.createPV(t, pv)
			other := csiPV("pv-other", diskfit.DriverName, id)
			other.Status.Phase = corev1.VolumeBound
			if deleteOther {
				e.createPV(t, other)
			}
			e.waitForPVCache(t, map[bool]int{false: 1, true: 2}[deleteOther])
			e.stopPVs()
			pv.Status.Phase = corev1.VolumeReleased
			if _, err := e.kube.CoreV1().PersistentVolumes().UpdateStatus(e.ctx, pv, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			if deleteOther {
				if err := e.kube.CoreV1().PersistentVolumes().Delete(e.ctx, other.Name, metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := e.d.DeleteVolume(e.ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil || slices.Contains(e.remaining(t), id) {
				t.Errorf("DeleteVolume for PV %s, Released now, its cache lagging: %v; volume kept: %v", pv.Name, err, slices.Contains(e.remaining(t), id))
			}
		})
	}
}

// DeleteVolume finds the PVs of a volume in the API server, not in its
// cache: a PV the cache never saw (its watch broken or behind, as under an
// overloaded API server) still keeps the volume. Here an admin gave the
// volume to a second claim with a PV of its own while the node's watch
// was down, and then deleted the first claim. Before, DeleteVolume looked
// up the PVs in its cache only and deleted the second claim's data.
func TestDeleteVolumeSeesAPVItsCacheMissed(t *testing.T) {
	e := newOrphanEnv(t, true)
	id := e.mustCreate(t, createReq("pvc-given", 300*mi)).VolumeId
	first := csiPV("pv-first", diskfit.DriverName, id)
	first.Spec.PersistentVolumeReclaimPolicy, first.Status.Phase = corev1.PersistentVolumeReclaimDelete, corev1.VolumeBound
	e.createPV(t, first)
	e.waitForPVCache(t, 1)
	e.stopPVs()
	second := csiPV("pv-second", diskfit.DriverName, id)
	second.Spec.PersistentVolumeReclaimPolicy, second.Status.Phase = corev1.PersistentVolumeReclaimRetain, corev1.VolumeBound
	e.createPV(t, second)
	first.Status.Phase = corev1.VolumeReleased
	if _, err := e.kube.CoreV1().PersistentVolumes().UpdateStatus(e.ctx, first, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err := e.d.DeleteVolume(e.ctx, &csi.DeleteVolumeRequest{VolumeId: id})
	if !slices.Contains(e.remaining(t), id) {
		t.Fatalf("DeleteVolume (%v) deleted the volume PV %s refers to, which its cache had not seen", err, second.Name)
	}
	wantCode(t, err, codes.FailedPrecondition)
	if err != nil && !strings.Contains(err.Error(), second.Name) {
		t.Errorf("the refusal does not name PV %s: %v", second.Name, err)
	}
}

// DeleteVolume deletes a volume only when no PV but those Kubernetes
// deletes it for still refers to it. Two PVs can name one volume: an admin
// who moves a volume to another claim (or namespace) makes a second PV for
// it and may leave the first one's reclaim policy at Delete; deleting the
// first claim then has external-provisioner call DeleteVolume while the
// second PV, and the pod that uses it, still hold the data. The volume is
// kept, with FailedPrecondition naming the PV, for every PV that may still
// be used; it goes when the only PVs left are Released or Failed with
// reclaim policy Delete, or are on another node.
func TestDeleteVolumeKeepsAVolumeAnotherPVRefersTo(t *testing.T) {
	type pv struct {
		phase  corev1.PersistentVolumePhase
		policy corev1.PersistentVolumeReclaimPolicy
		node   string
	}
	for _, tt := range []struct {
		name    string
		pvs     []pv
		deleted bool
	}{
		{"the PV being deleted only", []pv{{corev1.VolumeReleased, corev1.PersistentVolumeReclaimDelete, testNode}}, true},
		{"a PV whose delete failed before", []pv{{corev1.VolumeFailed, corev1.PersistentVolumeReclaimDelete, testNode}}, true},
		{"no PV", nil, true},
		{"another node's PV with the same handle", []pv{
			{corev1.VolumeReleased, corev1.PersistentVolumeReclaimDelete, testNode},
			{corev1.VolumeBound, corev1.PersistentVolumeReclaimRetain, "node-b"},
		}, true},
		{"a second PV bound to a claim", []pv{
			{corev1.VolumeReleased, corev1.PersistentVolumeReclaimDelete, testNode},
			{corev1.VolumeBound, corev1.PersistentVolumeReclaimRetain, testNode},
		}, false},
		{"a second PV bound, reclaim policy Delete", []pv{
			{corev1.VolumeReleased, corev1.PersistentVolumeReclaimDelete, testNode},
			{corev1.VolumeBound, corev1.PersistentVolumeReclaimDelete, testNode},
		}, false},
		{"a second PV available", []pv{
			{corev1.VolumeReleased, corev1.PersistentVolumeReclaimDelete, testNode},
			{corev1.VolumeAvailable, corev1.PersistentVolumeReclaimRetain, testNode},
		}, false},
		{"a second PV released and retained", []pv{
			{corev1.VolumeReleased, corev1.PersistentVolumeReclaimDelete, testNode},
			{corev1.VolumeReleased, corev1.PersistentVolumeReclaimRetain, testNode},
		}, false},
		{"a PV just made, no phase yet", []pv{{"", corev1.PersistentVolumeReclaimRetain, ""}}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newOrphanEnv(t, true)
			id := e.mustCreate(t, createReq("pvc-moved", 300*mi)).VolumeId
			var names []string
			for i, p := range tt.pvs {
				name := fmt.Sprintf("pv-%d", i)
				obj := csiPV(name, diskfit.DriverName, id)
				if p.node != "" {
					obj.Spec.NodeAffinity = &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
						MatchExpressions: []corev1.NodeSelectorRequirement{{Key: diskfit.TopologyKey, Operator: corev1.NodeSelectorOpIn, Values: []string{p.node}}},
					}}}}
				}
				obj.Spec.PersistentVolumeReclaimPolicy = p.policy
				obj.Status.Phase = p.phase
				e.createPV(t, obj)
				names = append(names, name)
			}
			e.waitForPVCache(t, len(tt.pvs))
			_, err := e.d.DeleteVolume(e.ctx, &csi.DeleteVolumeRequest{VolumeId: id})
			kept := slices.Contains(e.remaining(t), id)
			switch {
			case tt.deleted && (err != nil || kept):
				t.Errorf("DeleteVolume: %v; volume kept: %v; want it deleted", err, kept)
			case !tt.deleted && !kept:
				t.Errorf("DeleteVolume (%v) deleted the volume while PV %s still refers to it", err, names[len(names)-1])
			case !tt.deleted:
				wantCode(t, err, codes.FailedPrecondition)
				if err != nil && !strings.Contains(err.Error(), names[len(names)-1]) {
					t.Errorf("the refusal does not name the PV %s: %v", names[len(names)-1], err)
				}
				if len(tt.pvs) < 2 {
					return
				}
				// The deletion is called off: the PV that asked for it is
				// Retain, and once the other PV is gone (an admin gives the
				// volume to yet another claim) no retry deletes the data.
				got, err := e.kube.CoreV1().PersistentVolumes().Get(e.ctx, names[0], metav1.GetOptions{})
				if err != nil || got.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimRetain {
					t.Errorf("PV %s, whose deletion was refused: %v, reclaim policy %q; want Retain", names[0], err, got.Spec.PersistentVolumeReclaimPolicy)
				}
				if err := e.kube.CoreV1().PersistentVolumes().Delete(e.ctx, names[1], metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
				e.waitForPVCache(t, 1)
				_, err = e.d.DeleteVolume(e.ctx, &csi.DeleteVolumeRequest{VolumeId: id})
				if !slices.Contains(e.remaining(t), id) {
					t.Errorf("the provisioner's retry (%v), after PV %s was deleted, deleted the volume whose deletion was refused", err, names[1])
				}
			}
		})
	}
}

// TestDeleteSnapshotKeepsASnapshotAnotherContentRefersTo: an admin shares
// a snapshot with another namespace the documented way, a pre-provisioned
// VolumeSnapshotContent with the same snapshot handle. Its first owner
// deletes their VolumeSnapshot, whose content (deletionPolicy Delete) has
// the snapshotter call DeleteSnapshot while the other content still
// refers to the snapshot: restores from it would find nothing. The
// snapshot is kept, FailedPrecondition naming the other content, and the
// deletion is called off for good: the content that asked for it gets
// deletionPolicy Retain, so that the snapshotter lets it go without a
// retry. Once no other content refers to it, the snapshot goes.
func TestDeleteSnapshotKeepsASnapshotAnotherContentRefersTo(t *testing.T) {
	for _, tt := range []struct {
		name    string
		others  []*unstructured.Unstructured
		deleted bool
	}{
		{"the content being deleted only", nil, true},
		{"a pre-provisioned content", []*unstructured.Unstructured{snapshotContent("content-shared", "only:snap", true)}, false},
		{"a second content made for it", []*unstructured.Unstructured{snapshotContent("content-shared", "only:snap", false)}, false},
		{"a content of another snapshot", []*unstructured.Unstructured{snapshotContent("content-other", "only:snap-other", true)}, true},
		// kubectl delete of a content whose VolumeSnapshot still exists:
		// it stays, held by its finalizer, and usable; the snapshotter
		// deletes only a content its VolumeSnapshot's deletion marked.
		{"a content deleted by hand, its VolumeSnapshot still there", []*unstructured.Unstructured{deletedByHand("content-shared", "only:snap")}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			deleting := deletedByHand("content-deleting", "only:snap")
			deleting.SetAnnotations(map[string]string{"snapshot.storage.kubernetes.io/volumesnapshot-being-deleted": "yes"})
			e := newOrphanEnv(t, true, append([]*unstructured.Unstructured{deleting}, tt.others...)...)
			vol := e.mustCreate(t, createReq("pvc-src", 300*mi)).VolumeId
			e.snapshot(t, "snap", vol)

			_, err := e.d.DeleteSnapshot(e.ctx, &csi.DeleteSnapshotRequest{SnapshotId: "only:snap"})
			kept := slices.Contains(e.remaining(t), "snapshot only:snap")
			switch {
			case tt.deleted && (err != nil || kept):
				t.Fatalf("DeleteSnapshot: %v; snapshot kept: %v; want it deleted", err, kept)
			case tt.deleted:
				return
			case !kept:
				t.Fatalf("DeleteSnapshot (%v) deleted the snapshot while VolumeSnapshotContent content-shared still refers to it", err)
			}
			wantCode(t, err, codes.FailedPrecondition)
			if err != nil && !strings.Contains(err.Error(), "content-shared") {
				t.Errorf("the refusal does not name content-shared: %v", err)
			}
			contents := e.dynamic.Resource(kube.VolumeSnapshotContents)
			got, err := contents.Get(e.ctx, "content-deleting", metav1.GetOptions{})
			if policy, _, _ := unstructured.NestedString(got.Object, "spec", "deletionPolicy"); err != nil || policy != "Retain" {
				t.Errorf("content-deleting, whose deletion was refused: %v, deletionPolicy %q; want Retain", err, policy)
			}
			if err := contents.Delete(e.ctx, "content-shared", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			// The deletion was called off; the snapshot goes only when
			// some content asks for it again, none other refers to it.
			_ = unstructured.SetNestedField(got.Object, "Delete", "spec", "deletionPolicy")
			if _, err := contents.Update(e.ctx, got, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			if _, err := e.d.DeleteSnapshot(e.ctx, &csi.DeleteSnapshotRequest{SnapshotId: "only:snap"}); err != nil {
				t.Errorf("DeleteSnapshot once no other content refers to it: %v", err)
			}
			if slices.Contains(e.remaining(t), "snapshot only:snap") {
				t.Error("the snapshot is kept once no other content refers to it")
			}
		})
	}
}

// deletedByHand is a content of a VolumeSnapshot, bound, deletionPolicy
// Delete, with a deletion timestamp that its VolumeSnapshot's deletion did
// not cause (no volumesnapshot-being-deleted annotation).
func deletedByHand(name, handle string) *unstructured.Unstructured {
	c := snapshotContent(name, handle, false)
	_ = unstructured.SetNestedField(c.Object, "Delete", "spec", "deletionPolicy")
	_ = unstructured.SetNestedMap(c.Object, map[string]any{"name": "snap-" + name, "namespace": "ns", "uid": "uid-snap-" + name}, "spec", "volumeSnapshotRef")
	c.SetDeletionTimestamp(&metav1.Time{Time: time.Now()})
	c.SetFinalizers([]string{"snapshot.storage.kubernetes.io/volumesnapshotcontent-bound-protection"})
	return c
}

// TestPVSeenWhileItsDiskIsDownCounts: a PV the informer sees while its
// volume's disk cannot be read (not mounted yet after a boot, held by the
// driver being replaced) still counts once the disk starts. A restore
// provisioned then, its PV deleted with Retain before the disk came back
// and the next sweep looked, would otherwise read as never referenced,
// and be removed one grace period later, its data with it.
func TestPVSeenWhileItsDiskIsDownCounts(t *testing.T) {
	e := newOrphanEnv(t, false)
	vol := e.mustCreate(t, createReq("pvc-x", 300*mi)).VolumeId
	dk := e.d.disk("only")
	path := e.paths["only"]
	dev := testdisk.Source(path)
	if err := dk.backend.Close(); err != nil {
		t.Fatal(err)
	}
	testdisk.Run(t, "umount", path)
	if err := dk.start(e.ctx); err == nil {
		t.Fatal("the disk started unmounted: this test shows nothing")
	}
	e.d.VolumeReferenced(e.ctx, vol)
	testdisk.Run(t, "mount", dev, path)
	// The disk starts while a clone of the volume holds its lock: the
	// status refresh neither waits for the lock nor reads the disk as
	// not answering.
	_, key, err := parseID(orphanVolume, vol)
	if err != nil {
		t.Fatal(err)
	}
	unlock, err := e.d.locks.lock(e.ctx, "volume/"+key)
	if err != nil {
		t.Fatal(err)
	}
	e.d.cfg.DiskStatusTimeout = time.Second
	for range 2 {
		if ds := e.d.observe(e.ctx, true).Disk("only"); ds == nil || !ds.Healthy {
			t.Fatalf("the disk, started while a volume's lock is held: %+v; want healthy", ds)
		}
	}
	unlock()
	// The sweep records it before it judges anything of the disk.
	first := time.Now()
	e.d.now = func() time.Time { return first }
	e.d.sweepOrphans(e.ctx)
	if refs := e.refs(t, vol); refs.NeverReferenced {
		t.Errorf("the volume whose PV was seen while its disk was down reads as never referenced: %+v", refs)
	}
	// Remembered just as the disk started (the event handler saw it down
	// a moment before): recorded by the next sweep.
	other := e.mustCreate(t, createReq("pvc-y", 300*mi)).VolumeId
	e.d.late.add(orphanVolume, "only", other)
	e.d.sweepOrphans(e.ctx)
	if refs := e.refs(t, other); refs.NeverReferenced {
		t.Errorf("a reference remembered as the disk started is never recorded: %+v", refs)
	}
}
