package diskfit

import (
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"

	configv1 "github.com/diskfit/diskfit/scheduler-plugin/apis/config/v1"
)

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
