package diskfit

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	fwk "k8s.io/kube-scheduler/framework"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/volumebinding"
	"k8s.io/utils/ptr"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
)

type wantStatus struct {
	code   fwk.Code
	reason string // substring of the status message
}

func checkStatus(t *testing.T, what string, got *fwk.Status, want wantStatus) {
	t.Helper()
	if got.Code() != want.code {
		t.Errorf("%s: code %v (%q), want %v", what, got.Code(), got.Message(), want.code)
		return
	}
	if !strings.Contains(got.Message(), want.reason) {
		t.Errorf("%s: message %q, want it to contain %q", what, got.Message(), want.reason)
	}
}

func TestFilter(t *testing.T) {
	stale := diskNode("n1", freeDisk("d0", 10*gi))
	stale.Status.ObservedTime = metav1.NewTime(testNow.Add(-time.Hour))
	tests := []struct {
		name      string
		objs      []runtime.Object
		diskNodes []*v1alpha1.DiskNode
		pod       *v1.Pod
		want      map[string]wantStatus // node -> status
	}{
		{
			name:      "two disks with 1Gi free each reject a 2Gi claim",
			objs:      []runtime.Object{makePVC("a", diskfitClass, 2*gi).PersistentVolumeClaim},
			diskNodes: []*v1alpha1.DiskNode{diskNode("n1", freeDisk("nvme0", gi), freeDisk("nvme1", gi))},
			pod:       makePod("p", "a"),
			want: map[string]wantStatus{"n1": {fwk.UnschedulableAndUnresolvable,
				"node n1: largest free disk nvme0 has 1Gi, pod needs 2Gi on one disk"}},
		},
		{
			name: "two 3Gi claims fit on 4Gi+4Gi but not on 4Gi+2Gi",
			objs: []runtime.Object{makePVC("a", diskfitClass, 3*gi).PersistentVolumeClaim, makePVC("b", diskfitClass, 3*gi).PersistentVolumeClaim},
			diskNodes: []*v1alpha1.DiskNode{
				diskNode("n1", freeDisk("d0", 4*gi), freeDisk("d1", 4*gi)),
				diskNode("n2", freeDisk("d0", 4*gi), freeDisk("d1", 2*gi)),
			},
			pod: makePod("p", "a", "b"),
			want: map[string]wantStatus{
				"n1": {fwk.Success, ""},
				"n2": {fwk.UnschedulableAndUnresolvable, "node n2: claims 3Gi+3Gi do not fit together on disks d0 (4Gi free), d1 (2Gi free)"},
			},
		},
		{
			name: "a disk taken out of service takes no new volume; the next disk does",
			objs: []runtime.Object{makePVC("a", diskfitClass, 3*gi).PersistentVolumeClaim},
			diskNodes: []*v1alpha1.DiskNode{
				cordoned(diskNode("n1", freeDisk("d0", 10*gi), freeDisk("d1", 2*gi)), "d0"),
				cordoned(diskNode("n2", freeDisk("d0", 10*gi), freeDisk("d1", 4*gi)), "d0"),
			},
			pod: makePod("p", "a"),
			want: map[string]wantStatus{
				"n1": {fwk.UnschedulableAndUnresolvable, "node n1: largest free disk d1 has 2Gi, pod needs 3Gi on one disk"},
				"n2": {fwk.Success, ""},
			},
		},
		{
			name: "a node whose disks are all out of service says so",
			objs: []runtime.Object{makePVC("a", diskfitClass, gi).PersistentVolumeClaim},
			diskNodes: []*v1alpha1.DiskNode{func() *v1alpha1.DiskNode {
				dn := diskNode("n1", freeDisk("d0", 10*gi))
				dn.Spec.Unschedulable = true
				return dn
			}()},
			pod: makePod("p", "a"),
			want: map[string]wantStatus{"n1": {fwk.UnschedulableAndUnresolvable,
				"node n1: claim ns/a: disk d0 is unschedulable (taken out of service in the node's DiskNode spec)"}},
		},
		{
			name:      "node without DiskNode is rejected",
			objs:      []runtime.Object{makePVC("a", diskfitClass, gi).PersistentVolumeClaim},
			diskNodes: []*v1alpha1.DiskNode{diskNode("n1", freeDisk("d0", 10*gi))},
			pod:       makePod("p", "a"),
			want: map[string]wantStatus{
				"n1": {fwk.Success, ""},
				"n2": {fwk.UnschedulableAndUnresolvable, "node n2: no DiskNode"},
			},
		},
		{
			name:      "stale DiskNode is rejected",
			objs:      []runtime.Object{makePVC("a", diskfitClass, gi).PersistentVolumeClaim},
			diskNodes: []*v1alpha1.DiskNode{stale},
			pod:       makePod("p", "a"),
			want:      map[string]wantStatus{"n1": {fwk.UnschedulableAndUnresolvable, "node n1: DiskNode is stale"}},
		},
		{
			name: "device class from the StorageClass",
			objs: []runtime.Object{makePVC("a", ssdClass, 3*gi).PersistentVolumeClaim},
			diskNodes: []*v1alpha1.DiskNode{
				diskNode("n1", diskSpec{name: "hdd0", class: "hdd", capacity: 10 * gi, free: 10 * gi}, diskSpec{name: "ssd0", class: "ssd", capacity: 4 * gi, free: 4 * gi}),
				diskNode("n2", diskSpec{name: "hdd0", class: "hdd", capacity: 10 * gi, free: 10 * gi}, diskSpec{name: "ssd0", class: "ssd", capacity: 4 * gi, free: 2 * gi}),
			},
			pod: makePod("p", "a"),
			want: map[string]wantStatus{
				"n1": {fwk.Success, ""},
				"n2": {fwk.UnschedulableAndUnresolvable, `largest free disk of device class "ssd" ssd0 has 2Gi`},
			},
		},
		{
			name:      "unhealthy disks are skipped",
			objs:      []runtime.Object{makePVC("a", diskfitClass, gi).PersistentVolumeClaim},
			diskNodes: []*v1alpha1.DiskNode{diskNode("n1", diskSpec{name: "d0", capacity: 10 * gi, free: 10 * gi, unhealthy: true})},
			pod:       makePod("p", "a"),
			want:      map[string]wantStatus{"n1": {fwk.UnschedulableAndUnresolvable, "node n1: no healthy disk"}},
		},
		{
			name: "another pod's annotated unbound PVC holds its disk",
			objs: []runtime.Object{
				makePVC("a", diskfitClass, 3*gi).PersistentVolumeClaim,
				makePVC("other", diskfitClass, 3*gi).placed("n1", "d0").PersistentVolumeClaim,
			},
			diskNodes: []*v1alpha1.DiskNode{diskNode("n1", freeDisk("d0", 4*gi))},
			pod:       makePod("p", "a"),
			want:      map[string]wantStatus{"n1": {fwk.UnschedulableAndUnresolvable, "largest free disk d0 has 1Gi, pod needs 3Gi"}},
		},
		{
			name: "a PVC whose selected-node was removed no longer holds its disk",
			objs: []runtime.Object{
				makePVC("a", diskfitClass, 3*gi).PersistentVolumeClaim,
				makePVC("other", diskfitClass, 3*gi).annotate(diskfit.SelectedDiskAnnotation, "d0").PersistentVolumeClaim,
			},
			diskNodes: []*v1alpha1.DiskNode{diskNode("n1", freeDisk("d0", 4*gi))},
			pod:       makePod("p", "a"),
			want:      map[string]wantStatus{"n1": {fwk.Success, ""}},
		},
		{
			name:      "a claim of another provisioner is left to VolumeBinding",
			objs:      []runtime.Object{makePVC("a", otherClass, 100*gi).PersistentVolumeClaim},
			diskNodes: []*v1alpha1.DiskNode{diskNode("n1", freeDisk("d0", gi))},
			pod:       makePod("p", "a"),
			want:      map[string]wantStatus{"n1": {fwk.Success, ""}, "n2": {fwk.Success, ""}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := newTestEnv(t, nil, tc.objs, tc.diskNodes...)
			state := framework.NewCycleState()
			if _, status := env.pl.PreFilter(env.ctx, state, tc.pod, nil); !status.IsSuccess() {
				t.Fatalf("PreFilter: %v", status)
			}
			var names []string
			for n := range tc.want {
				names = append(names, n)
			}
			for _, ni := range nodeInfos(names...) {
				checkStatus(t, "Filter on "+ni.Node().Name, env.pl.Filter(env.ctx, state, tc.pod, ni), tc.want[ni.Node().Name])
			}
		})
	}
}

