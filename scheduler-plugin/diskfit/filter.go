package diskfit

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/diskfit/diskfit/scheduler-plugin/packing"
)

// Filter passes a node only if all of the pod's unbound diskfit claims fit
// on its disks at once and VolumeBinding accepts the node for every other
// volume. The disk check runs first: it is cheap and does not allocate when
// the node fits.
//
// Every rejection is UnschedulableAndUnresolvable, as VolumeBinding's own
// "not enough free storage": preemption evicts pods, and evicting a pod
// never frees disk space, because its PVCs and PVs outlive it. The pod waits
// in the unschedulable queue until an event (events.go) says space may have
// appeared.
func (pl *DiskFit) Filter(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodeInfo fwk.NodeInfo) *fwk.Status {
	s, err := pl.getState(cs)
	if err != nil {
		return fwk.AsStatus(err)
	}
	if len(s.claims) > 0 {
		if status, noSpace := pl.filterDisks(ctx, s.claims, nodeInfo.Node().Name); status != nil {
			// Recorded once per cycle and reason (waiting.go).
			if noSpace && s.waitingForSpace.CompareAndSwap(false, true) {
				pl.waiting.add(pod)
			}
			if !noSpace && s.waitingForDiskNode.CompareAndSwap(false, true) {
				pl.waitingForDiskNode.add(pod)
			}
			return status
		}
	}
	return pl.vb.Filter(ctx, cs, pod, nodeInfo)
}

// filterDisks checks the disks of one node; nil means the claims fit.
// noSpace tells a rejection for lack of space from one for a missing or
// stale DiskNode.
func (pl *DiskFit) filterDisks(ctx context.Context, claims []packing.Claim, node string) (status *fwk.Status, noSpace bool) {
	var diskBuf [packing.MaxInlineDisks]packing.Disk
	var assignBuf [16]int
	disks, info := pl.ledger.Disks(node, diskBuf[:0])
	if !info.HasDiskNode {
		filterRejections.WithLabelValues(reasonNoDiskNode).Inc()
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable,
			fmt.Sprintf("node %s: no DiskNode, the diskfit node plugin has not reported this node's disks", node)), false
	}
	if pl.maxAge > 0 {
		if age := pl.now().Sub(info.Observed); info.Observed.IsZero() || age > pl.maxAge {
			filterRejections.WithLabelValues(reasonStaleDiskNode).Inc()
			return fwk.NewStatus(fwk.UnschedulableAndUnresolvable,
				fmt.Sprintf("node %s: DiskNode is stale (observed %s ago, maximum %s)", node, age.Round(1e9), pl.maxAge)), false
		}
	}
	var assign []int
	if len(claims) > len(assignBuf) {
		assign = make([]int, len(claims))
	} else {
		assign = assignBuf[:len(claims)]
	}
	if packing.Pack(disks, claims, pl.opts, assign) {
		return nil, false
	}
	filterRejections.WithLabelValues(reasonNoSpace).Inc()
	reason := fmt.Sprintf("node %s: %s", node, packing.Explain(disks, claims))
	klog.FromContext(ctx).V(5).Info("DiskFit rejected node", "node", node, "reason", reason)
	return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, reason), true
}
