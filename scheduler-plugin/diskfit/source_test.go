package diskfit

import (
	"context"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/utils/ptr"

	"github.com/diskfit/diskfit/apis/diskfit"
)

// snapshot returns a VolumeSnapshot ns/name bound to a content whose handle
// names disk, labelled with node as snapshot-controller's distributed mode
// does ("" leaves the label out).
func snapshot(name, node, disk string) []runtime.Object {
	snap := &unstructured.Unstructured{Object: map[string]interface{}{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
		"metadata": map[string]interface{}{"namespace": "ns", "name": name},
		"status":   map[string]interface{}{"boundVolumeSnapshotContentName": "content-" + name, "readyToUse": true},
	}}
	content := &unstructured.Unstructured{Object: map[string]interface{}{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
		"metadata": map[string]interface{}{"name": "content-" + name},
		"status":   map[string]interface{}{"snapshotHandle": disk + ":snap-key", "readyToUse": true},
	}}
	if node != "" {
		content.SetLabels(map[string]string{snapshotManagedByLabel: node})
	}
	return []runtime.Object{snap, content}
}

func restoring(name, snapshotName string, size int64) *v1.PersistentVolumeClaim {
	pvc := makePVC(name, diskfitClass, size).PersistentVolumeClaim
	ref := v1.TypedObjectReference{APIGroup: ptr.To(snapshotGroup), Kind: "VolumeSnapshot", Name: snapshotName}
	pvc.Spec.DataSourceRef = &ref
	pvc.Spec.DataSource = &v1.TypedLocalObjectReference{APIGroup: ref.APIGroup, Kind: ref.Kind, Name: ref.Name}
	return pvc
}

// boundPV is a diskfit PV on node/disk bound to claim.
func boundPV(name, claim, nodeName, disk string, size int64) *v1.PersistentVolume {
	pv := &v1.PersistentVolume{}
	pv.Name = name
	pv.Spec.Capacity = v1.ResourceList{v1.ResourceStorage: *resource.NewQuantity(size, resource.BinarySI)}
	pv.Spec.ClaimRef = &v1.ObjectReference{Namespace: "ns", Name: claim, UID: "uid-" + types.UID(claim)}
	pv.Spec.CSI = &v1.CSIPersistentVolumeSource{Driver: diskfit.DriverName, VolumeHandle: disk + ":" + name,
		VolumeAttributes: map[string]string{diskfit.VolumeContextDiskKey: disk}}
	pv.Spec.NodeAffinity = &v1.VolumeNodeAffinity{Required: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
		MatchExpressions: []v1.NodeSelectorRequirement{{Key: diskfit.TopologyKey, Operator: v1.NodeSelectorOpIn, Values: []string{nodeName}}},
	}}}}
	pv.Spec.StorageClassName = diskfitClass
	pv.Status.Phase = v1.VolumeBound
	return pv
}

// TestRestoredClaimGoesToItsSnapshot checks that a claim restoring a
// snapshot is placed on the snapshot's node and disk only, even where
// another disk or node has more room, and that a full source disk is
// explained in its own terms.
func TestRestoredClaimGoesToItsSnapshot(t *testing.T) {
	objs := append(snapshot("snap", "n1", "d0"), restoring("restore", "snap", 2*gi), makePod("p", "restore"))
	env := newTestEnv(t, nil, objs,
		diskNode("n1", freeDisk("d0", 3*gi), freeDisk("d1", 10*gi)),
		diskNode("n2", freeDisk("d0", 10*gi)))
	pod := makePod("p", "restore")
	state := framework.NewCycleState()
	res, status := env.pl.PreFilter(env.ctx, state, pod, nil)
	if !status.IsSuccess() {
		t.Fatalf("PreFilter: %v", status)
	}
	if res.AllNodes() || !res.NodeNames.Equal(sets.New("n1")) {
		t.Fatalf("PreFilter result = %v, want only n1", res)
	}
	nodes := nodeInfos("n1")
	checkStatus(t, "Filter n1", env.pl.Filter(env.ctx, state, pod, nodes[0]), wantStatus{fwk.Success, ""})
	if status := env.pl.Reserve(env.ctx, state, pod, "n1"); !status.IsSuccess() {
		t.Fatalf("Reserve: %v", status)
	}
	if disk, ok := env.pl.ledger.ReservedDisk(pod.UID, "n1", "uid-restore"); !ok || disk != "d0" {
		t.Errorf("reserved disk = %q, %v; want d0 (the snapshot's), not the emptier d1", disk, ok)
	}

	// A second restore of 2Gi no longer fits on d0, although d1 has room.
	pod2 := makePod("p2", "restore2")
	if _, err := env.client.CoreV1().PersistentVolumeClaims("ns").Create(env.ctx, restoring("restore2", "snap", 2*gi), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "restore2 in the cache", func() bool { _, err := env.pl.getPVC("ns", "restore2"); return err == nil })
	state2 := framework.NewCycleState()
	mustPreFilter(t, env, state2, pod2, nil)
	checkStatus(t, "Filter n1", env.pl.Filter(env.ctx, state2, pod2, nodes[0]),
		wantStatus{fwk.UnschedulableAndUnresolvable, "node n1: disk d0 holds the source of claim ns/restore2 and has 1Gi free, the claim needs 2Gi"})
}

