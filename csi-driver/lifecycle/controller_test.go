package lifecycle

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2/ktesting"
	testingclock "k8s.io/utils/clock/testing"

	dffake "github.com/diskfit/diskfit/apis/client/clientset/versioned/fake"
	dfinformers "github.com/diskfit/diskfit/apis/client/informers/externalversions"
	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
	"github.com/diskfit/diskfit/csi-driver/lifecycle/lifecycletest"
)

const (
	gi          = int64(1) << 30
	plainClass  = "diskfit"
	optInClass  = "diskfit-release"
	nodeGrace   = 2 * time.Minute
	diskGrace   = 10 * time.Minute
	statusAge   = 2 * time.Minute
	testTimeout = 10 * time.Second
)

// env is a controller on fake clients, driven pass by pass on a fake clock.
type env struct {
	t      *testing.T
	ctx    context.Context
	c      *Controller
	client *k8sfake.Clientset
	df     *dffake.Clientset
	clock  *testingclock.FakeClock
	rec    *recorder
	// silent holds the nodes whose driver stopped reporting: step does
	// not refresh their DiskNodes.
	silent map[string]bool
}

// recorder keeps the events the controller emits.
type recorder struct {
	mu     sync.Mutex
	events []string // "object reason note"
}

func (r *recorder) Eventf(regarding, _ runtime.Object, eventType, reason, _ string, note string, args ...interface{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	name := regarding.(metav1.Object).GetName()
	r.events = append(r.events, name+" "+eventType+" "+reason+" "+fmtNote(note, args...))
}

func fmtNote(note string, args ...interface{}) string {
	if len(args) == 1 {
		if s, ok := args[0].(string); ok && note == "%s" {
			return s
		}
	}
	return note
}

// of returns the events about the named object.
func (r *recorder) of(name string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, e := range r.events {
		if strings.HasPrefix(e, name+" ") {
			out = append(out, e)
		}
	}
	return out
}

var _ events.EventRecorder = &recorder{}

func newEnv(t *testing.T, objs []runtime.Object, dns ...*v1alpha1.DiskNode) *env {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	objs = append(objs,
		&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: plainClass}, Provisioner: diskfit.DriverName},
		&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: optInClass}, Provisioner: diskfit.DriverName,
			Parameters: map[string]string{diskfit.OnDiskLossAnnotation: diskfit.OnDiskLossRelease}})
	e := &env{t: t, ctx: ctx, clock: testingclock.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)), rec: &recorder{}, silent: map[string]bool{}}
	var dnObjs []runtime.Object
	for _, dn := range dns {
		dn.Status.ObservedTime = metav1.NewTime(e.clock.Now())
		dnObjs = append(dnObjs, dn)
	}
	e.client = k8sfake.NewClientset(objs...)
	lifecycletest.ProtectClaims(e.client)
	e.df = dffake.NewSimpleClientset(dnObjs...)
	factory := informers.NewSharedInformerFactory(e.client, 0)
	dfFactory := dfinformers.NewSharedInformerFactory(e.df, 0)
	c, err := New(e.client, e.df, factory, dfFactory, e.rec, Options{
		NodeLossGrace: nodeGrace, DiskFailureGrace: diskGrace, StatusMaxAge: statusAge, Interval: time.Hour, Clock: e.clock,
	})
	if err != nil {
		t.Fatal(err)
	}
	e.c = c
	factory.Start(ctx.Done())
	dfFactory.Start(ctx.Done())
	t.Cleanup(func() {
		cancel()
		factory.Shutdown()
		dfFactory.Shutdown()
	})
	for _, synced := range c.synced {
		if err := wait.PollUntilContextTimeout(ctx, time.Millisecond, testTimeout, true, func(context.Context) (bool, error) { return synced(), nil }); err != nil {
			t.Fatal("caches did not sync")
		}
	}
	return e
}

