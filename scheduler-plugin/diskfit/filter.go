package diskfit

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/diskfit/diskfit/scheduler-plugin/fit"
	"github.com/diskfit/diskfit/scheduler-plugin/packing"
)

// Filter passes a node only if all of the pod's unbound diskfit claims fit
// on its disks at once and VolumeBinding accepts the node for every other
// volume (for the chosen node only, in Reserve, when it would accept every
// node: deferred.go). The disk check runs first: it is cheap, and for a
// node that fits it keeps the node's disk score for Score.
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
		name := nodeInfo.Node().Name
		status, noSpace, score := pl.filterDisks(ctx, s.claims, name)
		if status != nil {
			// Recorded once per cycle and reason (waiting.go).
			if noSpace && s.waitingForSpace.CompareAndSwap(false, true) {
				pl.waiting.add(pod)
			}
			if !noSpace && s.waitingForDiskNode.CompareAndSwap(false, true) {
				pl.waitingForDiskNode.add(pod)
			}
			return status
		}
		s.diskScores.Store(name, score)
	}
	if s.deferVolumeBinding {
		return nil
	}
	return pl.vb.Filter(ctx, cs, pod, nodeInfo)
}

// filterDisks checks the disks of one node; nil means the claims fit, and
// score is then the node's disk score (score.go). noSpace tells a
// rejection for lack of space from one for a missing or stale DiskNode.
func (pl *DiskFit) filterDisks(ctx context.Context, claims []packing.Claim, node string) (status *fwk.Status, noSpace bool, score int64) {
	var buf fit.Buffers
	r := pl.fit.Evaluate(node, claims, &buf)
	if r.Reason == fit.Fits {
		return nil, false, minScore + pl.fit.Score(r, claims)
	}
	filterRejections.WithLabelValues(rejectionReasons[r.Reason]).Inc()
	reason := fmt.Sprintf("node %s: %s", node, pl.fit.Message(r, claims))
	klog.FromContext(ctx).V(5).Info("DiskFit rejected node", "node", node, "reason", reason)
	return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, reason), r.Reason == fit.NoSpace, 0
}

// rejectionReasons are the metric labels of the reasons a node does not fit.
var rejectionReasons = [...]string{
	fit.NoDiskNode:    reasonNoDiskNode,
	fit.StaleDiskNode: reasonStaleDiskNode,
	fit.NoSpace:       reasonNoSpace,
}
