package diskfit

import (
	"context"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/diskfit/diskfit/apis/diskfit"
	configv1 "github.com/diskfit/diskfit/scheduler-plugin/apis/config/v1"
)

func TestDiskSelectedEvent(t *testing.T) {
	data := makePVC("data", diskfitClass, 3*gi).PersistentVolumeClaim
	logs := makePVC("logs", diskfitClass, 2*gi).PersistentVolumeClaim
	// Another driver's claim: VolumeBinding provisions it, DiskFit chose
	// no disk for it and says nothing.
	other := makePVC("other", otherClass, gi).PersistentVolumeClaim
	pod := makePod("p", "data", "logs", "other")
	args := configv1.DefaultArgs()
	args.BindTimeoutSeconds = 1
	env := newTestEnv(t, args, []runtime.Object{data, logs, other, node("n1"), pod},
		diskNode("n1", diskSpec{name: "d0", capacity: 8 * gi, free: 5*gi + gi/2}, freeDisk("d1", 10*gi)))

	state := mustReserveOn(t, env, pod, "n1")
	if got := env.events.recorded(); len(got) != 0 {
		t.Fatalf("events before PreBind: %+v", got)
	}
	// PreBind writes the claims and then waits for a PV controller that
	// does not exist here; the events come before the wait.
	ctx, cancel := context.WithTimeout(env.ctx, 3*time.Second)
	defer cancel()
	_ = env.pl.PreBind(ctx, state, pod, "n1")

	// MostAllocated puts both claims on the fuller disk; the second sees
	// what the first left.
	want := map[string]string{
		"data": "disk d0 on node n1 (5.5Gi free before this claim)",
		"logs": "disk d0 on node n1 (2.5Gi free before this claim)",
	}
	got := env.events.recorded()
	if len(got) != len(want) {
		t.Fatalf("recorded %d events, want %d: %+v", len(got), len(want), got)
	}
	for _, e := range got {
		pvc, ok := e.regarding.(*v1.PersistentVolumeClaim)
		if !ok {
			t.Errorf("event regarding %T, want a PVC", e.regarding)
			continue
		}
		if e.eventType != v1.EventTypeNormal || e.reason != ReasonDiskSelected || e.action != "Binding" || e.note != want[pvc.Name] {
			t.Errorf("event on PVC %s: %s %s %s %q; want Normal %s Binding %q",
				pvc.Name, e.eventType, e.reason, e.action, e.note, ReasonDiskSelected, want[pvc.Name])
		}
		if related, ok := e.related.(*v1.Pod); !ok || related.UID != pod.UID {
			t.Errorf("event on PVC %s relates to %v, want pod %s", pvc.Name, e.related, pod.Name)
		}
		if pvc.Annotations[diskfit.SelectedDiskAnnotation] == "" {
			t.Errorf("event regards PVC %s without the disk it announces", pvc.Name)
		}
	}
}
