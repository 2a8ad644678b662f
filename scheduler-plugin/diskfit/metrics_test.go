package diskfit

import (
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/component-base/metrics/testutil"
	"k8s.io/kubernetes/pkg/scheduler/framework"
)

func counter(t *testing.T, reason string) float64 {
	t.Helper()
	v, err := testutil.GetCounterMetricValue(filterRejections.WithLabelValues(reason))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func gauge(t *testing.T) float64 {
	t.Helper()
	v, err := testutil.GetGaugeMetricValue(reservationsHeld)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestMetrics(t *testing.T) {
	objs := []runtime.Object{makePVC("a", diskfitClass, 3*gi).PersistentVolumeClaim, node("n1"), node("n2"), node("n3")}
	env := newTestEnv(t, nil, objs, diskNode("n1", freeDisk("d0", 4*gi)), diskNode("n2", freeDisk("d0", gi)))
	pod := makePod("p", "a")
	state := framework.NewCycleState()
	nodes := nodeInfos("n1", "n2", "n3")
	if _, status := env.pl.PreFilter(env.ctx, state, pod, nodes); !status.IsSuccess() {
		t.Fatalf("PreFilter: %v", status)
	}
	noDiskNode, noSpace := counter(t, reasonNoDiskNode), counter(t, reasonNoSpace)
	for _, ni := range nodes {
		env.pl.Filter(env.ctx, state, pod, ni)
	}
	if got := counter(t, reasonNoDiskNode) - noDiskNode; got != 1 {
		t.Errorf("no_disknode rejections +%v, want +1", got)
	}
	if got := counter(t, reasonNoSpace) - noSpace; got != 1 {
		t.Errorf("insufficient_space rejections +%v, want +1", got)
	}

	if status := env.pl.Reserve(env.ctx, state, pod, "n1"); !status.IsSuccess() {
		t.Fatalf("Reserve: %v", status)
	}
	if got := gauge(t); got != 1 {
		t.Errorf("reservations held %v after Reserve, want 1", got)
	}
	env.pl.Unreserve(env.ctx, state, pod, "n1")
	if got := gauge(t); got != 0 {
		t.Errorf("reservations held %v after Unreserve, want 0", got)
	}
}
