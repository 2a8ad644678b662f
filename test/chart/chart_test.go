package chart

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/v2/lint"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
	schedscheme "k8s.io/kubernetes/pkg/scheduler/apis/config/scheme"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	nodeconfig "github.com/diskfit/diskfit/csi-driver/config"
	diskfitconfig "github.com/diskfit/diskfit/scheduler-plugin/apis/config"
	_ "github.com/diskfit/diskfit/scheduler-plugin/apis/config/scheme"
	configv1 "github.com/diskfit/diskfit/scheduler-plugin/apis/config/v1"
	"github.com/diskfit/diskfit/scheduler-plugin/apis/config/validation"
)

// root is the repository's root, from this package's directory.
const root = "../.."

// kustomize renders kustomizations (directories below the repository's
// root) with the kustomize kubectl embeds, and returns all their objects.
func kustomize(t *testing.T, dirs ...string) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	for _, dir := range dirs {
		objs = append(objs, kustomizeWith(t, krusty.MakeDefaultOptions(), filepath.Join(root, dir))...)
	}
	return objs
}

// kustomizeWith renders the kustomization in dir with opts.
func kustomizeWith(t *testing.T, opts *krusty.Options, dir string) []*unstructured.Unstructured {
	t.Helper()
	res, err := krusty.MakeKustomizer(opts).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize %s: %v", dir, err)
	}
	raw, err := res.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decode(dir, raw)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func render(t *testing.T, values map[string]any) []*unstructured.Unstructured {
	t.Helper()
	objs, err := Render(values)
	if err != nil {
		t.Fatalf("rendering the chart: %v", err)
	}
	return objs
}

func key(o *unstructured.Unstructured) string {
	gvk := o.GroupVersionKind()
	return gvk.GroupKind().String() + " " + o.GetNamespace() + "/" + o.GetName()
}

// helmLabels are the labels the chart adds for Helm's sake, with the value
// each must have: the comparison with kustomize removes them (and only
// them) from the chart's objects, after checking them.
func helmLabels(chartName string) map[string]string {
	return map[string]string{
		"helm.sh/chart":                chartName + "-0.1.0",
		"app.kubernetes.io/managed-by": "Helm",
		"app.kubernetes.io/instance":   ReleaseName,
	}
}

// partOf is the label kustomize's labels: adds to every object, CRDs
// included. The chart's CRDs are the files of crds/ as they are (Helm does
// not template crds/, and TestCRDsAreTheSameFiles keeps them identical to
// the kustomize sources), so they lack it: the comparison removes it from
// kustomize's CRDs.
const partOf = "app.kubernetes.io/part-of"

// assertSameObjects compares the chart's objects with kustomize's, object
// by object, after the two named normalizations above.
func assertSameObjects(t *testing.T, chart, kust []*unstructured.Unstructured) {
	t.Helper()
	want := map[string]*unstructured.Unstructured{}
	for _, o := range kust {
		o = o.DeepCopy()
		if o.GetKind() == "CustomResourceDefinition" {
			removeLabels(o, partOf)
		}
		if _, dup := want[key(o)]; dup {
			t.Fatalf("kustomize renders %s twice", key(o))
		}
		want[key(o)] = o
	}
	got := map[string]*unstructured.Unstructured{}
	for _, o := range chart {
		o = o.DeepCopy()
		if o.GetKind() != "CustomResourceDefinition" {
			labels := o.GetLabels()
			chartName := "diskfit"
			if labels["helm.sh/chart"] == "snapshot-0.1.0" {
				chartName = "snapshot"
			}
			for k, v := range helmLabels(chartName) {
				if labels[k] != v {
					t.Errorf("%s: label %s is %q, want %q", key(o), k, labels[k], v)
				}
				removeLabels(o, k)
			}
		}
		if _, dup := got[key(o)]; dup {
			t.Fatalf("the chart renders %s twice", key(o))
		}
		got[key(o)] = o
	}
	for k, w := range want {
		g, ok := got[k]
		if !ok {
			t.Errorf("the chart has no %s", k)
			continue
		}
		if diff := cmp.Diff(w.Object, g.Object); diff != "" {
			t.Errorf("%s differs (-kustomize +chart):\n%s", k, diff)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("the chart has %s, which kustomize does not", k)
		}
	}
}

