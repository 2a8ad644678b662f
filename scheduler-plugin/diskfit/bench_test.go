package diskfit

import (
	"context"
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/volumebinding"

	configv1 "github.com/diskfit/diskfit/scheduler-plugin/apis/config/v1"
	"github.com/diskfit/diskfit/scheduler-plugin/packing"
)

// benchSetup is one pod on one node with 8 disks, with DiskFit and a plain
// VolumeBinding built on the same informers and feature gates.
type benchSetup struct {
	env  *testEnv
	vb   *volumebinding.VolumeBinding
	pod  *v1.Pod
	node fwk.NodeInfo
}

// newBenchSetup builds a pod with `claims` PVCs of class (1Gi..claims Gi)
// and a node whose 8 disks have room for them.
func newBenchSetup(b *testing.B, class string, claims int) *benchSetup {
	b.Helper()
	// The global klog logger at its default verbosity, as in a scheduler:
	// test loggers would log V(5) lines in VolumeBinding's hot path.
	ctx := klog.NewContext(context.Background(), klog.Background())
	objs := []runtime.Object{node("n1")}
	var names []string
	for i := 0; i < claims; i++ {
		name := fmt.Sprintf("c%d", i)
		names = append(names, name)
		objs = append(objs, makePVC(name, class, int64(i+1)*gi).PersistentVolumeClaim)
	}
	var disks []diskSpec
	for i := 0; i < 8; i++ {
		// Uneven free space so placements have choices to weigh.
		disks = append(disks, diskSpec{name: fmt.Sprintf("nvme%d", i), capacity: 100 * gi, free: int64(20+7*i) * gi})
	}
	fts := feature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate)
	env := buildEnv(b, ctx, &fts, nil, objs, diskNode("n1", disks...))
	vbPlugin, err := volumebinding.New(ctx, mustVBArgs(b, fts), env.handle, fts)
	if err != nil {
		b.Fatal(err)
	}
	return &benchSetup{env: env, vb: vbPlugin.(*volumebinding.VolumeBinding), pod: makePod("p", names...), node: nodeInfos("n1")[0]}
}

func mustVBArgs(b *testing.B, fts feature.Features) runtime.Object {
	args, err := volumeBindingArgs(configv1.DefaultArgs(), fts)
	if err != nil {
		b.Fatal(err)
	}
	return args
}

// prefilter runs a plugin's PreFilter once, as the framework does per cycle.
func prefilter(b *testing.B, pl fwk.PreFilterPlugin, ctx context.Context, pod *v1.Pod, node fwk.NodeInfo) fwk.CycleState {
	b.Helper()
	state := framework.NewCycleState()
	if _, status := pl.PreFilter(ctx, state, pod, []fwk.NodeInfo{node}); !status.IsSuccess() {
		b.Fatalf("%s PreFilter: %v", pl.Name(), status)
	}
	return state
}

func benchFilter(b *testing.B, pl fwk.FilterPlugin, ctx context.Context, state fwk.CycleState, pod *v1.Pod, node fwk.NodeInfo) {
	b.ReportAllocs()
	for b.Loop() {
		if status := pl.Filter(ctx, state, pod, node); !status.IsSuccess() {
			b.Fatalf("%s Filter: %v", pl.Name(), status)
		}
	}
}

// BenchmarkFilter measures Filter per node: DiskFit as the profile runs it
// (disk packing, keeping the node's score for Score, plus the embedded
// VolumeBinding's Filter unless it is deferred to Reserve: deferred.go),
// the disk packing alone, and the in-tree VolumeBinding alone on the same
// pod.
func BenchmarkFilter(b *testing.B) {
	cases := []struct {
		name   string
		class  string
		claims int
	}{
		{"diskfit-claims=1", diskfitClass, 1},
		{"diskfit-claims=3", diskfitClass, 3},
		{"diskfit-claims=8", diskfitClass, 8},
		{"other-claims=3", otherClass, 3},
	}
	for _, c := range cases {
		s := newBenchSetup(b, c.class, c.claims)
		ctx := s.env.ctx
		b.Run(c.name+"/DiskFit", func(b *testing.B) {
			benchFilter(b, s.env.pl, ctx, prefilter(b, s.env.pl, ctx, s.pod, s.node), s.pod, s.node)
		})
		b.Run(c.name+"/VolumeBinding", func(b *testing.B) {
			benchFilter(b, s.vb, ctx, prefilter(b, s.vb, ctx, s.pod, s.node), s.pod, s.node)
		})
		if c.class != diskfitClass {
			// What DiskFit adds to VolumeBinding's Filter for a pod without
			// diskfit claims, measured alone: the difference of the two
			// runs above is smaller than this machine's noise.
			b.Run(c.name+"/DiskFitOverheadOnly", func(b *testing.B) {
				state := prefilter(b, s.env.pl, ctx, s.pod, s.node)
				b.ReportAllocs()
				for b.Loop() {
					st, err := s.env.pl.getState(state)
					if err != nil || len(st.claims) != 0 {
						b.Fatal("unexpected state", err)
					}
				}
			})
			continue
		}
		b.Run(c.name+"/DiskFitDisksOnly", func(b *testing.B) {
			st, err := readState(prefilter(b, s.env.pl, ctx, s.pod, s.node))
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if status, _, _ := s.env.pl.filterDisks(ctx, st.claims, "n1"); status != nil {
					b.Fatal(status)
				}
			}
		})
	}
}