// TestClonedClaimGoesToItsSource checks the same for a PVC cloned from a
// bound diskfit PVC.
func TestClonedClaimGoesToItsSource(t *testing.T) {
	src := makePVC("src", diskfitClass, gi).PersistentVolumeClaim
	src.Spec.VolumeName = "pv-src"
	clone := makePVC("clone", diskfitClass, gi).PersistentVolumeClaim
	clone.Spec.DataSource = &v1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "src"}
	clone.Spec.DataSourceRef = &v1.TypedObjectReference{Kind: "PersistentVolumeClaim", Name: "src"}
	env := newTestEnv(t, nil, []runtime.Object{src, clone, boundPV("pv-src", "src", "n2", "d1", gi)},
		diskNode("n1", freeDisk("d0", 10*gi)),
		diskNode("n2", freeDisk("d0", 10*gi), freeDisk("d1", 5*gi)))
	pod := makePod("p", "clone")
	state := framework.NewCycleState()
	res, status := env.pl.PreFilter(env.ctx, state, pod, nil)
	if !status.IsSuccess() {
		t.Fatalf("PreFilter: %v", status)
	}
	if res.AllNodes() || !res.NodeNames.Equal(sets.New("n2")) {
		t.Fatalf("PreFilter result = %v, want only n2", res)
	}
	if status := env.pl.Reserve(env.ctx, state, pod, "n2"); !status.IsSuccess() {
		t.Fatalf("Reserve: %v", status)
	}
	if disk, _ := env.pl.ledger.ReservedDisk(pod.UID, "n2", "uid-clone"); disk != "d1" {
		t.Errorf("reserved disk = %q, want d1 (the source's)", disk)
	}
}