// step moves the clock on and has every DiskNode report afresh, as the
// drivers do (but those of silent nodes), then runs a pass.
func (e *env) step(d time.Duration) {
	e.t.Helper()
	e.clock.Step(d)
	list, err := e.df.DiskfitV1alpha1().DiskNodes().List(e.ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	for i := range list.Items {
		dn := &list.Items[i]
		if e.silent[dn.Name] {
			continue
		}
		dn.Status.ObservedTime = metav1.NewTime(e.clock.Now())
		e.setDiskNode(dn)
	}
	e.c.Pass(e.ctx)
}

// setDiskNode writes dn and waits until the controller's cache has it.
func (e *env) setDiskNode(dn *v1alpha1.DiskNode) {
	e.t.Helper()
	if _, err := e.df.DiskfitV1alpha1().DiskNodes().UpdateStatus(e.ctx, dn, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(e.ctx, time.Millisecond, testTimeout, true, func(context.Context) (bool, error) {
		got, err := e.c.diskNodes.Get(dn.Name)
		return err == nil && got.Status.ObservedTime.Equal(&dn.Status.ObservedTime) && equalHealth(got, dn), nil
	}); err != nil {
		e.t.Fatalf("DiskNode %s never reached the cache", dn.Name)
	}
}

func equalHealth(a, b *v1alpha1.DiskNode) bool {
	for _, d := range b.Status.Disks {
		if x := a.Status.Disk(d.Name); x == nil || x.Healthy != d.Healthy || x.Reason != d.Reason {
			return false
		}
	}
	return true
}

// setHealthy reports disk of node healthy or not.
func (e *env) setHealthy(node, disk string, healthy bool) {
	e.t.Helper()
	dn, err := e.df.DiskfitV1alpha1().DiskNodes().Get(e.ctx, node, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	d := dn.Status.Disk(disk)
	d.Healthy = healthy
	d.Message = ""
	d.Reason = ""
	if !healthy {
		d.Message = "reading volume directory: input/output error"
	}
	e.setDiskNode(dn)
}

// pvPolicy is pv's reclaim policy, or "deleted".
func pvPolicy(pv *v1.PersistentVolume) string {
	if pv == nil {
		return "deleted"
	}
	return "reclaim policy " + string(pv.Spec.PersistentVolumeReclaimPolicy)
}

func diskNode(name string, disks ...string) *v1alpha1.DiskNode {
	dn := &v1alpha1.DiskNode{ObjectMeta: metav1.ObjectMeta{Name: name}}
	for _, d := range disks {
		dn.Status.Disks = append(dn.Status.Disks, v1alpha1.DiskStatus{Name: d, Backend: v1alpha1.BackendFile, CapacityBytes: 10 * gi, FreeBytes: 10 * gi, Healthy: true})
	}
	return dn
}

func node(name string) *v1.Node { return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}} }

// claim returns a PVC of class bound to a PV on node/disk, and the PV.
func claim(name, class, nodeName, disk string, annotations map[string]string) []runtime.Object {
	pvc := &v1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name), Annotations: annotations}}
	pvc.Spec.StorageClassName = &class
	pvc.Spec.VolumeName = "pv-" + name
	pv := &v1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-" + name, UID: types.UID("uid-pv-" + name)}}
	pv.Spec.Capacity = v1.ResourceList{v1.ResourceStorage: *resource.NewQuantity(gi, resource.BinarySI)}
	pv.Spec.ClaimRef = &v1.ObjectReference{Namespace: "ns", Name: name, UID: pvc.UID}
	pv.Spec.PersistentVolumeReclaimPolicy = v1.PersistentVolumeReclaimDelete
	pv.Spec.CSI = &v1.CSIPersistentVolumeSource{Driver: diskfit.DriverName, VolumeHandle: disk + ":" + name,
		VolumeAttributes: map[string]string{diskfit.VolumeContextDiskKey: disk}}
	pv.Spec.NodeAffinity = &v1.VolumeNodeAffinity{Required: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
		MatchExpressions: []v1.NodeSelectorRequirement{{Key: diskfit.TopologyKey, Operator: v1.NodeSelectorOpIn, Values: []string{nodeName}}},
	}}}}
	return []runtime.Object{pvc, pv}
}

// podUsing is a pod on nodeName mounting claim.
func podUsing(name, claim, nodeName string) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name)},
		Spec: v1.PodSpec{NodeName: nodeName, Volumes: []v1.Volume{{Name: "data", VolumeSource: v1.VolumeSource{
			PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}}},
	}
}

var releaseAnnotation = map[string]string{diskfit.OnDiskLossAnnotation: diskfit.OnDiskLossRelease}

// pvcExists reports whether the claim exists and is not being deleted.
func (e *env) pvcExists(name string) bool {
	e.t.Helper()
	pvc, err := e.client.CoreV1().PersistentVolumeClaims("ns").Get(e.ctx, name, metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		e.t.Fatal(err)
	}
	return err == nil && pvc.DeletionTimestamp == nil
}

func (e *env) pv(name string) *v1.PersistentVolume {
	e.t.Helper()
	pv, err := e.client.CoreV1().PersistentVolumes().Get(e.ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		e.t.Fatal(err)
	}
	return pv
}

func (e *env) podExists(name string) bool {
	e.t.Helper()
	_, err := e.client.CoreV1().Pods("ns").Get(e.ctx, name, metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		e.t.Fatal(err)
	}
	return err == nil
}

