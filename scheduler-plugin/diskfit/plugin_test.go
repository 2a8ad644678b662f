package diskfit

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	fwk "k8s.io/kube-scheduler/framework"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/volumebinding"
	"k8s.io/utils/ptr"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
	"github.com/diskfit/diskfit/scheduler-plugin/apis/config"
	configv1 "github.com/diskfit/diskfit/scheduler-plugin/apis/config/v1"
	"github.com/diskfit/diskfit/scheduler-plugin/fit"
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

// recordingBinder records what VolumeBinding's real AssumePodVolumes is
// given, after the DiskFit decorator.
type recordingBinder struct {
	volumebinding.SchedulerVolumeBinder
	assumed []*v1.PersistentVolumeClaim
}

func (r *recordingBinder) AssumePodVolumes(logger klog.Logger, pod *v1.Pod, nodeName string, pv *volumebinding.PodVolumes) (bool, error) {
	for _, dp := range pv.DynamicProvisions {
		r.assumed = append(r.assumed, dp.PVC)
	}
	return r.SchedulerVolumeBinder.AssumePodVolumes(logger, pod, nodeName, pv)
}

// TestReserveAndPreBindWriteDiskWithNode proves the central contract: the
// PVC update that sets selected-node also carries selected-disk, it is the
// only PVC write, and a stale disk annotation is overwritten.
func TestReserveAndPreBindWriteDiskWithNode(t *testing.T) {
	fresh := makePVC("fresh", diskfitClass, 3*gi).PersistentVolumeClaim
	// Rescheduled: the provisioner removed selected-node, the old disk
	// annotation stayed behind.
	stale := makePVC("stale", diskfitClass, 2*gi).annotate(diskfit.SelectedDiskAnnotation, "gone").PersistentVolumeClaim
	pod := makePod("p", "fresh", "stale")
	args := configv1.DefaultArgs()
	args.BindTimeoutSeconds = 1
	env := newTestEnv(t, args, []runtime.Object{fresh, stale, node("n1"), pod},
		diskNode("n1", freeDisk("d0", 3*gi), freeDisk("d1", 10*gi)))
	inner := env.pl.vb.Binder.(*diskBinder)
	rec := &recordingBinder{SchedulerVolumeBinder: inner.SchedulerVolumeBinder}
	inner.SchedulerVolumeBinder = rec

	state := mustReserveOn(t, env, pod, "n1")
	// MostAllocated: the 3Gi claim fills d0 exactly, the 2Gi one goes to d1.
	wantDisk := map[string]string{"fresh": "d0", "stale": "d1"}
	if len(rec.assumed) != 2 {
		t.Fatalf("VolumeBinding assumed %d PVCs, want 2", len(rec.assumed))
	}
	for _, pvc := range rec.assumed {
		if got := pvc.Annotations[diskfit.SelectedDiskAnnotation]; got != wantDisk[pvc.Name] {
			t.Errorf("assumed PVC %s has disk %q, want %q", pvc.Name, got, wantDisk[pvc.Name])
		}
	}
	// The informer cache must not have been modified.
	cached, err := env.pl.pvcLister.PersistentVolumeClaims("ns").Get("stale")
	if err != nil {
		t.Fatal(err)
	}
	if cached.Annotations[diskfit.SelectedDiskAnnotation] != "gone" {
		t.Error("decorator modified the informer's PVC")
	}

	env.client.ClearActions()
	if _, status := env.pl.PreBindPreFlight(env.ctx, state, pod, "n1"); !status.IsSuccess() {
		t.Fatalf("PreBindPreFlight: %v", status)
	}
	// PreBind writes the PVCs, then waits for a PV controller that does
	// not exist here; its outcome does not matter, the writes do.
	ctx, cancel := context.WithTimeout(env.ctx, 3*time.Second)
	defer cancel()
	_ = env.pl.PreBind(ctx, state, pod, "n1")
	updates := 0
	for _, a := range env.client.Actions() {
		if a.GetVerb() != "update" || a.GetResource().Resource != "persistentvolumeclaims" {
			continue
		}
		updates++
		pvc := a.(clienttesting.UpdateAction).GetObject().(*v1.PersistentVolumeClaim)
		if pvc.Annotations[diskfit.SelectedNodeAnnotation] != "n1" || pvc.Annotations[diskfit.SelectedDiskAnnotation] != wantDisk[pvc.Name] {
			t.Errorf("PVC %s written with annotations %v, want node n1 and disk %s", pvc.Name, pvc.Annotations, wantDisk[pvc.Name])
		}
	}
	if updates != 2 {
		t.Errorf("%d PVC updates, want exactly 2 (one per PVC)", updates)
	}
}

