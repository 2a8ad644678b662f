package e2e

import (
	"testing"
	"time"

	"k8s.io/client-go/discovery"

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
	dryRunApply(ctx, t, objs)
	if len(objs) < 40 {
		t.Errorf("the chart rendered only %d objects", len(objs))
	}
}