// TestFailedDiskReleasesOptedInClaims: a disk that stays unhealthy for the
// grace time has exactly its opted-in claims released (by annotation or
// by their StorageClass, named in spec or in the legacy annotation, an
// annotation "keep" overriding the class): the
// claim and its pod are deleted, the PV stays with reclaim policy Retain.
// Every claim on the disk is told when it fails, and what comes next.
func TestFailedDiskReleasesOptedInClaims(t *testing.T) {
	var objs []runtime.Object
	objs = append(objs, node("n1"))
	objs = append(objs, claim("annotated", plainClass, "n1", "d0", releaseAnnotation)...)
	objs = append(objs, claim("by-class", optInClass, "n1", "d0", nil)...)
	// The class in the legacy annotation, which the provisioner reads first.
	legacy := claim("by-legacy-class", "", "n1", "d0", map[string]string{diskfit.BetaStorageClassAnnotation: optInClass})
	legacy[0].(*v1.PersistentVolumeClaim).Spec.StorageClassName = nil
	objs = append(objs, legacy...)
	objs = append(objs, claim("kept-by-annotation", optInClass, "n1", "d0", map[string]string{diskfit.OnDiskLossAnnotation: diskfit.OnDiskLossKeep})...)
	objs = append(objs, claim("not-opted-in", plainClass, "n1", "d0", nil)...)
	objs = append(objs, claim("healthy-disk", plainClass, "n1", "d1", releaseAnnotation)...)
	objs = append(objs, podUsing("web-0", "annotated", "n1"), podUsing("web-1", "not-opted-in", "n1"))
	e := newEnv(t, objs, diskNode("n1", "d0", "d1"))

	e.c.Pass(e.ctx)
	e.setHealthy("n1", "d0", false)
	e.c.Pass(e.ctx)
	for _, name := range []string{"annotated", "by-class", "by-legacy-class", "kept-by-annotation", "not-opted-in", "web-0", "web-1"} {
		if got := e.rec.of(name); len(got) != 1 || !strings.Contains(got[0], ReasonDiskFailed) || !strings.Contains(got[0], "input/output error") {
			t.Errorf("events of %s = %q, want one %s naming the error", name, got, ReasonDiskFailed)
		}
	}
	if got := e.rec.of("annotated"); len(got) == 1 && !strings.Contains(got[0], "unless the disk recovers by 2026-01-02T03:14:05Z") {
		t.Errorf("event of an opted-in claim = %q, want the time of its release", got[0])
	}
	if got := e.rec.of("not-opted-in"); len(got) == 1 && !strings.Contains(got[0], "annotate it "+diskfit.OnDiskLossAnnotation+"=release") {
		t.Errorf("event of a claim that did not opt in = %q, want what to do", got[0])
	}
	if got := e.rec.of("healthy-disk"); len(got) != 0 {
		t.Errorf("events of a claim on a healthy disk = %q, want none", got)
	}

	e.step(diskGrace - time.Second)
	for _, name := range []string{"annotated", "by-class", "by-legacy-class"} {
		if !e.pvcExists(name) {
			t.Fatalf("claim %s released before the grace time", name)
		}
	}
	e.step(time.Second)
	for _, name := range []string{"annotated", "by-class", "by-legacy-class"} {
		if e.pvcExists(name) {
			t.Errorf("opted-in claim %s on the failed disk: kept, want it released", name)
		}
		pv := e.pv("pv-" + name)
		if pv == nil {
			t.Fatalf("PV of released claim %s deleted, want it kept with its data", name)
		}
		if pv.Spec.PersistentVolumeReclaimPolicy != v1.PersistentVolumeReclaimRetain {
			t.Errorf("PV of released claim %s has reclaim policy %s, want Retain", name, pv.Spec.PersistentVolumeReclaimPolicy)
		}
		if got := e.rec.of("pv-" + name); len(got) != 1 || !strings.Contains(got[0], ReasonReleased) {
			t.Errorf("events of PV %s = %q, want one %s", pv.Name, got, ReasonReleased)
		}
	}
	if e.podExists("web-0") {
		t.Error("pod of a released claim kept, want it deleted so its StatefulSet recreates it")
	}
	for _, name := range []string{"kept-by-annotation", "not-opted-in", "healthy-disk"} {
		if !e.pvcExists(name) {
			t.Errorf("claim %s released, want it kept", name)
		}
		if pv := e.pv("pv-" + name); pv == nil || pv.Spec.PersistentVolumeReclaimPolicy != v1.PersistentVolumeReclaimDelete {
			t.Errorf("PV of kept claim %s changed: %+v", name, pv)
		}
	}
	if !e.podExists("web-1") {
		t.Error("pod of a claim that did not opt in deleted")
	}
	if n := len(e.rec.of("not-opted-in")); n != 1 {
		t.Errorf("a claim that did not opt in got %d events, want the one telling of the failure", n)
	}
}

