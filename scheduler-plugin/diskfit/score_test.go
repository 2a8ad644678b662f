package diskfit

import (
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	featuregatetesting "k8s.io/component-base/featuregate/testing"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/kubernetes/pkg/features"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"

	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
	"github.com/diskfit/diskfit/scheduler-plugin/apis/config"
	configv1 "github.com/diskfit/diskfit/scheduler-plugin/apis/config/v1"
	"github.com/diskfit/diskfit/scheduler-plugin/fit"
)

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
		// MostAllocated rates the bytes a disk has left (1Gi, 8Gi).
		{config.MostAllocated, map[string]int64{"full": 94, "empty": 80}},
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

// With StorageCapacityScoring on (beta and on by default from 1.37, alpha
// before) VolumeBinding wants to score every pod with claims to provision,
// but it sees no capacity for diskfit claims: their disk score must not be
// diluted by its zero.
func TestScoreWithStorageCapacityScoring(t *testing.T) {
	// The gate, not only the plugin's features: VolumeBinding's defaults
	// read it for the scoring shape.
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.StorageCapacityScoring, true)
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
	for node, want := range map[string]int64{"full": 94, "empty": 80} {
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

// TestFitScoresInTheFrameworksRange: the evaluator's scores are the
// framework's node scores.
func TestFitScoresInTheFrameworksRange(t *testing.T) {
	if minScore != 0 || fit.MaxScore != maxScore {
		t.Errorf("fit scores 0 to %d, the framework %d to %d", fit.MaxScore, minScore, maxScore)
	}
}