func TestReserveNeverDoubleBooks(t *testing.T) {
	objs := []runtime.Object{
		makePVC("a", diskfitClass, 3*gi).PersistentVolumeClaim,
		makePVC("b", diskfitClass, 3*gi).PersistentVolumeClaim,
		node("n1"),
	}
	env := newTestEnv(t, nil, objs, diskNode("n1", freeDisk("d0", 4*gi)))
	podA, podB := makePod("pa", "a"), makePod("pb", "b")
	nodes := nodeInfos("n1")
	stateA, stateB := framework.NewCycleState(), framework.NewCycleState()
	for _, c := range []struct {
		pod   *v1.Pod
		state *framework.CycleState
	}{{podA, stateA}, {podB, stateB}} {
		mustPreFilter(t, env, c.state, c.pod, nodes)
		// Both pass Filter: nothing is reserved yet.
		if status := env.pl.Filter(env.ctx, c.state, c.pod, nodes[0]); !status.IsSuccess() {
			t.Fatalf("Filter %s: %v", c.pod.Name, status)
		}
	}
	if status := env.pl.Reserve(env.ctx, stateA, podA, "n1"); !status.IsSuccess() {
		t.Fatalf("Reserve A: %v", status)
	}
	// Losing the race is an error, so the pod is retried after a backoff.
	checkStatus(t, "Reserve B", env.pl.Reserve(env.ctx, stateB, podB, "n1"),
		wantStatus{fwk.Error, "largest free disk d0 has 1Gi, pod needs 3Gi"})
	checkStatus(t, "Filter B after A reserved", env.pl.Filter(env.ctx, stateB, podB, nodes[0]),
		wantStatus{fwk.UnschedulableAndUnresolvable, "has 1Gi"})

	env.pl.Unreserve(env.ctx, stateA, podA, "n1")
	env.pl.Unreserve(env.ctx, stateA, podA, "n1")
	if status := env.pl.Reserve(env.ctx, stateB, podB, "n1"); !status.IsSuccess() {
		t.Fatalf("Reserve B after A released: %v", status)
	}
}

func TestLedgerFollowsInformers(t *testing.T) {
	env := newTestEnv(t, nil, []runtime.Object{node("n1")}, diskNode("n1", freeDisk("d0", 10*gi)))
	loc := diskfit.Location{Node: "n1", Disk: "d0"}
	pvc := makePVC("a", diskfitClass, 3*gi).placed("n1", "d0").PersistentVolumeClaim
	if _, err := env.client.CoreV1().PersistentVolumeClaims("ns").Create(env.ctx, pvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "annotated PVC in the ledger", func() bool { return env.pl.ledger.Used(loc) == 3*gi })

	// external-provisioner asks for a reschedule by removing selected-node.
	pvc = pvc.DeepCopy()
	delete(pvc.Annotations, diskfit.SelectedNodeAnnotation)
	if _, err := env.client.CoreV1().PersistentVolumeClaims("ns").Update(env.ctx, pvc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "released PVC out of the ledger", func() bool { return env.pl.ledger.Used(loc) == 0 })

	dn := diskNode("n1", freeDisk("d0", 10*gi), freeDisk("d1", 5*gi))
	if _, err := env.dfClient.DiskfitV1alpha1().DiskNodes().Update(env.ctx, dn, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "new disk in the ledger", func() bool {
		disks, _ := env.pl.ledger.Disks("n1", nil)
		return len(disks) == 2
	})
}