// TestNonDiskFitClaimsMatchVolumeBinding runs DiskFit and a plain
// VolumeBinding side by side on pods without diskfit claims: every status
// must be the same.
func TestNonDiskFitClaimsMatchVolumeBinding(t *testing.T) {
	wffc := makePVC("wffc", otherClass, gi).PersistentVolumeClaim
	bound := makePVC("bound", otherClass, gi).PersistentVolumeClaim
	bound.Spec.VolumeName = "pv-bound"
	bound.Status.Phase = v1.ClaimBound
	boundPV := &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "pv-bound"},
		Spec: v1.PersistentVolumeSpec{
			StorageClassName: otherClass,
			ClaimRef:         &v1.ObjectReference{Namespace: "ns", Name: "bound", UID: bound.UID},
			NodeAffinity: &v1.VolumeNodeAffinity{Required: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
				MatchExpressions: []v1.NodeSelectorRequirement{{Key: v1.LabelHostname, Operator: v1.NodeSelectorOpIn, Values: []string{"n1"}}},
			}}}},
		},
		Status: v1.PersistentVolumeStatus{Phase: v1.VolumeBound},
	}
	// The other driver tracks capacity but has published none: VolumeBinding
	// rejects its claims, and so must DiskFit.
	objs := []runtime.Object{wffc, bound, boundPV, node("n1"), node("n2"), csiDriver("other.example.com")}
	pods := []*v1.Pod{
		makePod("no-volumes"),
		makePod("wffc", "wffc"),
		makePod("bound", "bound"),
		makePod("missing", "does-not-exist"),
	}
	env := newTestEnv(t, nil, objs, diskNode("n1", freeDisk("d0", gi)))
	vbPlugin, err := volumebinding.New(env.ctx, &schedconfig.VolumeBindingArgs{BindTimeoutSeconds: 600}, env.handle, feature.Features{})
	if err != nil {
		t.Fatal(err)
	}
	vb := vbPlugin.(*volumebinding.VolumeBinding)
	nodes := nodeInfos("n1", "n2")
	for _, pod := range pods {
		t.Run(pod.Name, func(t *testing.T) {
			dfState, vbState := framework.NewCycleState(), framework.NewCycleState()
			_, dfStatus := env.pl.PreFilter(env.ctx, dfState, pod, nodes)
			_, vbStatus := vb.PreFilter(env.ctx, vbState, pod, nodes)
			if dfStatus.Code() != vbStatus.Code() || dfStatus.Message() != vbStatus.Message() {
				t.Fatalf("PreFilter: DiskFit %v, VolumeBinding %v", dfStatus, vbStatus)
			}
			if !vbStatus.IsSuccess() {
				return
			}
			for _, ni := range nodes {
				df := env.pl.Filter(env.ctx, dfState, pod, ni)
				want := vb.Filter(env.ctx, vbState, pod, ni)
				if df.Code() != want.Code() || df.Message() != want.Message() {
					t.Errorf("Filter on %s: DiskFit %v, VolumeBinding %v", ni.Node().Name, df, want)
				}
			}
			dfPre := env.pl.PreScore(env.ctx, dfState, pod, nodes)
			vbPre := vb.PreScore(env.ctx, vbState, pod, nodes)
			if dfPre.Code() != vbPre.Code() {
				t.Errorf("PreScore: DiskFit %v, VolumeBinding %v", dfPre, vbPre)
			}
		})
	}
}