// TestDiskNotConfiguredReleasesNothing: a node's driver restarted with a
// node config that no longer names a disk its PVs are on (an admin's
// edit) reports the disk unhealthy, NotConfigured, for as long as it
// runs so. That is no failure of the disk, whose data is intact: its
// claims stay, however long it lasts; a config change rolled out to every
// node would otherwise release every replica of a workload at once.
func TestDiskNotConfiguredReleasesNothing(t *testing.T) {
	objs := append([]runtime.Object{node("n1"), podUsing("web-0", "a", "n1")}, claim("a", plainClass, "n1", "d0", releaseAnnotation)...)
	e := newEnv(t, objs, diskNode("n1", "d0"))
	e.c.Pass(e.ctx)
	dn, err := e.df.DiskfitV1alpha1().DiskNodes().Get(e.ctx, "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	*dn.Status.Disk("d0") = v1alpha1.DiskStatus{Name: "d0", Backend: v1alpha1.BackendFile, Reason: v1alpha1.DiskNotConfigured,
		Message: "not served: 1 PersistentVolumes of this node are on disk d0, but the node config has no such disk"}
	e.setDiskNode(dn)
	e.c.Pass(e.ctx)
	e.step(2 * diskGrace)
	if !e.pvcExists("a") || !e.podExists("web-0") {
		t.Error("claim or pod of a disk the node config does not name was released")
	}
	if pv := e.pv("pv-a"); pv == nil || pv.Spec.PersistentVolumeReclaimPolicy != v1.PersistentVolumeReclaimDelete {
		t.Errorf("PV of a disk the node config does not name changed: %+v", pv)
	}
}