// TestClaimCopyingFromAnotherNamespaceGoesToThatSource: with a
// cross-namespace data source (dataSourceRef.namespace, allowed by a
// ReferenceGrant), the source is the object in that namespace, whatever
// the claim's own namespace holds under the same name: placed by the
// wrong object, the claim would land where external-provisioner's copy of
// the right one cannot be made.
func TestClaimCopyingFromAnotherNamespaceGoesToThatSource(t *testing.T) {
	mine := makePVC("src", diskfitClass, gi).PersistentVolumeClaim
	mine.Spec.VolumeName = "pv-mine"
	theirs := makePVC("src", diskfitClass, gi).PersistentVolumeClaim
	theirs.Namespace, theirs.UID, theirs.Spec.VolumeName = "other", "uid-theirs", "pv-theirs"
	clone := makePVC("clone", diskfitClass, gi).PersistentVolumeClaim
	clone.Spec.DataSourceRef = &v1.TypedObjectReference{Kind: "PersistentVolumeClaim", Name: "src", Namespace: ptr.To("other")}
	theirPV := boundPV("pv-theirs", "src", "n2", "d1", gi)
	theirPV.Spec.ClaimRef.Namespace, theirPV.Spec.ClaimRef.UID = "other", "uid-theirs"
	env := newTestEnv(t, nil, []runtime.Object{mine, theirs, clone, boundPV("pv-mine", "src", "n1", "d0", gi), theirPV},
		diskNode("n1", freeDisk("d0", 10*gi)),
		diskNode("n2", freeDisk("d0", 10*gi), freeDisk("d1", 5*gi)))
	res, status := env.pl.PreFilter(env.ctx, framework.NewCycleState(), makePod("p", "clone"), nil)
	if !status.IsSuccess() {
		t.Fatalf("PreFilter: %v", status)
	}
	if res.AllNodes() || !res.NodeNames.Equal(sets.New("n2")) {
		t.Fatalf("PreFilter result = %v, want only n2, where other/src is", res)
	}

	// What the other namespace holds is not told in the claim's events:
	// an unbound source and a missing one read alike.
	unbound := makePVC("unbound", diskfitClass, gi).PersistentVolumeClaim
	unbound.Namespace, unbound.UID = "other", "uid-unbound"
	for _, name := range []string{"unbound", "missing"} {
		c := makePVC("copy-of-"+name, diskfitClass, gi).PersistentVolumeClaim
		c.Spec.DataSourceRef = &v1.TypedObjectReference{Kind: "PersistentVolumeClaim", Name: name, Namespace: ptr.To("other")}
		env := newTestEnv(t, nil, []runtime.Object{unbound, c}, diskNode("n1", freeDisk("d0", 10*gi)))
		_, status := env.pl.PreFilter(env.ctx, framework.NewCycleState(), makePod("p", c.Name), nil)
		checkStatus(t, "PreFilter "+c.Name, status, wantStatus{fwk.UnschedulableAndUnresolvable,
			"PVC ns/" + c.Name + " copies PersistentVolumeClaim other/" + name + ", which cannot be located from namespace ns (missing, not ready, or not diskfit's)"})
		if strings.Contains(status.Message(), "not bound yet") || strings.Contains(status.Message(), "not found") {
			t.Errorf("PreFilter %s tells what namespace other holds: %q", c.Name, status.Message())
		}
	}
}

// TestUnresolvableSources checks that a pod whose claim's source cannot be
// located is rejected with the reason, instead of being placed where the
// copy cannot be made.
func TestUnresolvableSources(t *testing.T) {
	unbound := makePVC("unbound-src", diskfitClass, gi).PersistentVolumeClaim
	cloneOfUnbound := makePVC("clone", diskfitClass, gi).PersistentVolumeClaim
	cloneOfUnbound.Spec.DataSourceRef = &v1.TypedObjectReference{Kind: "PersistentVolumeClaim", Name: "unbound-src"}
	objs := append(snapshot("unlabelled", "", "d0"), unbound, cloneOfUnbound,
		restoring("from-unlabelled", "unlabelled", gi), restoring("from-missing", "missing", gi))
	objs = append(objs, snapshot("on-n1", "n1", "d0")...)
	objs = append(objs, snapshot("on-n2", "n2", "d0")...)
	objs = append(objs, restoring("from-n1", "on-n1", gi), restoring("from-n2", "on-n2", gi))
	env := newTestEnv(t, nil, objs, diskNode("n1", freeDisk("d0", 10*gi)), diskNode("n2", freeDisk("d0", 10*gi)))
	for _, tc := range []struct {
		claims []string
		want   string
	}{
		{[]string{"clone"}, "PVC ns/clone copies PersistentVolumeClaim ns/unbound-src: the source is not bound yet"},
		{[]string{"from-unlabelled"}, "has no snapshot.storage.kubernetes.io/managed-by label: snapshot-controller must run with --enable-distributed-snapshotting"},
		{[]string{"from-missing"}, `PVC ns/from-missing copies VolumeSnapshot ns/missing: volumesnapshots.snapshot.storage.k8s.io "missing" not found`},
		{[]string{"from-n1", "from-n2"}, "the pod's claims copy data held on different nodes (n1 and n2)"},
	} {
		_, status := env.pl.PreFilter(env.ctx, framework.NewCycleState(), makePod("p", tc.claims...), nil)
		checkStatus(t, "PreFilter "+tc.claims[0], status, wantStatus{fwk.UnschedulableAndUnresolvable, tc.want})
	}
}