// removeLabels removes labels from o, and its labels when none are left.
func removeLabels(o *unstructured.Unstructured, keys ...string) {
	labels := o.GetLabels()
	for _, k := range keys {
		delete(labels, k)
	}
	if len(labels) == 0 {
		unstructured.RemoveNestedField(o.Object, "metadata", "labels")
	} else {
		o.SetLabels(labels)
	}
}

// With its default values the chart installs what the production overlay
// installs, object by object: the scheduler's ConfigMap under the same
// hashed name, the CRD from crds/.
func TestDefaultsAreTheProductionOverlay(t *testing.T) {
	objs := render(t, nil)
	assertSameObjects(t, objs, kustomize(t, "manifests/overlays/production"))
	// In the order they can be applied: the CRDs, then the Namespace.
	var kinds []string
	for _, o := range objs[:min(2, len(objs))] {
		kinds = append(kinds, o.GetKind())
	}
	if !slices.Equal(kinds, []string{"CustomResourceDefinition", "Namespace"}) {
		t.Errorf("Render's objects begin with %v; want the CRD, then the Namespace", kinds)
	}
}

// webhook.enabled adds exactly manifests/webhook, snapshot.enabled exactly
// manifests/snapshot (its CRDs from the subchart's crds/).
func TestOptionsAreTheirKustomizations(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values map[string]any
		dirs   []string
	}{
		{"webhook", map[string]any{"webhook": map[string]any{"enabled": true}}, []string{"manifests/webhook"}},
		{"snapshot", map[string]any{"snapshot": map[string]any{"enabled": true}}, []string{"manifests/snapshot"}},
		{"both", map[string]any{"webhook": map[string]any{"enabled": true}, "snapshot": map[string]any{"enabled": true}},
			[]string{"manifests/webhook", "manifests/snapshot"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assertSameObjects(t, render(t, tc.values), kustomize(t, append([]string{"manifests/overlays/production"}, tc.dirs...)...))
		})
	}
}

// The chart's CRDs are the generated and vendored files, to the byte.
func TestCRDsAreTheSameFiles(t *testing.T) {
	for chartDir, source := range map[string]string{
		"crds":                 "manifests/base/crd",
		"charts/snapshot/crds": "manifests/snapshot/crd",
	} {
		want, err := filepath.Glob(filepath.Join(root, source, "*.yaml"))
		if err != nil || len(want) == 0 {
			t.Fatalf("no CRDs in %s: %v", source, err)
		}
		got, _ := filepath.Glob(filepath.Join(Dir(), chartDir, "*"))
		if names(got) != names(want) {
			t.Errorf("%s holds %s, want %s (as %s)", chartDir, names(got), names(want), source)
		}
		for _, w := range want {
			a, err := os.ReadFile(w)
			if err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(filepath.Join(Dir(), chartDir, filepath.Base(w)))
			if err != nil {
				t.Error(err)
				continue
			}
			if !bytes.Equal(a, b) {
				t.Errorf("%s/%s differs from %s; copy it (hack/update-codegen.sh does for the DiskNode CRD)", chartDir, filepath.Base(w), w)
			}
		}
	}
}

func names(paths []string) string {
	var n []string
	for _, p := range paths {
		n = append(n, filepath.Base(p))
	}
	slices.Sort(n)
	return strings.Join(n, ", ")
}

// find returns the object of that kind and name, failing the test when
// there is none.
func find(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && (o.GetName() == name || kind == "ConfigMap" && name == "diskfit-scheduler-config" && strings.HasPrefix(o.GetName(), name+"-")) {
			return o
		}
	}
	t.Fatalf("no %s %s", kind, name)
	return nil
}