// TestDiskAtAnotherPathReleasesNothing: a node rebooted with two disks'
// filesystems at each other's paths (mounted by device names, handed out
// in another order). Its driver serves neither and reports both unhealthy,
// AtAnotherPath. Their data is intact, only the mounts are mixed up: no
// claim is released, however long it lasts (one node is within
// --max-nodes-with-failed-disks, so that brake would not hold it), and
// each opted-in claim is told once why, and what to do. Disk d0 reported
// failed before and AtAnotherPath since does not count as failed either,
// also where the cache still has the failure when the grace time is up:
// the API server's word decides. Once the mounts are put right and a
// disk then fails, its claims are released as usual.
func TestDiskAtAnotherPathReleasesNothing(t *testing.T) {
	objs := []runtime.Object{node("n1"), node("n2"), podUsing("web-0", "a", "n1"), podUsing("web-1", "b", "n1")}
	objs = append(objs, claim("a", plainClass, "n1", "d0", releaseAnnotation)...)
	objs = append(objs, claim("b", optInClass, "n1", "d1", nil)...)
	objs = append(objs, claim("kept", plainClass, "n1", "d1", nil)...)
	e := newEnv(t, objs, diskNode("n1", "d0", "d1"), diskNode("n2", "d0"))
	e.c.Pass(e.ctx)
	e.setHealthy("n1", "d0", false)
	e.step(diskGrace / 2)
	atAnotherPath := func(disk, holder string) {
		t.Helper()
		dn, err := e.df.DiskfitV1alpha1().DiskNodes().Get(e.ctx, "n1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		*dn.Status.Disk(disk) = v1alpha1.DiskStatus{Name: disk, Backend: v1alpha1.BackendFile, Reason: v1alpha1.DiskAtAnotherPath,
			Message: "its volumes are at /mnt/" + disk + ", disk " + holder + "'s path: are disks mounted at each other's paths?"}
		e.setDiskNode(dn)
	}
	atAnotherPath("d0", "d1")
	atAnotherPath("d1", "d0")
	e.c.Pass(e.ctx)
	for i := 0; i < 4; i++ {
		e.step(diskGrace)
	}
	for _, name := range []string{"a", "b", "kept"} {
		if !e.pvcExists(name) {
			t.Errorf("claim %s of a disk mounted at another disk's path released", name)
		}
		if pv := e.pv("pv-" + name); pv == nil || pv.Spec.PersistentVolumeReclaimPolicy != v1.PersistentVolumeReclaimDelete {
			t.Errorf("PV of claim %s of a disk mounted at another disk's path: %v, want it kept with reclaim policy Delete", name, pvPolicy(pv))
		}
	}
	for _, pod := range []string{"web-0", "web-1"} {
		if !e.podExists(pod) {
			t.Errorf("pod %s of a disk mounted at another disk's path deleted", pod)
		}
	}
	for _, name := range []string{"a", "b"} {
		var held []string
		for _, ev := range e.rec.of(name) {
			if strings.Contains(ev, ReasonReleaseHeld) {
				held = append(held, ev)
			}
		}
		if len(held) != 1 || !strings.Contains(held[0], string(v1alpha1.DiskAtAnotherPath)) || !strings.Contains(held[0], "each other's paths") {
			t.Errorf("%s events of claim %s = %q, want one naming %s and the disk's message", ReasonReleaseHeld, name, held, v1alpha1.DiskAtAnotherPath)
		}
	}
	if got := e.rec.of("kept"); slices.ContainsFunc(got, func(ev string) bool { return strings.Contains(ev, ReasonReleaseHeld) }) {
		t.Errorf("events of a claim that did not opt in = %q, want no %s", got, ReasonReleaseHeld)
	}

	// The cache says d0 failed; the API server, asked before a release,
	// says it is at another path.
	e.setHealthy("n1", "d0", true)
	e.step(time.Second)
	e.setHealthy("n1", "d0", false)
	e.c.Pass(e.ctx)
	apiSaysAtAnotherPath := true
	e.df.PrependReactor("get", "disknodes", func(a clienttesting.Action) (bool, runtime.Object, error) {
		if !apiSaysAtAnotherPath || a.(clienttesting.GetActionImpl).Name != "n1" {
			return false, nil, nil
		}
		dn := diskNode("n1", "d0", "d1")
		dn.Status.ObservedTime = metav1.NewTime(e.clock.Now())
		for _, ds := range []*v1alpha1.DiskStatus{dn.Status.Disk("d0"), dn.Status.Disk("d1")} {
			*ds = v1alpha1.DiskStatus{Name: ds.Name, Backend: v1alpha1.BackendFile, Reason: v1alpha1.DiskAtAnotherPath}
		}
		return true, dn, nil
	})
	e.step(diskGrace)
	if !e.pvcExists("a") {
		t.Error("claim a released though the API server says its disk is at another disk's path")
	}
	apiSaysAtAnotherPath = false

	// The mounts put right, d1 fails: its claims go as for any failure.
	e.setHealthy("n1", "d0", true)
	e.setHealthy("n1", "d1", false)
	e.step(time.Second)
	e.step(diskGrace)
	if e.pvcExists("b") {
		t.Error("claim b of a disk that failed once back at its path kept past the grace time")
	}
	if !e.pvcExists("a") || !e.pvcExists("kept") {
		t.Error("claim a or kept released, want them kept")
	}
}

// TestDisksFailingOnManyNodesReleaseNothing: disks fail on more nodes at
// once than MaxNodesWithFailedDisks allows (at least one node): a cause the
// nodes share (a config or driver rolled out to all of them, a bad kernel)
// is far likelier than so many disks failing together, and releasing
// would recreate every replica of a workload empty at once. Nothing is
// released, and each claim due is told why; once failures are back on few
// enough nodes, those disks' claims are released.
func TestDisksFailingOnManyNodesReleaseNothing(t *testing.T) {
	objs := []runtime.Object{node("n1"), node("n2"), node("n3")}
	for _, n := range []string{"n1", "n2"} {
		objs = append(objs, claim("on-"+n, plainClass, n, "d0", releaseAnnotation)...)
	}
	e := newEnv(t, objs, diskNode("n1", "d0"), diskNode("n2", "d0"), diskNode("n3", "d0"))
	e.c.Pass(e.ctx)
	e.setHealthy("n1", "d0", false)
	e.setHealthy("n2", "d0", false)
	e.c.Pass(e.ctx)
	e.step(2 * diskGrace)
	for _, n := range []string{"n1", "n2"} {
		if !e.pvcExists("on-" + n) {
			t.Errorf("claim on-%s released while disks failed on 2 of 3 nodes at once, more than the 1 node allowed", n)
		}
		if got := e.rec.of("on-" + n); !slices.ContainsFunc(got, func(ev string) bool { return strings.Contains(ev, ReasonReleaseHeld) }) {
			t.Errorf("events of on-%s = %q, want one %s", n, got, ReasonReleaseHeld)
		}
	}
	e.setHealthy("n2", "d0", true)
	e.step(time.Second)
	if e.pvcExists("on-n1") {
		t.Error("claim on-n1 kept once disks failed on one node only, past the grace time")
	}
	if !e.pvcExists("on-n2") {
		t.Error("claim on-n2 of a recovered disk released")
	}
}