// BenchmarkScore measures PreScore once and Score per node, the same way,
// after the Filter of the same cycle.
func BenchmarkScore(b *testing.B) {
	cases := []struct {
		name   string
		class  string
		claims int
	}{
		{"diskfit-claims=1", diskfitClass, 1},
		{"diskfit-claims=3", diskfitClass, 3},
		{"diskfit-claims=8", diskfitClass, 8},
		{"other-claims=3", otherClass, 3},
	}
	type scorer interface {
		fwk.PreFilterPlugin
		fwk.FilterPlugin
		fwk.PreScorePlugin
		fwk.ScorePlugin
	}
	run := func(b *testing.B, pl scorer, ctx context.Context, pod *v1.Pod, node fwk.NodeInfo) {
		state := prefilter(b, pl, ctx, pod, node)
		if status := pl.Filter(ctx, state, pod, node); !status.IsSuccess() {
			b.Fatal(status)
		}
		if status := pl.PreScore(ctx, state, pod, []fwk.NodeInfo{node}); status.IsSkip() {
			b.Skipf("%s skips Score for this pod", pl.Name())
		} else if !status.IsSuccess() {
			b.Fatal(status)
		}
		b.ReportAllocs()
		for b.Loop() {
			if _, status := pl.Score(ctx, state, pod, node); !status.IsSuccess() {
				b.Fatal(status)
			}
		}
	}
	for _, c := range cases {
		s := newBenchSetup(b, c.class, c.claims)
		b.Run(c.name+"/DiskFit", func(b *testing.B) { run(b, s.env.pl, s.env.ctx, s.pod, s.node) })
		b.Run(c.name+"/VolumeBinding", func(b *testing.B) { run(b, s.vb, s.env.ctx, s.pod, s.node) })
	}
}

// BenchmarkPreFilter measures the once-per-cycle cost.
func BenchmarkPreFilter(b *testing.B) {
	for _, c := range []struct {
		name   string
		class  string
		claims int
	}{{"diskfit-claims=3", diskfitClass, 3}, {"other-claims=3", otherClass, 3}} {
		s := newBenchSetup(b, c.class, c.claims)
		for _, pl := range []fwk.PreFilterPlugin{s.env.pl, s.vb} {
			b.Run(c.name+"/"+pl.Name(), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					prefilter(b, pl, s.env.ctx, s.pod, s.node)
				}
			})
		}
	}
}

// BenchmarkPack measures the framework-free packing on 8 disks, including
// the exhaustive search when greedy placement fails.
func BenchmarkPack(b *testing.B) {
	disks := make([]packing.Disk, 8)
	for i := range disks {
		disks[i] = packing.Disk{Name: fmt.Sprintf("d%d", i), Capacity: 100 * gi, Free: int64(20+7*i) * gi, Healthy: true}
	}
	for _, n := range []int{1, 3, 8} {
		claims := make([]packing.Claim, n)
		for i := range claims {
			claims[i] = packing.Claim{Key: fmt.Sprint(i), Size: int64(i+1) * gi}
		}
		packing.SortClaims(claims)
		assign := make([]int, n)
		b.Run(fmt.Sprintf("claims=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if !packing.Pack(disks, claims, packing.Options{}, assign) {
					b.Fatal("does not fit")
				}
			}
		})
	}
	// Greedy fails here (see TestPack), so the exact search runs.
	hard := []packing.Disk{{Name: "a", Capacity: 6, Free: 6, Healthy: true}, {Name: "b", Capacity: 7, Free: 7, Healthy: true}}
	hardClaims := []packing.Claim{{Key: "0", Size: 4}, {Key: "1", Size: 3}, {Key: "2", Size: 3}, {Key: "3", Size: 3}}
	assign := make([]int, len(hardClaims))
	b.Run("exact-search", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if !packing.Pack(hard, hardClaims, packing.Options{}, assign) {
				b.Fatal("does not fit")
			}
		}
	})
}
