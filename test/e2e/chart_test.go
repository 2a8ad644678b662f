package e2e

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"k8s.io/utils/ptr"

	"github.com/diskfit/diskfit/test/chart"
)

// TestChartPassesServerSideDryRun: the API server accepts every object the
// Helm chart renders, with the webhook and snapshot parts on, in a
// server-side apply dry run: schemas, the admission policies' CEL, the
// snapshot class against its CRD, RBAC. (test/chart checks that the chart
// renders what the manifests hold; this checks that a cluster takes it.)
func TestChartPassesServerSideDryRun(t *testing.T) {
	ctx := ctxFor(t, 2*time.Minute)
	disc, err := discovery.NewDiscoveryClientForConfig(restConfig)
	if err != nil {
		t.Fatal(err)
	}
	// A dry run creates no CRD, so the snapshot class can only be checked
	// where the snapshot CRDs are installed already (the local cluster).
	_, err = disc.ServerResourcesForGroupVersion("snapshot.storage.k8s.io/v1")
	snapshots := err == nil
	if !snapshots {
		t.Logf("the cluster serves no snapshot.storage.k8s.io/v1 (%v): checking the chart without snapshot.enabled", err)
	}
	objs, err := chart.Render(map[string]any{
		"webhook":  map[string]any{"enabled": true},
		"snapshot": map[string]any{"enabled": snapshots},
	})
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(restConfig)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc))
	for _, obj := range objs {
		gvk := obj.GroupVersionKind()
		what := gvk.Kind + " " + obj.GetNamespace() + "/" + obj.GetName()
		mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Errorf("%s: %v", what, err)
			continue
		}
		var client dynamic.ResourceInterface = dyn.Resource(mapping.Resource)
		if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
			client = dyn.Resource(mapping.Resource).Namespace(obj.GetNamespace())
		}
		data, err := obj.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := client.Patch(ctx, obj.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{
			FieldManager: "diskfit-chart-dry-run", Force: ptr.To(true), DryRun: []string{metav1.DryRunAll},
		}); err != nil {
			t.Errorf("%s refused: %v", what, err)
		}
	}
	if len(objs) < 40 {
		t.Errorf("the chart rendered only %d objects", len(objs))
	}
}
