package diskfit

import (
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/diskfit/diskfit/apis/diskfit"
)

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