// TestDisksFailingOnManyNodesWithoutClaimsReleaseNothing: a driver or
// kernel rolled out to every node makes the disks of all 30 nodes report
// failed at once; a 3-replica StatefulSet opted in has its claims on 3 of
// them, within the limit (10% of 30). The other 27 failures, with no claim
// to release, show the cause is shared all the same: nothing is released,
// or every replica is recreated empty at once. Once failures are back on
// few enough nodes, the disks' claims are released.
func TestDisksFailingOnManyNodesWithoutClaimsReleaseNothing(t *testing.T) {
	objs, dns, replicas := thirtyNodes(releaseAnnotation)
	objs = append(objs, claim("kept-on-n4", plainClass, "n4", "d0", nil)...)
	e := newEnv(t, objs, dns...)
	e.c.opts.MaxNodesWithFailedDisks = DefaultMaxNodesWithFailedDisks
	e.c.Pass(e.ctx)
	for _, dn := range dns {
		e.setHealthy(dn.Name, "d0", false)
	}
	e.c.Pass(e.ctx)
	for range 3 {
		e.step(diskGrace)
	}
	for _, name := range replicas {
		if !e.pvcExists(name) {
			t.Errorf("claim %s released while disks failed on all 30 nodes at once, its replicas on 3 of them", name)
		}
		if pv := e.pv("pv-" + name); pv == nil || pv.Spec.PersistentVolumeReclaimPolicy != v1.PersistentVolumeReclaimDelete {
			t.Errorf("PV of claim %s: %v, want it kept with reclaim policy Delete", name, pvPolicy(pv))
		}
		if got := e.rec.of(name); !slices.ContainsFunc(got, func(ev string) bool { return strings.Contains(ev, ReasonReleaseHeld) }) {
			t.Errorf("events of %s = %q, want one %s", name, got, ReasonReleaseHeld)
		}
	}
	for _, dn := range dns[1:] {
		e.setHealthy(dn.Name, "d0", true)
	}
	e.step(time.Second)
	if e.pvcExists("web-0") {
		t.Error("claim web-0 kept once disks failed on one node only, past the grace time")
	}
	for _, name := range []string{"web-1", "web-2", "kept-on-n4"} {
		if !e.pvcExists(name) {
			t.Errorf("claim %s of a recovered disk released", name)
		}
	}
}

// TestAnOldFailureHoldsNoRelease: a disk that failed long ago and has no
// claim left to release (dead, awaiting replacement) does not count
// towards MaxNodesWithFailedDisks once its grace time passed with no
// release held: a disk failing on another node later has its claims
// released as if it were the only one.
func TestAnOldFailureHoldsNoRelease(t *testing.T) {
	objs := []runtime.Object{node("n1"), node("n2"), node("n3")}
	objs = append(objs, claim("kept-on-n1", plainClass, "n1", "d0", nil)...)
	objs = append(objs, claim("on-n2", plainClass, "n2", "d0", releaseAnnotation)...)
	e := newEnv(t, objs, diskNode("n1", "d0"), diskNode("n2", "d0"), diskNode("n3", "d0"))
	e.c.Pass(e.ctx)
	e.setHealthy("n1", "d0", false)
	e.c.Pass(e.ctx) // the controller sees the failure when it happens
	e.step(10 * diskGrace)
	e.setHealthy("n2", "d0", false)
	e.c.Pass(e.ctx)
	e.step(diskGrace)
	if e.pvcExists("on-n2") {
		t.Error("claim on-n2 of a failed disk kept because a disk of n1, with nothing to release, failed long before")
	}
	if !e.pvcExists("kept-on-n1") {
		t.Error("claim kept-on-n1, which did not opt in, released")
	}
}

// TestRecoveredDiskKeepsClaims: a disk healthy again before the grace time
// keeps its claims, which are told it recovered; failing again starts the
// grace time over.
func TestRecoveredDiskKeepsClaims(t *testing.T) {
	objs := append([]runtime.Object{node("n1"), podUsing("web-0", "a", "n1")}, claim("a", plainClass, "n1", "d0", releaseAnnotation)...)
	e := newEnv(t, objs, diskNode("n1", "d0"))
	e.setHealthy("n1", "d0", false)
	e.c.Pass(e.ctx)
	e.step(diskGrace / 2)
	e.setHealthy("n1", "d0", true)
	e.c.Pass(e.ctx)
	for _, name := range []string{"a", "web-0"} {
		if got := e.rec.of(name); len(got) != 2 || !strings.Contains(got[1], ReasonDiskRecovered) {
			t.Errorf("events of %s = %q, want %s then %s", name, got, ReasonDiskFailed, ReasonDiskRecovered)
		}
	}
	e.setHealthy("n1", "d0", false)
	e.c.Pass(e.ctx)
	e.step(diskGrace / 2)
	if !e.pvcExists("a") {
		t.Fatal("claim released a grace time after the disk first failed, though it recovered in between")
	}
	e.step(diskGrace / 2)
	if e.pvcExists("a") {
		t.Error("claim kept a grace time after the disk failed again")
	}
}

