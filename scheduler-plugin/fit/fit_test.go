package fit

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
	"github.com/diskfit/diskfit/scheduler-plugin/apis/config"
	configv1 "github.com/diskfit/diskfit/scheduler-plugin/apis/config/v1"
	"github.com/diskfit/diskfit/scheduler-plugin/ledger"
	"github.com/diskfit/diskfit/scheduler-plugin/packing"
)

// TestPackingOptions: the default args pack exactly up to
// packing.DefaultMaxExactClaims claims; maxExactClaims 0 turns the exact
// search off (a negative count in packing.Options, whose zero means the
// default); every strategy name maps to the packing strategy of that name.
func TestPackingOptions(t *testing.T) {
	args := configv1.DefaultArgs()
	if got := PackingOptions(args); got.Strategy != packing.MostAllocated || got.MaxExactClaims != packing.DefaultMaxExactClaims {
		t.Errorf("defaults: %+v", got)
	}
	args.ScoringStrategy.Type = config.LeastAllocated
	args.MaxExactClaims = 0
	if got := PackingOptions(args); got.Strategy != packing.LeastAllocated || got.MaxExactClaims >= 0 {
		t.Errorf("LeastAllocated, greedy only: %+v", got)
	}
	for _, s := range config.ScoringStrategyTypes() {
		args.ScoringStrategy.Type = s
		if got := PackingOptions(args).Strategy.String(); got != string(s) {
			t.Errorf("strategy %q packs as %q", s, got)
		}
	}
}

// TestEvaluateNoAlloc: deciding and scoring a node that fits allocates
// nothing, so Filter and Score stay allocation-free.
func TestEvaluateNoAlloc(t *testing.T) {
	l := ledger.New()
	dn := &v1alpha1.DiskNode{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	dn.Status.ObservedTime = metav1.NewTime(time.Unix(1000, 0))
	for _, d := range []string{"d0", "d1"} {
		dn.Status.Disks = append(dn.Status.Disks, v1alpha1.DiskStatus{Name: d, Backend: v1alpha1.BackendFile,
			CapacityBytes: 10 << 30, FreeBytes: 4 << 30, Healthy: true})
	}
	l.SetDiskNode(dn)
	args := configv1.DefaultArgs()
	args.ScoringStrategy.DeviceClassWeights = []config.DeviceClassWeight{{DeviceClass: "nvme", Weight: 5}}
	ev := New(l, args, func() time.Time { return time.Unix(1010, 0) })
	claims := []packing.Claim{{Key: "a", Size: 3 << 30}, {Key: "b", Size: 2 << 30}}
	var buf Buffers
	allocs := testing.AllocsPerRun(100, func() {
		r := ev.Evaluate("n1", claims, &buf)
		if r.Reason != Fits || ev.Score(r, claims) < 0 {
			t.Fatalf("does not fit: %v", r.Reason)
		}
	})
	if allocs != 0 {
		t.Errorf("Evaluate and Score allocate %v times per call", allocs)
	}
}
