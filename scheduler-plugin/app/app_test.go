package app

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	apiruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"
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
	"github.com/diskfit/diskfit/scheduler-plugin/apis/config/validation"
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
	if args.ScoringStrategy.Type != config.MostAllocated || args.MaxDiskNodeAge.Duration != 5*time.Minute || args.MaxExactClaims != 16 || args.BindTimeoutSeconds != 600 {
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
		frameworkruntime.WithSnapshotSharedLister(internalcache.NewEmptySnapshot()),
		// No scheduling queue here: nothing to activate.
		frameworkruntime.WithPodActivator(noQueue{}))
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

// TestConfigArgsZeros decodes DiskFit args from configuration files the way
// kube-scheduler does (default, then convert) and validates them as the
// plugin does: an omitted field takes its default, and an explicit zero has
// the one meaning documented per field (0 bindTimeoutSeconds rejected, 0s
// maxDiskNodeAge and 0 maxExactClaims turn their check off).
func TestConfigArgsZeros(t *testing.T) {
	tests := []struct {
		name    string
		args    string
		want    config.DiskFitArgs
		wantErr string
	}{
		{name: "omitted fields take the defaults", args: "{}", want: config.DiskFitArgs{
			BindTimeoutSeconds: 600, ScoringStrategy: config.ScoringStrategy{Type: config.MostAllocated},
			MaxDiskNodeAge: metav1.Duration{Duration: 5 * time.Minute}, MaxExactClaims: 16,
		}},
		{name: "explicit zeros turn checks off", args: "{maxDiskNodeAge: 0s, maxExactClaims: 0, scoringStrategy: {type: LeastAllocated, deviceClassWeights: [{deviceClass: ssd}]}}",
			want: config.DiskFitArgs{
				BindTimeoutSeconds: 600,
				ScoringStrategy:    config.ScoringStrategy{Type: config.LeastAllocated, DeviceClassWeights: []config.DeviceClassWeight{{DeviceClass: "ssd", Weight: 1}}},
			}},
		{name: "zero bind timeout is rejected", args: "{bindTimeoutSeconds: 0}", want: config.DiskFitArgs{
			ScoringStrategy: config.ScoringStrategy{Type: config.MostAllocated},
			MaxDiskNodeAge:  metav1.Duration{Duration: 5 * time.Minute}, MaxExactClaims: 16,
		}, wantErr: "args.bindTimeoutSeconds: Invalid value: 0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			logger, _ := ktesting.NewTestContext(t)
			file := filepath.Join(t.TempDir(), "config.yaml")
			cfg := "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nprofiles:\n" +
				"- schedulerName: diskfit-scheduler\n  pluginConfig:\n  - name: DiskFit\n    args: " + tc.args + "\n"
			if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
				t.Fatal(err)
			}
			loaded, err := options.LoadConfigFromFile(logger, file)
			if err != nil {
				t.Fatal(err)
			}
			var args *config.DiskFitArgs
			for _, pc := range loaded.Profiles[0].PluginConfig {
				if a, ok := pc.Args.(*config.DiskFitArgs); ok {
					args = a
				}
			}
			if args == nil {
				t.Fatal("no DiskFit args decoded")
			}
			if diff := cmp.Diff(&tc.want, args, cmpopts.IgnoreTypes(metav1.TypeMeta{})); diff != "" {
				t.Errorf("decoded args (-want +got):\n%s", diff)
			}
			err = validation.ValidateDiskFitArgs(nil, args)
			if tc.wantErr == "" && err != nil {
				t.Errorf("unexpected error: %v", err)
			}
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

// noQueue is the pod activator of a framework without a scheduling queue.
type noQueue struct{}

func (noQueue) Activate(klog.Logger, map[string]*v1.Pod) {}
