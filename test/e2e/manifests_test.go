package e2e

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// Every kustomization under manifests/ renders, and the API server accepts
// every object it renders (server-side apply, dry run): the kind and
// production overlays and the examples are valid for this Kubernetes.
// Components (manifests/scheduler/kube1.35, ...) are left to test/chart.
func TestManifestsApplyToTheAPIServer(t *testing.T) {
	ctx := ctxFor(t, 2*time.Minute)
	var dirs []string
	err := filepath.WalkDir("../../manifests", func(path string, d os.DirEntry, err error) error {
		if err != nil || d.Name() != "kustomization.yaml" {
			return err
		}
		// A Component renders only inside an overlay; test/chart renders
		// each one in the overlay it is for.
		raw, err := os.ReadFile(path)
		if err == nil && !regexp.MustCompile(`(?m)^kind: Component$`).Match(raw) {
			dirs = append(dirs, filepath.Dir(path))
		}
		return err
	})
	if err != nil || len(dirs) == 0 {
		t.Fatalf("no kustomizations under manifests/: %v", err)
	}
	// A dry run does not create the namespace the other objects go to.
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "diskfit-system"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	kustomizer := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	for _, dir := range dirs {
		t.Run(filepath.Base(filepath.Dir(dir))+"/"+filepath.Base(dir), func(t *testing.T) {
			resources, err := kustomizer.Run(filesys.MakeFsOnDisk(), dir)
			if err != nil {
				t.Fatalf("rendering %s: %v", dir, err)
			}
			if resources.Size() == 0 {
				t.Fatalf("%s renders nothing", dir)
			}
			objs := make([]*unstructured.Unstructured, 0, resources.Size())
			for _, r := range resources.Resources() {
				raw, err := r.AsYAML()
				if err != nil {
					t.Fatal(err)
				}
				obj := &unstructured.Unstructured{}
				if err := yaml.Unmarshal(raw, &obj.Object); err != nil {
					t.Fatal(err)
				}
				objs = append(objs, obj)
			}
			dryRunApply(ctx, t, objs)
		})
	}
}

// dryRunApply has the API server accept objs in a server-side apply dry
// run: schemas, CEL validation, RBAC, each object's kind known.
func dryRunApply(ctx context.Context, t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(restConfig)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(restConfig)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	for _, obj := range objs {
		gvk := obj.GroupVersionKind()
		mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Errorf("%s %s: unknown to the API server: %v", gvk.Kind, obj.GetName(), err)
			continue
		}
		var client dynamic.ResourceInterface = dyn.Resource(mapping.Resource)
		if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
			client = dyn.Resource(mapping.Resource).Namespace(obj.GetNamespace())
		}
		body, err := obj.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		_, err = client.Patch(ctx, obj.GetName(), types.ApplyPatchType, body, metav1.PatchOptions{
			FieldManager: "diskfit-e2e", Force: ptr.To(true), DryRun: []string{metav1.DryRunAll},
		})
		if err != nil {
			t.Errorf("%s %s/%s refused: %v", gvk.Kind, obj.GetNamespace(), obj.GetName(), err)
		}
	}
}

// The production overlay gives every container of the node DaemonSet a
// memory limit, and only the kubelet directory propagates mounts both
// ways: the driver mounts nothing elsewhere, so no other host path lets a
// mount made in the container reach the host.
func TestNodeDaemonSetLimitsAndPropagation(t *testing.T) {
	resources, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), "../../manifests/overlays/production")
	if err != nil {
		t.Fatal(err)
	}
	var ds *appsv1.DaemonSet
	for _, r := range resources.Resources() {
		if r.GetKind() != "DaemonSet" || r.GetName() != "diskfit-csi-node" {
			continue
		}
		raw, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		ds = &appsv1.DaemonSet{}
		if err := yaml.Unmarshal(raw, ds); err != nil {
			t.Fatal(err)
		}
	}
	if ds == nil {
		t.Fatal("the production overlay has no DaemonSet diskfit-csi-node")
	}
	want := map[string]v1.MountPropagationMode{
		"/var/lib/kubelet": v1.MountPropagationBidirectional,
		"/dev":             v1.MountPropagationHostToContainer,
		"/mnt/disks":       v1.MountPropagationHostToContainer,
	}
	for _, c := range ds.Spec.Template.Spec.Containers {
		if c.Resources.Limits.Memory().IsZero() {
			t.Errorf("container %s has no memory limit", c.Name)
		}
		for _, m := range c.VolumeMounts {
			got := ptr.Deref(m.MountPropagation, v1.MountPropagationNone)
			if w, ok := want[m.MountPath]; ok && c.Name == "diskfit-csi" {
				if got != w {
					t.Errorf("%s: %s propagates %s, want %s", c.Name, m.MountPath, got, w)
				}
			} else if got == v1.MountPropagationBidirectional {
				t.Errorf("%s: %s propagates Bidirectional", c.Name, m.MountPath)
			}
		}
	}
}