// TestGenericEphemeralVolume checks that the PVC of a generic ephemeral
// volume (<pod>-<volume>, owned by the pod) is packed like any other claim.
func TestGenericEphemeralVolume(t *testing.T) {
	pod := makePod("p")
	pod.Spec.Volumes = append(pod.Spec.Volumes, v1.Volume{Name: "scratch", VolumeSource: v1.VolumeSource{
		Ephemeral: &v1.EphemeralVolumeSource{VolumeClaimTemplate: &v1.PersistentVolumeClaimTemplate{}},
	}})
	pvc := makePVC("p-scratch", diskfitClass, 5*gi).PersistentVolumeClaim
	pvc.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID, Controller: ptr.To(true)}}
	env := newTestEnv(t, nil, []runtime.Object{pvc}, diskNode("n1", freeDisk("d0", 4*gi)), diskNode("n2", freeDisk("d0", 8*gi)))
	state := framework.NewCycleState()
	mustPreFilter(t, env, state, pod, nil)
	nodes := nodeInfos("n1", "n2")
	checkStatus(t, "Filter n1", env.pl.Filter(env.ctx, state, pod, nodes[0]),
		wantStatus{fwk.UnschedulableAndUnresolvable, "largest free disk d0 has 4Gi, pod needs 5Gi on one disk (claim ns/p-scratch)"})
	checkStatus(t, "Filter n2", env.pl.Filter(env.ctx, state, pod, nodes[1]), wantStatus{fwk.Success, ""})
}