// TestTransientSourceErrorsAreRetried checks that a VolumeSnapshot read
// that fails for a passing reason (a timeout, an API server that is
// briefly unavailable) is an error, which the scheduler retries after
// backoff, and not a verdict that parks the pod until the queue's periodic
// flush. A snapshot that does not exist stays a verdict.
func TestTransientSourceErrorsAreRetried(t *testing.T) {
	objs := append(snapshot("snap", "n1", "d0"), restoring("restore", "snap", gi), restoring("from-missing", "missing", gi))
	env := newTestEnv(t, nil, objs, diskNode("n1", freeDisk("d0", 10*gi)))
	for _, tc := range []struct {
		resource string
		err      error
	}{
		{"volumesnapshots", apierrors.NewTimeoutError("request timed out", 1)},
		{"volumesnapshots", context.DeadlineExceeded},
		{"volumesnapshotcontents", apierrors.NewServiceUnavailable("etcd leader changed")},
		{"volumesnapshotcontents", apierrors.NewTooManyRequests("slow down", 1)},
	} {
		env.snapshots.PrependReactor("get", tc.resource, func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, tc.err
		})
		_, status := env.pl.PreFilter(env.ctx, framework.NewCycleState(), makePod("p", "restore"), nil)
		if status.Code() != fwk.Error {
			t.Errorf("%s: %v: PreFilter status %v, want an Error to retry after backoff", tc.resource, tc.err, status)
		}
		env.snapshots.ReactionChain = env.snapshots.ReactionChain[1:]
	}
	_, status := env.pl.PreFilter(env.ctx, framework.NewCycleState(), makePod("p", "restore"), nil)
	checkStatus(t, "PreFilter after the API recovered", status, wantStatus{fwk.Success, ""})
	_, status = env.pl.PreFilter(env.ctx, framework.NewCycleState(), makePod("p", "from-missing"), nil)
	checkStatus(t, "PreFilter of a missing snapshot", status, wantStatus{fwk.UnschedulableAndUnresolvable, `"missing" not found`})
}

// TestSnapshotEventsRequeueRestores checks that a pod whose restore waits
// for its snapshot (not created yet, no content yet, content without its
// handle or node label) is queued again when that snapshot or its content
// is created or changes, and only then, instead of after the queue's
// periodic flush.
func TestSnapshotEventsRequeueRestores(t *testing.T) {
	env := newTestEnv(t, nil, []runtime.Object{
		restoring("restore", "snap", gi), restoring("restore-other", "other", gi),
		makePVC("plain", diskfitClass, gi).PersistentVolumeClaim,
	})
	events, err := env.pl.EventsToRegister(env.ctx)
	if err != nil {
		t.Fatal(err)
	}
	hint := func(res fwk.EventResource, action fwk.ActionType) fwk.QueueingHintFn {
		t.Helper()
		for _, e := range events {
			if e.Event.Resource == res && e.Event.ActionType&action == action {
				return e.QueueingHintFn
			}
		}
		t.Fatalf("no %v event for %s registered", action, res)
		return nil
	}
	snap := snapshot("snap", "n1", "d0")[0].(*unstructured.Unstructured)
	content := snapshot("snap", "n1", "d0")[1].(*unstructured.Unstructured)
	if err := unstructured.SetNestedStringMap(content.Object, map[string]string{"namespace": "ns", "name": "snap"}, "spec", "volumeSnapshotRef"); err != nil {
		t.Fatal(err)
	}
	otherNS := snap.DeepCopy()
	otherNS.SetNamespace("elsewhere")
	logger, _ := ktesting.NewTestContext(t)
	for _, tc := range []struct {
		name     string
		resource fwk.EventResource
		obj      *unstructured.Unstructured
		pod      *v1.Pod
		want     fwk.QueueingHint
	}{
		{"its snapshot", "volumesnapshots.v1.snapshot.storage.k8s.io", snap, makePod("p", "restore"), fwk.Queue},
		{"its snapshot's content", "volumesnapshotcontents.v1.snapshot.storage.k8s.io", content, makePod("p", "restore"), fwk.Queue},
		{"another snapshot", "volumesnapshots.v1.snapshot.storage.k8s.io", snap, makePod("p", "restore-other"), fwk.QueueSkip},
		{"another snapshot's content", "volumesnapshotcontents.v1.snapshot.storage.k8s.io", content, makePod("p", "restore-other"), fwk.QueueSkip},
		{"a snapshot of that name in another namespace", "volumesnapshots.v1.snapshot.storage.k8s.io", otherNS, makePod("p", "restore"), fwk.QueueSkip},
		{"a pod restoring nothing", "volumesnapshots.v1.snapshot.storage.k8s.io", snap, makePod("p", "plain"), fwk.QueueSkip},
	} {
		for _, action := range []fwk.ActionType{fwk.Add, fwk.Update} {
			var oldObj interface{}
			if action == fwk.Update {
				oldObj = tc.obj
			}
			got, err := hint(tc.resource, action)(logger, tc.pod, oldObj, tc.obj)
			if err != nil || got != tc.want {
				t.Errorf("%s, %v: hint %v, %v; want %v", tc.name, action, got, err, tc.want)
			}
		}
	}
}

