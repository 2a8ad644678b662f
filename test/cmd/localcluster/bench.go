package main

import (
	"context"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/diskfit/diskfit/apis/client/clientset/versioned"
	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/test/cluster"
)

// benchWorkload fills about 80% of benchNodes: 30 replicas with two claims.
var benchWorkload = workload{replicas: 30, claims: []claimSpec{{"data", 512 << 20}, {"log", 300 << 20}}}

// benchNodes are five nodes with three 2Gi disks each.
func benchNodes() []cluster.NodeSpec {
	var nodes []cluster.NodeSpec
	for i := range 5 {
		n := cluster.NodeSpec{Name: fmt.Sprintf("node-%d", i)}
		for j := range 3 {
			n.Disks = append(n.Disks, cluster.DiskSpec{Name: fmt.Sprintf("ssd%d", j), SizeBytes: 2 << 30, FS: "xfs", DeviceClass: "ssd"})
		}
		nodes = append(nodes, n)
	}
	return nodes
}

// bench measures, on one local cluster and in one run, how long a
// StatefulSet takes from creation to all its claims bound under the diskfit
// scheduler and under the default scheduler, and how many ResourceExhausted
// retries each causes.
func bench(ctx context.Context, opts cluster.Options) error {
	opts.Nodes = benchNodes()
	// external-provisioner's own default, as in a cluster nobody tuned.
	opts.CapacityPollInterval = time.Minute
	step("Starting a local cluster with %d nodes of three 2Gi disks", len(opts.Nodes))
	c, err := cluster.Start(ctx, opts)
	if err != nil {
		return err
	}
	defer c.Stop()
	d := &demoRun{kube: kubernetes.NewForConfigOrDie(c.Config), disks: versioned.NewForConfigOrDie(c.Config)}
	if err := d.createClass(ctx); err != nil {
		return err
	}
	var results []outcome
	for _, scheduler := range []string{diskfit.SchedulerName, v1.DefaultSchedulerName} {
		step("StatefulSet with schedulerName %s: %d replicas x (%s)", scheduler, benchWorkload.replicas, benchWorkload.claimsText())
		res, err := d.runWorkload(ctx, scheduler, benchWorkload)
		if err != nil {
			return err
		}
		results = append(results, res)
		if err := d.cleanup(ctx, res.namespace); err != nil {
			return err
		}
	}
	step("Time from StatefulSet creation to the last claim bound (same cluster, same run)")
	w := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(w, "SCHEDULER\tPODS WITH ALL VOLUMES\tTIME TO LAST BIND\tRESOURCEEXHAUSTED RETRIES\tPODS HALF-PROVISIONED\tPODS PENDING")
	for _, r := range results {
		fmt.Fprintf(w, "%s\t%d/%d\t%s\t%d\t%d\t%d\n", r.scheduler, r.ready, benchWorkload.replicas,
			r.elapsed.Round(100*time.Millisecond), r.exhausted, r.stuck, r.pending)
	}
	return w.Flush()
}
