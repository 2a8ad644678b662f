package app

import (
	"context"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"

	apiruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/cmd/kube-scheduler/app/options"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
	internalcache "k8s.io/kubernetes/pkg/scheduler/backend/cache"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	schedmetrics "k8s.io/kubernetes/pkg/scheduler/metrics"

	dffake "github.com/diskfit/diskfit/apis/client/clientset/versioned/fake"
	dfapi "github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/scheduler-plugin/apis/config"
	"github.com/diskfit/diskfit/scheduler-plugin/diskfit"
)

func repoFile(t *testing.T, rel string) string {
	t.Helper()
	_, self, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate the test file")
	}
	return filepath.Join(filepath.Dir(self), "..", "..", rel)
}

// TestConfigFile loads the shipped configuration the way kube-scheduler
// does and builds the diskfit-scheduler profile's framework from it.
func TestConfigFile(t *testing.T) {
	logger, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cfg, err := options.LoadConfigFromFile(logger, repoFile(t, ConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Profiles) != 1 || cfg.Profiles[0].SchedulerName != dfapi.SchedulerName {
		t.Fatalf("profiles %+v, want one named %s", cfg.Profiles, dfapi.SchedulerName)
	}
	prof := &cfg.Profiles[0]
	var args *config.DiskFitArgs
	for _, pc := range prof.PluginConfig {
		if pc.Name == diskfit.Name {
			a, ok := pc.Args.(*config.DiskFitArgs)
			if !ok {
				t.Fatalf("DiskFit args decoded as %T, want *config.DiskFitArgs", pc.Args)
			}
			args = a
		}
	}
	if args == nil {
		t.Fatal("no DiskFit pluginConfig")
	}
	if args.ScoringStrategy.Type != config.MostAllocated || args.MaxDiskNodeAge.Duration != 5*time.Minute || args.MaxExactClaims != 8 || args.BindTimeoutSeconds != 600 {
		t.Errorf("DiskFit args %+v", args)
	}

	// The framework instruments plugins with the scheduler's metrics.
	schedmetrics.Register()
	client := fake.NewClientset()
	informerFactory := informers.NewSharedInformerFactory(client, 0)
	registry := plugins.NewInTreeRegistry()
	dfClient := dffake.NewSimpleClientset()
	if err := registry.Merge(frameworkruntime.Registry{diskfit.Name: func(ctx context.Context, obj apiruntime.Object, h fwk.Handle) (fwk.Plugin, error) {
		return diskfit.NewWithOptions(ctx, obj, h, diskfit.Options{DiskNodeClient: dfClient})
	}}); err != nil {
		t.Fatal(err)
	}
	fw, err := frameworkruntime.NewFramework(ctx, registry, prof,
		frameworkruntime.WithClientSet(client),
		frameworkruntime.WithInformerFactory(informerFactory),
		frameworkruntime.WithSnapshotSharedLister(internalcache.NewEmptySnapshot()))
	if err != nil {
		t.Fatalf("building the profile's framework: %v", err)
	}
	got := fw.ListPlugins()
	points := map[string][]schedconfig.Plugin{
		"preFilter": got.PreFilter.Enabled, "filter": got.Filter.Enabled, "preScore": got.PreScore.Enabled,
		"score": got.Score.Enabled, "reserve": got.Reserve.Enabled, "preBind": got.PreBind.Enabled,
	}
	for point, enabled := range points {
		names := make([]string, 0, len(enabled))
		for _, p := range enabled {
			names = append(names, p.Name)
		}
		if !slices.Contains(names, diskfit.Name) {
			t.Errorf("%s: DiskFit not enabled (%v)", point, names)
		}
		if slices.Contains(names, "VolumeBinding") {
			t.Errorf("%s: VolumeBinding still enabled (%v)", point, names)
		}
	}
}

func TestRegistry(t *testing.T) {
	if _, ok := Registry()[diskfit.Name]; !ok {
		t.Errorf("Registry() lacks %s", diskfit.Name)
	}
	if len(Options()) != 1 {
		t.Errorf("Options() = %d options, want 1", len(Options()))
	}
	if cmd := NewCommand(); cmd.Use != "diskfit-scheduler" || cmd.Flags().Lookup("config") == nil {
		t.Errorf("NewCommand() = %q without --config", cmd.Use)
	}
}