// TestSilentNodeReleasesNothing: a node that stopped reporting (its
// DiskNode status is old) says nothing about its disks: a disk it last
// called unhealthy is not released however long the silence lasts, and
// its grace time starts over when it reports again.
func TestSilentNodeReleasesNothing(t *testing.T) {
	objs := append([]runtime.Object{node("n1")}, claim("a", plainClass, "n1", "d0", releaseAnnotation)...)
	e := newEnv(t, objs, diskNode("n1", "d0"))
	e.setHealthy("n1", "d0", false)
	e.c.Pass(e.ctx)
	for range 3 {
		e.clock.Step(diskGrace) // no report
		e.c.Pass(e.ctx)
	}
	if !e.pvcExists("a") {
		t.Fatal("claim released on an old status")
	}
	e.step(time.Second) // reports again: still unhealthy
	e.step(diskGrace - 2*time.Second)
	if !e.pvcExists("a") {
		t.Fatal("claim released before a grace time of fresh reports")
	}
	e.step(2 * time.Second)
	if e.pvcExists("a") {
		t.Error("claim kept a grace time of fresh reports after the disk failed")
	}
}

// TestReleaseNeedsTheAPIServersWord: when the cache says the disk failed
// but the API server's DiskNode says it is healthy, nothing is released.
func TestReleaseNeedsTheAPIServersWord(t *testing.T) {
	objs := append([]runtime.Object{node("n1")}, claim("a", plainClass, "n1", "d0", releaseAnnotation)...)
	e := newEnv(t, objs, diskNode("n1", "d0"))
	e.setHealthy("n1", "d0", false)
	e.c.Pass(e.ctx)
	var reads []metav1.GetOptions
	e.df.PrependReactor("get", "disknodes", func(a clienttesting.Action) (bool, runtime.Object, error) {
		reads = append(reads, a.(clienttesting.GetActionImpl).GetOptions)
		dn := diskNode("n1", "d0")
		dn.Status.ObservedTime = metav1.NewTime(e.clock.Now())
		return true, dn, nil
	})
	e.step(diskGrace)
	if !e.pvcExists("a") {
		t.Error("claim released though the API server says its disk is healthy")
	}
	if len(reads) == 0 {
		t.Fatal("the DiskNode was never read from the API server")
	}
	for _, o := range reads {
		if o.ResourceVersion != "" {
			t.Errorf("DiskNode read with resourceVersion %q, want a quorum read", o.ResourceVersion)
		}
	}
}

// TestReleaseLeavesAReCreatedClaimAlone: the claim to release was made
// anew under its name (its StatefulSet was faster than the controller's
// cache) and a new pod on the same node uses it. Neither is deleted.
func TestReleaseLeavesAReCreatedClaimAlone(t *testing.T) {
	old := claim("a", plainClass, "n1", "d0", releaseAnnotation)
	renewed := old[0].(*v1.PersistentVolumeClaim).DeepCopy()
	renewed.UID = "uid-a-renewed"
	renewed.Spec.VolumeName = "pv-other"
	e := newEnv(t, []runtime.Object{node("n1"), renewed, old[1], podUsing("web-0", "a", "n1")})
	err := ReleaseKeepingData(e.ctx, e.client, Claim{PVC: old[0].(*v1.PersistentVolumeClaim), PV: old[1].(*v1.PersistentVolume)}, "n1")
	if err != nil {
		t.Fatal(err)
	}
	if !e.pvcExists("a") {
		t.Error("the claim made anew was deleted")
	}
	if !e.podExists("web-0") {
		t.Error("the pod of the claim made anew was deleted")
	}
}

