package diskfit

import (
	"context"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/volumebinding"

	"github.com/diskfit/diskfit/apis/diskfit"
	configv1 "github.com/diskfit/diskfit/scheduler-plugin/apis/config/v1"
)

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
	if status := lastStatus(env.pl.PreBindPreFlight(env.ctx, state, pod, "n1")); !status.IsSuccess() {
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

// lastStatus is the status a framework call returns last, whether it
// returns a result with it (PreBindPreFlight from Kubernetes 1.36) or not.
func lastStatus(results ...any) *fwk.Status {
	s, _ := results[len(results)-1].(*fwk.Status)
	return s
}