func csiDriver(name string) *storagev1.CSIDriver {
	return &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: storagev1.CSIDriverSpec{StorageCapacity: ptr.To(true)}}
}

// TestDiskFitClaimsSkipCSIStorageCapacity checks that diskfit claims are
// judged by their disks, not by CSIStorageCapacity: the diskfit driver
// tracks capacity, no capacity object exists yet (as on a new node), and the
// node with room still passes.
func TestDiskFitClaimsSkipCSIStorageCapacity(t *testing.T) {
	objs := []runtime.Object{makePVC("a", diskfitClass, 2*gi).PersistentVolumeClaim, node("n1"), csiDriver(diskfit.DriverName)}
	env := newTestEnv(t, nil, objs, diskNode("n1", freeDisk("d0", 4*gi)))
	pod := makePod("p", "a")
	state := framework.NewCycleState()
	nodes := nodeInfos("n1")
	mustPreFilter(t, env, state, pod, nodes)
	checkStatus(t, "Filter", env.pl.Filter(env.ctx, state, pod, nodes[0]), wantStatus{fwk.Success, ""})

	// The plain VolumeBinding would have rejected the node.
	vbPlugin, err := volumebinding.New(env.ctx, &schedconfig.VolumeBindingArgs{BindTimeoutSeconds: 600}, env.handle, feature.Features{})
	if err != nil {
		t.Fatal(err)
	}
	vb := vbPlugin.(*volumebinding.VolumeBinding)
	vbState := framework.NewCycleState()
	if _, status := vb.PreFilter(env.ctx, vbState, pod, nodes); !status.IsSuccess() {
		t.Fatalf("VolumeBinding PreFilter: %v", status)
	}
	checkStatus(t, "VolumeBinding Filter", vb.Filter(env.ctx, vbState, pod, nodes[0]),
		wantStatus{fwk.UnschedulableAndUnresolvable, "did not have enough free storage"})
}

// TestConcurrentFilterAndEvents runs Filter on many goroutines, as the
// framework does across nodes, while DiskNode and PVC events change the
// ledger; with -race it guards the locking, and every answer must be one
// the changing data allows.
func TestConcurrentFilterAndEvents(t *testing.T) {
	objs := []runtime.Object{makePVC("a", diskfitClass, 3*gi).PersistentVolumeClaim}
	var dns []*v1alpha1.DiskNode
	var names []string
	for i := 0; i < 8; i++ {
		n := fmt.Sprintf("n%d", i)
		names = append(names, n)
		objs = append(objs, node(n))
		dns = append(dns, diskNode(n, freeDisk("d0", 4*gi), freeDisk("d1", 2*gi)))
	}
	env := newTestEnv(t, nil, objs, dns...)
	pod := makePod("p", "a")
	state := framework.NewCycleState()
	nodes := nodeInfos(names...)
	mustPreFilter(t, env, state, pod, nodes)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 200; i++ {
			// Another pod's 2Gi claim lands on and leaves d0 of n0..n7.
			other := makePVC(fmt.Sprintf("o%d", i), diskfitClass, 2*gi).placed(names[i%8], "d0").PersistentVolumeClaim
			env.pl.ledger.SetPVC(other)
			env.pl.ledger.SetDiskNode(diskNode(names[i%8], freeDisk("d0", 4*gi), freeDisk("d1", 2*gi)))
			env.pl.ledger.DeletePVC(other)
		}
	}()
	var wg sync.WaitGroup
	for _, ni := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 200; j++ {
				status := env.pl.Filter(env.ctx, state, pod, ni)
				// 3Gi fits on d0 unless the other claim holds it (then
				// 2Gi are left): both answers are valid, nothing else is.
				if !status.IsSuccess() && !strings.Contains(status.Message(), "largest free disk d0 has 2Gi") {
					t.Errorf("Filter on %s: %v", ni.Node().Name, status)
					return
				}
			}
		}()
	}
	wg.Wait()
	<-done
	for _, ni := range nodes {
		checkStatus(t, "Filter after the events", env.pl.Filter(env.ctx, state, pod, ni), wantStatus{fwk.Success, ""})
	}
}