// TestInterruptedReleaseIsFinished: the claim's delete went through but
// deleting its pod failed (the API server was briefly unavailable). The
// claim, held by its pod, stays Terminating; the next pass deletes the pod
// so that the StatefulSet can go on.
func TestInterruptedReleaseIsFinished(t *testing.T) {
	objs := append([]runtime.Object{node("n1"), podUsing("web-0", "a", "n1")}, claim("a", plainClass, "n1", "d0", releaseAnnotation)...)
	e := newEnv(t, objs, diskNode("n1", "d0"))
	failed := false
	e.client.PrependReactor("delete", "pods", func(clienttesting.Action) (bool, runtime.Object, error) {
		if failed {
			return false, nil, nil
		}
		failed = true
		return true, nil, apierrors.NewServiceUnavailable("try again")
	})
	e.setHealthy("n1", "d0", false)
	e.c.Pass(e.ctx)
	e.step(diskGrace)
	if !failed || !e.podExists("web-0") {
		t.Fatalf("the first release attempt did not fail on the pod as arranged")
	}
	if err := wait.PollUntilContextTimeout(e.ctx, time.Millisecond, testTimeout, true, func(context.Context) (bool, error) {
		pvc, err := e.c.pvcs.PersistentVolumeClaims("ns").Get("a")
		return err == nil && pvc.DeletionTimestamp != nil, nil
	}); err != nil {
		t.Fatal("the claim being deleted never reached the cache")
	}
	e.step(time.Second)
	if e.podExists("web-0") {
		t.Error("the pod holding a released claim was never deleted: the release stays half done")
	}
}

// TestSilentNodeAheadOfTimeReleasesNothing: a node whose clock runs an
// hour ahead reports its disk unhealthy once and then goes silent. Its
// status looks new by its own clock for an hour, but no new report comes:
// nothing is released.
func TestSilentNodeAheadOfTimeReleasesNothing(t *testing.T) {
	objs := append([]runtime.Object{node("n1")}, claim("a", plainClass, "n1", "d0", releaseAnnotation)...)
	e := newEnv(t, objs, diskNode("n1", "d0"))
	dn, err := e.df.DiskfitV1alpha1().DiskNodes().Get(e.ctx, "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dn.Status.ObservedTime = metav1.NewTime(e.clock.Now().Add(time.Hour))
	dn.Status.Disks[0].Healthy = false
	e.setDiskNode(dn)
	e.c.Pass(e.ctx)
	for range 5 {
		e.clock.Step(diskGrace / 4) // no new report
		e.c.Pass(e.ctx)
	}
	if !e.pvcExists("a") {
		t.Fatal("claim released on one report of a node that went silent")
	}
}

// TestOwnerWhoOptedOutKeepsTheClaim: the owner changed the claim to keep
// after the cache last saw it. The API server's copy decides: the claim and
// its pod stay.
func TestOwnerWhoOptedOutKeepsTheClaim(t *testing.T) {
	objs := append([]runtime.Object{node("n1"), podUsing("web-0", "a", "n1")}, claim("a", plainClass, "n1", "d0", releaseAnnotation)...)
	e := newEnv(t, objs, diskNode("n1", "d0"))
	e.setHealthy("n1", "d0", false)
	e.c.Pass(e.ctx)
	e.client.PrependReactor("get", "persistentvolumeclaims", func(a clienttesting.Action) (bool, runtime.Object, error) {
		obj, err := e.client.Tracker().Get(a.GetResource(), a.GetNamespace(), a.(clienttesting.GetAction).GetName())
		if err != nil {
			return true, nil, err
		}
		pvc := obj.(*v1.PersistentVolumeClaim).DeepCopy()
		pvc.Annotations = map[string]string{diskfit.OnDiskLossAnnotation: diskfit.OnDiskLossKeep}
		return true, pvc, nil
	})
	e.step(diskGrace)
	if !e.pvcExists("a") || !e.podExists("web-0") {
		t.Error("a claim whose owner opted out was released")
	}
}

// thirtyNodes is 30 Nodes n1 to n30 with a DiskNode each, disk d0, and
// the claims of a 3-replica StatefulSet, web-0 to web-2, with annotations,
// on n1 to n3, whose DiskNodes report the volume.
func thirtyNodes(annotations map[string]string) (objs []runtime.Object, dns []*v1alpha1.DiskNode, replicas []string) {
	for i := 1; i <= 30; i++ {
		n := "n" + strconv.Itoa(i)
		objs = append(objs, node(n))
		dns = append(dns, diskNode(n, "d0"))
	}
	for _, dn := range dns[:3] {
		dn.Status.Disks[0].VolumeCount = 1
	}
	replicas = []string{"web-0", "web-1", "web-2"}
	for i, name := range replicas {
		objs = append(objs, claim(name, plainClass, "n"+strconv.Itoa(i+1), "d0", annotations)...)
	}
	return objs, dns, replicas
}