// TestBoundSourceRequeuesClones checks that a pod whose clone waits for
// its source PVC to be bound is queued again when the source gets its
// volume, and not for other changes of the source or for other pods.
func TestBoundSourceRequeuesClones(t *testing.T) {
	src := makePVC("src", diskfitClass, gi).PersistentVolumeClaim
	clone := makePVC("clone", diskfitClass, gi).PersistentVolumeClaim
	clone.Spec.DataSourceRef = &v1.TypedObjectReference{Kind: "PersistentVolumeClaim", Name: "src"}
	env := newTestEnv(t, nil, []runtime.Object{src, clone, makePVC("plain", diskfitClass, gi).PersistentVolumeClaim})
	var pvcUpdate fwk.QueueingHintFn
	for _, e := range mustEvents(t, env) {
		if e.Event.Resource == fwk.PersistentVolumeClaim && e.Event.ActionType&fwk.Update != 0 {
			pvcUpdate = e.QueueingHintFn
		}
	}
	bound := src.DeepCopy()
	bound.Spec.VolumeName = "pv-src"
	relabelled := src.DeepCopy()
	relabelled.Labels = map[string]string{"app": "db"}
	logger, _ := ktesting.NewTestContext(t)
	for _, tc := range []struct {
		name     string
		pod      *v1.Pod
		old, new *v1.PersistentVolumeClaim
		want     fwk.QueueingHint
	}{
		{"the source got its volume", makePod("p", "clone"), src, bound, fwk.Queue},
		{"the source changed otherwise", makePod("p", "clone"), src, relabelled, fwk.QueueSkip},
		{"a pod that clones nothing", makePod("q", "plain"), src, bound, fwk.QueueSkip},
	} {
		if got, err := pvcUpdate(logger, tc.pod, tc.old, tc.new); err != nil || got != tc.want {
			t.Errorf("%s: hint %v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
}

// TestSnapshotEventsOnlyWhereTheAPIIsServed: the snapshot CRDs are
// optional, and the scheduler waits for the informer of every registered
// event before it schedules anything, so snapshot events are registered
// only where the API is served.
func TestSnapshotEventsOnlyWhereTheAPIIsServed(t *testing.T) {
	for _, tc := range []struct {
		name      string
		resources []*metav1.APIResourceList
		want      bool
	}{
		{"served", snapshotAPI(), true},
		{"not installed", nil, false},
		{"only VolumeSnapshots", []*metav1.APIResourceList{{GroupVersion: "snapshot.storage.k8s.io/v1", APIResources: []metav1.APIResource{{Name: "volumesnapshots"}}}}, false},
	} {
		client := fake.NewClientset()
		client.Discovery().(*fakediscovery.FakeDiscovery).Resources = tc.resources
		if got, err := snapshotAPIServed(client); err != nil || got != tc.want {
			t.Errorf("%s: snapshotAPIServed = %v, %v, want %v", tc.name, got, err, tc.want)
		}
	}

	env := newTestEnv(t, nil, nil)
	env.pl.watchSnapshots = false
	events, err := env.pl.EventsToRegister(env.ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range events {
		if e.Event.Resource == volumeSnapshotEvents || e.Event.Resource == volumeSnapshotContentEvents {
			t.Errorf("%s registered on a cluster without the snapshot API", e.Event.Resource)
		}
	}
}