func TestScore(t *testing.T) {
	objs := []runtime.Object{makePVC("a", diskfitClass, 2*gi).PersistentVolumeClaim}
	dns := []*v1alpha1.DiskNode{
		diskNode("full", diskSpec{name: "d0", capacity: 10 * gi, free: 3 * gi}),
		diskNode("empty", freeDisk("d0", 10*gi)),
	}
	tests := []struct {
		strategy config.ScoringStrategyType
		want     map[string]int64
	}{
		{config.MostAllocated, map[string]int64{"full": 90, "empty": 20}},
		{config.LeastAllocated, map[string]int64{"full": 10, "empty": 80}},
	}
	for _, tc := range tests {
		t.Run(string(tc.strategy), func(t *testing.T) {
			args := configv1.DefaultArgs()
			args.ScoringStrategy.Type = tc.strategy
			env := newTestEnv(t, args, objs, dns...)
			pod := makePod("p", "a")
			state := framework.NewCycleState()
			nodes := nodeInfos("full", "empty")
			mustPreFilter(t, env, state, pod, nodes)
			if status := env.pl.PreScore(env.ctx, state, pod, nodes); !status.IsSuccess() {
				t.Fatalf("PreScore: %v", status)
			}
			for _, ni := range nodes {
				got, status := env.pl.Score(env.ctx, state, pod, ni)
				if !status.IsSuccess() {
					t.Fatalf("Score: %v", status)
				}
				if want := tc.want[ni.Node().Name]; got != want {
					t.Errorf("Score(%s) = %d, want %d", ni.Node().Name, got, want)
				}
			}
		})
	}
}

// With StorageCapacityScoring on (the 1.37 default) VolumeBinding wants to
// score every pod with claims to provision, but it sees no capacity for
// diskfit claims: their disk score must not be diluted by its zero.
func TestScoreWithStorageCapacityScoring(t *testing.T) {
	objs := []runtime.Object{makePVC("a", diskfitClass, 2*gi).PersistentVolumeClaim}
	_, ctx := ktesting.NewTestContext(t)
	env := buildEnv(t, ctx, &feature.Features{EnableStorageCapacityScoring: true}, nil, objs,
		diskNode("full", diskSpec{name: "d0", capacity: 10 * gi, free: 3 * gi}),
		diskNode("empty", freeDisk("d0", 10*gi)))
	pod := makePod("p", "a")
	state := framework.NewCycleState()
	nodes := nodeInfos("full", "empty")
	mustPreFilter(t, env, state, pod, nodes)
	if status := env.pl.PreScore(env.ctx, state, pod, nodes); !status.IsSuccess() {
		t.Fatalf("PreScore: %v", status)
	}
	for node, want := range map[string]int64{"full": 90, "empty": 20} {
		got, status := env.pl.Score(env.ctx, state, pod, nodes[map[string]int{"full": 0, "empty": 1}[node]])
		if !status.IsSuccess() {
			t.Fatalf("Score: %v", status)
		}
		if got != want {
			t.Errorf("Score(%s) = %d, want the disk score %d", node, got, want)
		}
	}
}

func TestPreScoreSkipsPodsWithoutClaims(t *testing.T) {
	env := newTestEnv(t, nil, []runtime.Object{makePVC("a", otherClass, gi).PersistentVolumeClaim}, diskNode("n1", freeDisk("d0", gi)))
	pod := makePod("p", "a")
	state := framework.NewCycleState()
	nodes := nodeInfos("n1")
	mustPreFilter(t, env, state, pod, nodes)
	if status := env.pl.PreScore(env.ctx, state, pod, nodes); !status.IsSkip() {
		t.Errorf("PreScore = %v, want Skip", status)
	}
}

func TestSignPod(t *testing.T) {
	env := newTestEnv(t, nil, []runtime.Object{
		makePVC("mine", diskfitClass, gi).PersistentVolumeClaim,
		makePVC("theirs", otherClass, gi).PersistentVolumeClaim,
	})
	if _, status := env.pl.SignPod(env.ctx, makePod("p", "mine")); status.IsSuccess() {
		t.Error("pod with a diskfit claim was signed for batching")
	}
	if _, status := env.pl.SignPod(env.ctx, makePod("p", "theirs")); !status.IsSuccess() {
		t.Errorf("pod without diskfit claims not signed: %v", status)
	}
}