func str(t *testing.T, o *unstructured.Unstructured, fields ...string) string {
	t.Helper()
	s, ok, err := unstructured.NestedString(o.Object, fields...)
	if !ok || err != nil {
		t.Fatalf("%s: no string at %v: %v", key(o), fields, err)
	}
	return s
}

// container returns a container of a Deployment's or DaemonSet's pods.
func container(t *testing.T, o *unstructured.Unstructured, name string) map[string]any {
	t.Helper()
	cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
	for _, c := range cs {
		if c := c.(map[string]any); c["name"] == name {
			return c
		}
	}
	t.Fatalf("%s has no container %s", key(o), name)
	return nil
}

// schedulerArgs decodes the scheduler ConfigMap's file as diskfit-scheduler
// does (kube-scheduler's scheme, strict, with DiskFitArgs registered and
// defaulted), and checks DiskFit's arguments with the plugin's validation.
func schedulerArgs(t *testing.T, objs []*unstructured.Unstructured) *diskfitconfig.DiskFitArgs {
	t.Helper()
	file := str(t, find(t, objs, "ConfigMap", "diskfit-scheduler-config"), "data", "diskfit-scheduler-config.yaml")
	obj, _, err := schedscheme.Codecs.UniversalDecoder().Decode([]byte(file), nil, nil)
	if err != nil {
		t.Fatalf("the scheduler configuration does not decode: %v\n%s", err, file)
	}
	cfg := obj.(*schedconfig.KubeSchedulerConfiguration)
	for _, p := range cfg.Profiles {
		for _, pc := range p.PluginConfig {
			if args, ok := pc.Args.(*diskfitconfig.DiskFitArgs); ok && p.SchedulerName == "diskfit-scheduler" {
				if err := validation.ValidateDiskFitArgs(nil, args); err != nil {
					t.Fatalf("DiskFit's arguments are invalid: %v", err)
				}
				return args
			}
		}
	}
	t.Fatalf("no DiskFit arguments in the scheduler configuration:\n%s", file)
	return nil
}

// With the default values the scheduler's configuration is
// manifests/scheduler/diskfit-scheduler-config.yaml to the byte, and it is
// what the plugin takes.
func TestSchedulerConfigIsTheShippedFile(t *testing.T) {
	objs := render(t, nil)
	want, err := os.ReadFile(filepath.Join(root, "manifests/scheduler/diskfit-scheduler-config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if got := str(t, find(t, objs, "ConfigMap", "diskfit-scheduler-config"), "data", "diskfit-scheduler-config.yaml"); got != string(want) {
		t.Errorf("the scheduler configuration is not the shipped file:\n%s", cmp.Diff(string(want), got))
	}
	schedulerArgs(t, objs)
}

// Values other than the defaults reach the objects, in a form the
// components take: the node config is the text given, which the driver
// decodes, another strategy and weights decode and validate as the
// scheduler's arguments and give the ConfigMap another name, which the
// Deployment mounts; images, StorageClasses, resources, priority classes
// and replicas follow their values.
func TestCustomValues(t *testing.T) {
	defaults := render(t, nil)
	values := map[string]any{
		"nodeConfig": `# fast disks everywhere, discovered ones where labelled
maxVolumes: 50
disks:
- name: fast0
  deviceClass: nvme
  path: /mnt/disks/fast0
  reserved: 1Gi

nodes:
- nodeSelector:
    matchLabels: {diskfit.io/disk-layout: discovered}
  discover:
    path: /mnt/disks
    deviceClass: ssd
`,
		"scheduler": map[string]any{
			"replicas":          3,
			"priorityClassName": "",
			"image":             map[string]any{"tag": "v0.2.0"},
			"pluginArgs": map[string]any{
				"scoringStrategy": map[string]any{
					"type":               "LeastAllocated",
					"deviceClassWeights": []any{map[string]any{"deviceClass": "nvme", "weight": 5}, map[string]any{"deviceClass": "hdd"}},
				},
				"maxExactClaims": 0,
			},
		},
		"node": map[string]any{
			"driver":      map[string]any{"image": map[string]any{"repository": "registry.example.com/diskfit-csi", "tag": "v0.2.0"}},
			"provisioner": map[string]any{"resources": nil},
		},
		"controller": map[string]any{"nodeLossGrace": "5m"},
		"storageClasses": []any{
			map[string]any{"name": "fast", "deviceClass": "nvme", "reclaimPolicy": "Retain", "isDefaultClass": true,
				"allowVolumeExpansion": false, "parameters": map[string]any{"diskfit.io/on-disk-loss": "release"}},
		},
	}
	before := fmt.Sprint(values)
	objs := render(t, values)
	if fmt.Sprint(values) != before {
		t.Error("Render changed the values it was given")
	}

	cfg, err := nodeconfig.Decode([]byte(str(t, find(t, objs, "ConfigMap", "diskfit-node-config"), "data", "node.yaml")))
	if err != nil {
		t.Fatalf("the node config does not decode: %v", err)
	}
	if len(cfg.Disks) != 1 || cfg.Disks[0].Name != "fast0" || len(cfg.Nodes) != 1 || cfg.Nodes[0].Discover == nil {
		t.Errorf("node config: %+v", cfg)
	}

	args := schedulerArgs(t, objs)
	wantStrategy := diskfitconfig.ScoringStrategy{Type: diskfitconfig.LeastAllocated, DeviceClassWeights: []diskfitconfig.DeviceClassWeight{{DeviceClass: "nvme", Weight: 5}, {DeviceClass: "hdd", Weight: 1}}}
	if diff := cmp.Diff(wantStrategy, args.ScoringStrategy); diff != "" {
		t.Errorf("scoring strategy (-want +got):\n%s", diff)
	}
	if args.MaxExactClaims != 0 || args.BindTimeoutSeconds != 600 {
		t.Errorf("maxExactClaims %d, bindTimeoutSeconds %d: want 0 (set) and 600 (default)", args.MaxExactClaims, args.BindTimeoutSeconds)
	}
	cm := find(t, objs, "ConfigMap", "diskfit-scheduler-config").GetName()
	if cm == find(t, defaults, "ConfigMap", "diskfit-scheduler-config").GetName() {
		t.Errorf("the changed configuration kept the ConfigMap name %s: the scheduler would not roll", cm)
	}
	sched := find(t, objs, "Deployment", "diskfit-scheduler")
	vols, _, _ := unstructured.NestedSlice(sched.Object, "spec", "template", "spec", "volumes")
	if mounted, _, _ := unstructured.NestedString(vols[0].(map[string]any), "configMap", "name"); mounted != cm {
		t.Errorf("the scheduler mounts %q, not %s", mounted, cm)
	}
	if got := container(t, sched, "diskfit-scheduler")["image"]; got != "ghcr.io/diskfit/diskfit-scheduler:v0.2.0" {
		t.Errorf("scheduler image %v", got)
	}
	if r, _, _ := unstructured.NestedInt64(sched.Object, "spec", "replicas"); r != 3 {
		t.Errorf("scheduler replicas %d, want 3", r)
	}
	if _, ok, _ := unstructured.NestedString(sched.Object, "spec", "template", "spec", "priorityClassName"); ok {
		t.Error("an empty priorityClassName is still written")
	}

	ds := find(t, objs, "DaemonSet", "diskfit-csi-node")
	if got := container(t, ds, "diskfit-csi")["image"]; got != "registry.example.com/diskfit-csi:v0.2.0" {
		t.Errorf("driver image %v", got)
	}
	if _, ok := container(t, ds, "csi-provisioner")["resources"]; ok {
		t.Error("csi-provisioner keeps resources after resources: null")
	}
	if got := container(t, ds, "csi-resizer")["resources"]; got == nil {
		t.Error("csi-resizer lost its resources")
	}
	args2, _, _ := unstructured.NestedStringSlice(container(t, find(t, objs, "Deployment", "diskfit-controller"), "diskfit-controller"), "args")
	if !slices.Contains(args2, "--node-loss-grace=5m") || !slices.Contains(args2, "--disk-failure-grace=10m") {
		t.Errorf("controller args %v", args2)
	}

	var classes []string
	for _, o := range objs {
		if o.GetKind() == "StorageClass" {
			classes = append(classes, o.GetName())
		}
	}
	if !slices.Equal(classes, []string{"fast"}) {
		t.Fatalf("StorageClasses %v, want [fast]", classes)
	}
	sc := find(t, objs, "StorageClass", "fast")
	want := map[string]any{
		"diskfit.io/device-class": "nvme", "diskfit.io/on-disk-loss": "release",
	}
	if got, _, _ := unstructured.NestedMap(sc.Object, "parameters"); !reflect.DeepEqual(got, want) {
		t.Errorf("parameters %v, want %v", got, want)
	}
	if sc.Object["reclaimPolicy"] != "Retain" || sc.Object["allowVolumeExpansion"] != false ||
		sc.GetAnnotations()["storageclass.kubernetes.io/is-default-class"] != "true" {
		t.Errorf("StorageClass fast: %v", sc.Object)
	}

	if got := str(t, find(t, objs, "ConfigMap", "diskfit-node-config"), "data", "node.yaml"); got != values["nodeConfig"] {
		t.Errorf("node.yaml is not the text given:\n%s", cmp.Diff(values["nodeConfig"], got))
	}
}

// Values the components would refuse, or the chart could not write, are
// refused at rendering, with a message that names the value.
func TestBadValuesAreRefused(t *testing.T) {
	args := func(a map[string]any) map[string]any {
		return map[string]any{"scheduler": map[string]any{"pluginArgs": a}}
	}
	for _, tc := range []struct {
		name   string
		values map[string]any
		want   []string // all in the error
	}{
		{"unknown strategy", args(map[string]any{"scoringStrategy": map[string]any{"type": "Packed"}}),
			[]string{"/scheduler/pluginArgs/scoringStrategy/type", "MostAllocated"}},
		{"weight 0", args(map[string]any{"scoringStrategy": map[string]any{"deviceClassWeights": []any{map[string]any{"deviceClass": "nvme", "weight": 0}}}}),
			[]string{"/scheduler/pluginArgs/scoringStrategy/deviceClassWeights/0/weight", "1"}},
		{"weight 101", args(map[string]any{"scoringStrategy": map[string]any{"deviceClassWeights": []any{map[string]any{"deviceClass": "nvme", "weight": 101}}}}),
			[]string{"/scheduler/pluginArgs/scoringStrategy/deviceClassWeights/0/weight", "100"}},
		{"device class weighed twice", args(map[string]any{"scoringStrategy": map[string]any{"deviceClassWeights": []any{
			map[string]any{"deviceClass": "nvme", "weight": 2}, map[string]any{"deviceClass": "nvme", "weight": 3}}}}),
			[]string{"deviceClassWeights", `"nvme" is listed twice`}},
		{"too many exact claims", args(map[string]any{"maxExactClaims": 17}), []string{"/scheduler/pluginArgs/maxExactClaims", "16"}},
		{"zero bind timeout", args(map[string]any{"bindTimeoutSeconds": 0}), []string{"/scheduler/pluginArgs/bindTimeoutSeconds"}},
		{"age not a duration", args(map[string]any{"maxDiskNodeAge": "5 minutes"}), []string{"/scheduler/pluginArgs/maxDiskNodeAge"}},
		{"unknown plugin argument", args(map[string]any{"maxExactClams": 4}), []string{"/scheduler/pluginArgs", "maxExactClams"}},
		{"misspelt component", map[string]any{"schedular": map[string]any{"replicas": 3}}, []string{"schedular"}},
		{"no node config", map[string]any{"nodeConfig": ""}, []string{"/nodeConfig"}},
		{"blank node config", map[string]any{"nodeConfig": "\n  \n"}, []string{"nodeConfig is empty"}},
		{"node config as values", map[string]any{"nodeConfig": map[string]any{"maxVolumes": 5}}, []string{"/nodeConfig", "string"}},
		{"bad image tag", map[string]any{"scheduler": map[string]any{"image": map[string]any{"tag": "v1 beta"}}}, []string{"/scheduler/image/tag"}},
		{"no image repository", map[string]any{"controller": map[string]any{"image": map[string]any{"repository": ""}}}, []string{"/controller/image/repository"}},
		{"zero replicas", map[string]any{"controller": map[string]any{"replicas": 0}}, []string{"/controller/replicas"}},
		{"StorageClass without a name", map[string]any{"storageClasses": []any{map[string]any{"deviceClass": "nvme"}}}, []string{"/storageClasses/0", "name"}},
		{"StorageClass named badly", map[string]any{"storageClasses": []any{map[string]any{"name": "Fast_Disks"}}}, []string{"/storageClasses/0/name"}},
		{"StorageClass twice", map[string]any{"storageClasses": []any{map[string]any{"name": "a"}, map[string]any{"name": "a"}}}, []string{`"a" is listed twice`}},
		{"device class as a parameter", map[string]any{"storageClasses": []any{map[string]any{"name": "a", "parameters": map[string]any{"diskfit.io/device-class": "nvme"}}}},
			[]string{"set deviceClass"}},
		{"unknown reclaim policy", map[string]any{"storageClasses": []any{map[string]any{"name": "a", "reclaimPolicy": "Keep"}}}, []string{"/storageClasses/0/reclaimPolicy"}},
		{"snapshot deletion policy", map[string]any{"snapshot": map[string]any{"enabled": true, "volumeSnapshotClass": map[string]any{"deletionPolicy": "Keep"}}},
			[]string{"/snapshot/volumeSnapshotClass/deletionPolicy"}},
		{"webhook not a boolean", map[string]any{"webhook": map[string]any{"enabled": "yes"}}, []string{"/webhook/enabled"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Render(tc.values)
			if err == nil {
				t.Fatal("rendered")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("the error does not say %q:\n%v", w, err)
				}
			}
		})
	}
}