func TestNewRejectsInvalidArgs(t *testing.T) {
	args := configv1.DefaultArgs()
	args.ScoringStrategy.Type = "Random"
	env := newTestEnv(t, nil, nil)
	if _, err := NewWithOptions(env.ctx, args, env.handle, Options{Features: &feature.Features{}, DiskNodeClient: env.dfClient}); err == nil {
		t.Error("New accepted an unknown scoring strategy")
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

// TestFitScoresInTheFrameworksRange: the evaluator's scores are the
// framework's node scores.
func TestFitScoresInTheFrameworksRange(t *testing.T) {
	if fwk.MinScore != 0 || fit.MaxScore != fwk.MaxScore {
		t.Errorf("fit scores 0 to %d, the framework %d to %d", fit.MaxScore, fwk.MinScore, fwk.MaxScore)
	}
}

// TestUnreserveActivatesPodsWaitingForSpace: space freed by Unreserve has no
// API event, so the pods rejected for lack of it are activated directly.
func TestUnreserveActivatesPodsWaitingForSpace(t *testing.T) {
	objs := []runtime.Object{
		makePVC("a", diskfitClass, 3*gi).PersistentVolumeClaim,
		makePVC("b", diskfitClass, 3*gi).PersistentVolumeClaim,
		node("n1"), node("n2"),
	}
	env := newTestEnv(t, nil, objs, diskNode("n1", freeDisk("d0", 4*gi)))
	podA, podB := makePod("pa", "a"), makePod("pb", "b")
	nodes := nodeInfos("n1", "n2")
	stateA, stateB := framework.NewCycleState(), framework.NewCycleState()
	mustPreFilter(t, env, stateA, podA, nodes)
	if status := env.pl.Filter(env.ctx, stateA, podA, nodes[0]); !status.IsSuccess() {
		t.Fatalf("Filter A: %v", status)
	}
	if status := env.pl.Reserve(env.ctx, stateA, podA, "n1"); !status.IsSuccess() {
		t.Fatalf("Reserve A: %v", status)
	}
	// B: n1 lacks space, n2 lacks a DiskNode.
	mustPreFilter(t, env, stateB, podB, nodes)
	for _, ni := range nodes {
		if status := env.pl.Filter(env.ctx, stateB, podB, ni); status.IsSuccess() {
			t.Fatalf("Filter B on %s passed", ni.Node().Name)
		}
	}
	env.pl.Unreserve(env.ctx, stateA, podA, "n1")
	if want := []string{"ns/pb"}; !slices.Equal(env.activator.activated, want) {
		t.Errorf("activated %v, want %v", env.activator.activated, want)
	}
	// Nothing more is freed by a repeated Unreserve, nobody is activated.
	env.pl.Unreserve(env.ctx, stateA, podA, "n1")
	if len(env.activator.activated) != 1 {
		t.Errorf("activated %v after a second Unreserve", env.activator.activated)
	}
}

// TestMissingDiskNodeDoesNotWaitForSpace: a pod rejected only for a missing
// DiskNode waits for DiskNode events, not for freed space.
func TestMissingDiskNodeDoesNotWaitForSpace(t *testing.T) {
	env := newTestEnv(t, nil, []runtime.Object{makePVC("a", diskfitClass, gi).PersistentVolumeClaim, node("n2")})
	pod := makePod("p", "a")
	state := framework.NewCycleState()
	nodes := nodeInfos("n2")
	mustPreFilter(t, env, state, pod, nodes)
	env.pl.Filter(env.ctx, state, pod, nodes[0])
	if got := env.pl.waiting.takeAll(); len(got) != 0 {
		t.Errorf("waiting pods %v, want none", got)
	}
}

func mustPreFilter(t *testing.T, env *testEnv, state fwk.CycleState, pod *v1.Pod, nodes []fwk.NodeInfo) {
	t.Helper()
	if _, status := env.pl.PreFilter(env.ctx, state, pod, nodes); !status.IsSuccess() {
		t.Fatalf("PreFilter %s: %v", pod.Name, status)
	}
}

// mustReserveOn runs one scheduling cycle of pod with nodeName as the only
// node, up to Reserve, and returns its state.
func mustReserveOn(t *testing.T, env *testEnv, pod *v1.Pod, nodeName string) fwk.CycleState {
	t.Helper()
	state := framework.NewCycleState()
	nodes := nodeInfos(nodeName)
	mustPreFilter(t, env, state, pod, nodes)
	if status := env.pl.Filter(env.ctx, state, pod, nodes[0]); !status.IsSuccess() {
		t.Fatalf("Filter: %v", status)
	}
	if status := env.pl.Reserve(env.ctx, state, pod, nodeName); !status.IsSuccess() {
		t.Fatalf("Reserve: %v", status)
	}
	return state
}

// TestDeletedVolumeActivatesPodsWaitingForSpace: a pod rejected for lack of
// space is activated when the plugin's own informer sees a diskfit PV on
// that disk deleted, whatever the queueing hints made of the same event.
func TestDeletedVolumeActivatesPodsWaitingForSpace(t *testing.T) {
	full := makePVC("full", diskfitClass, 3*gi).PersistentVolumeClaim
	full.Spec.VolumeName = "pv-full"
	objs := []runtime.Object{full, boundPV("pv-full", "full", "n1", "d0", 3*gi), makePVC("b", diskfitClass, 2*gi).PersistentVolumeClaim, node("n1")}
	env := newTestEnv(t, nil, objs, diskNode("n1", diskSpec{name: "d0", capacity: 4 * gi, free: 4 * gi}))
	pod := makePod("pb", "b")
	state := framework.NewCycleState()
	mustPreFilter(t, env, state, pod, nil)
	checkStatus(t, "Filter", env.pl.Filter(env.ctx, state, pod, nodeInfos("n1")[0]),
		wantStatus{fwk.UnschedulableAndUnresolvable, "largest free disk d0 has 1Gi"})

	if err := env.client.CoreV1().PersistentVolumes().Delete(env.ctx, "pv-full", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitActivated(t, env, "the waiting pod to be activated", "ns/pb")
}

// TestReleasedDiskActivatesPodsWaitingForSpace: a pod rejected for lack of
// space is activated when the plugin's own informer sees a placed claim
// lose its node (a reschedule releases its disk), whatever the queueing
// hints made of the same event.
func TestReleasedDiskActivatesPodsWaitingForSpace(t *testing.T) {
	placed := makePVC("placed", diskfitClass, 3*gi).placed("n1", "d0").PersistentVolumeClaim
	objs := []runtime.Object{placed, makePVC("b", diskfitClass, 2*gi).PersistentVolumeClaim, node("n1")}
	env := newTestEnv(t, nil, objs, diskNode("n1", freeDisk("d0", 4*gi)))
	pod := makePod("pb", "b")
	state := framework.NewCycleState()
	mustPreFilter(t, env, state, pod, nil)
	checkStatus(t, "Filter", env.pl.Filter(env.ctx, state, pod, nodeInfos("n1")[0]),
		wantStatus{fwk.UnschedulableAndUnresolvable, "largest free disk d0 has 1Gi"})

	released := placed.DeepCopy()
	delete(released.Annotations, diskfit.SelectedNodeAnnotation)
	released.ResourceVersion = "2"
	if _, err := env.client.CoreV1().PersistentVolumeClaims("ns").Update(env.ctx, released, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitActivated(t, env, "the waiting pod to be activated", "ns/pb")
}

// TestPodsWaitingForADiskNodeAreActivated: a pod rejected because a node
// has no DiskNode, or a stale one, is activated when the plugin's own
// informer sees that DiskNode created or fresh again, whatever the
// queueing hints made of the same event.
func TestPodsWaitingForADiskNodeAreActivated(t *testing.T) {
	stale := diskNode("n2", freeDisk("d0", 4*gi))
	stale.Status.ObservedTime = metav1.NewTime(testNow.Add(-time.Hour))
	env := newTestEnv(t, nil, []runtime.Object{makePVC("a", diskfitClass, gi).PersistentVolumeClaim, node("n1"), node("n2")}, stale)
	for _, tc := range []struct {
		node   string
		reason string
		fix    func() error
	}{
		{"n1", "no DiskNode", func() error {
			_, err := env.dfClient.DiskfitV1alpha1().DiskNodes().Create(env.ctx, diskNode("n1", freeDisk("d0", 4*gi)), metav1.CreateOptions{})
			return err
		}},
		{"n2", "DiskNode is stale", func() error {
			fresh := diskNode("n2", freeDisk("d0", 4*gi))
			fresh.ResourceVersion = "2"
			_, err := env.dfClient.DiskfitV1alpha1().DiskNodes().Update(env.ctx, fresh, metav1.UpdateOptions{})
			return err
		}},
	} {
		env.activator.mu.Lock()
		env.activator.activated = nil
		env.activator.mu.Unlock()
		pod := makePod("p", "a")
		state := framework.NewCycleState()
		mustPreFilter(t, env, state, pod, nil)
		checkStatus(t, "Filter "+tc.node, env.pl.Filter(env.ctx, state, pod, nodeInfos(tc.node)[0]),
			wantStatus{fwk.UnschedulableAndUnresolvable, tc.reason})
		if err := tc.fix(); err != nil {
			t.Fatal(err)
		}
		waitActivated(t, env, "the pod waiting on "+tc.node+" to be activated", "ns/p")
	}
}

// waitActivated waits until exactly the pods want have been activated.
func waitActivated(t *testing.T, env *testEnv, what string, want ...string) {
	t.Helper()
	waitFor(t, what, func() bool {
		env.activator.mu.Lock()
		defer env.activator.mu.Unlock()
		return slices.Equal(env.activator.activated, want)
	})
}