// Every DiskFit argument has a value in the chart: the schema of
// scheduler.pluginArgs lists exactly DiskFitArgs' fields.
func TestPluginArgsCoverDiskFitArgs(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(Dir(), "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Properties struct {
			Scheduler struct {
				Properties struct {
					PluginArgs struct {
						Properties map[string]any `json:"properties"`
					} `json:"pluginArgs"`
				} `json:"properties"`
			} `json:"scheduler"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(raw, &schema); err != nil {
		t.Fatal(err)
	}
	var inChart, fields []string
	for k := range schema.Properties.Scheduler.Properties.PluginArgs.Properties {
		inChart = append(inChart, k)
	}
	typ := reflect.TypeFor[configv1.DiskFitArgs]()
	for i := range typ.NumField() {
		if name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ","); name != "" {
			fields = append(fields, name)
		}
	}
	slices.Sort(inChart)
	slices.Sort(fields)
	if !slices.Equal(inChart, fields) {
		t.Errorf("scheduler.pluginArgs in values.schema.json: %v; DiskFitArgs: %v", inChart, fields)
	}
}

// helm lint's rules (Chart.yaml, values and schema, templates, the
// dependencies in charts/, the CRDs) find nothing to warn about, with the
// options off and on.
func TestHelmLint(t *testing.T) {
	kv, err := common.ParseKubeVersion(KubeVersion)
	if err != nil {
		t.Fatal(err)
	}
	for name, values := range map[string]map[string]any{
		"defaults":     nil,
		"with options": {"webhook": map[string]any{"enabled": true}, "snapshot": map[string]any{"enabled": true}},
	} {
		for _, m := range lint.RunAll(Dir(), values, Namespace, lint.WithKubeVersion(kv)).Messages {
			if m.Severity >= support.WarningSev {
				t.Errorf("helm lint, %s: %s", name, m)
			} else {
				t.Logf("helm lint, %s: %s", name, m)
			}
		}
	}
}

// TestSchedulerImageFollowsTheClusterMinor: kube-scheduler must not be newer
// than the API server, so without a tag the chart installs the scheduler
// built for the cluster's minor (each older minor hack/kube-minor.sh builds
// has its -kubeMINOR tag, also for providers' and pre-release versions),
// the newest build on the newest minor and the one after it, and refuses
// clusters no build may serve; a tag in the values is used as it is.
func TestSchedulerImageFollowsTheClusterMinor(t *testing.T) {
	out, err := exec.Command(filepath.Join(root, "hack", "kube-minor.sh"), "list").Output()
	if err != nil {
		t.Fatalf("hack/kube-minor.sh list: %v", err)
	}
	older := strings.Fields(string(out))
	if len(older) == 0 {
		t.Fatal("hack/kube-minor.sh lists no older minor")
	}
	want := map[string]string{"v1.37.2": "v0.1.0", "v1.38.0": "v0.1.0", "v1.38.0-alpha.1": "v0.1.0"}
	for _, minor := range older {
		want["v"+minor+".4"] = "v0.1.0-kube" + minor
		want["v"+minor+".2-eks-4d2a7c1"] = "v0.1.0-kube" + minor // a provider's build
		want["v"+minor+".0-rc.1"] = "v0.1.0-kube" + minor
	}
	image := func(objs []*unstructured.Unstructured) string {
		return container(t, find(t, objs, "Deployment", "diskfit-scheduler"), "diskfit-scheduler")["image"].(string)
	}
	for version, tag := range want {
		objs, err := RenderFor(version, nil)
		if err != nil {
			t.Errorf("Kubernetes %s: %v", version, err)
			continue
		}
		if got := image(objs); got != "ghcr.io/diskfit/diskfit-scheduler:"+tag {
			t.Errorf("Kubernetes %s: scheduler image %s, want tag %s", version, got, tag)
		}
	}
	for _, version := range []string{"v1.34.9", "v1.39.0"} {
		// 1.34: no build; 1.39: the newest build would be two minors older.
		if _, err := RenderFor(version, nil); err == nil {
			t.Errorf("the chart installs on Kubernetes %s, which no scheduler build may serve", version)
		}
	}
	objs, err := RenderFor("v"+older[0]+".0", map[string]any{"scheduler": map[string]any{"image": map[string]any{"tag": "v0.2.0"}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := image(objs); got != "ghcr.io/diskfit/diskfit-scheduler:v0.2.0" {
		t.Errorf("with tag v0.2.0 the scheduler image is %s", got)
	}
}

// On an older minor the chart installs what the production overlay with
// that minor's scheduler component (manifests/scheduler/kubeMINOR)
// installs.
func TestOlderMinorsAreTheProductionOverlayWithTheirComponent(t *testing.T) {
	out, err := exec.Command(filepath.Join(root, "hack", "kube-minor.sh"), "list").Output()
	if err != nil {
		t.Fatalf("hack/kube-minor.sh list: %v", err)
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, minor := range strings.Fields(string(out)) {
		t.Run(minor, func(t *testing.T) {
			dir := t.TempDir()
			repo, err := filepath.Rel(dir, abs) // kustomize takes no absolute paths
			if err != nil {
				t.Fatal(err)
			}
			overlay := fmt.Sprintf("resources:\n- %s/manifests/overlays/production\ncomponents:\n- %s/manifests/scheduler/kube%s\n", repo, repo, minor)
			if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(overlay), 0o644); err != nil {
				t.Fatal(err)
			}
			opts := krusty.MakeDefaultOptions()
			opts.LoadRestrictions = types.LoadRestrictionsNone // paths outside dir
			kust := kustomizeWith(t, opts, dir)
			chart, err := RenderFor("v"+minor+".0", nil)
			if err != nil {
				t.Fatal(err)
			}
			assertSameObjects(t, chart, kust)
		})
	}
}
