package diskfit

import (
	"context"
	"errors"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/diskfit/diskfit/scheduler-plugin/ledger"
)

// Reserve chooses a disk for each diskfit claim on the chosen node and
// holds the space in the ledger, then lets VolumeBinding assume the PVCs;
// the Binder decorator (binder.go) copies the chosen disks onto them. The
// disks are chosen again from the ledger as it is now, under its lock, so
// parallel cycles and the binding cycle can never double-book a disk.
func (pl *DiskFit) Reserve(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodeName string) *fwk.Status {
	logger := klog.FromContext(ctx)
	if s, err := pl.getState(cs); err == nil && len(s.claims) > 0 {
		if s.deferVolumeBinding {
			if status := pl.filterVolumeBinding(ctx, cs, pod, nodeName); !status.IsSuccess() {
				return status
			}
		}
		disks, err := pl.ledger.Reserve(pod.UID, nodeName, s.claims, pl.fit.Options)
		if err != nil {
			// Another pod took the space between Filter and Reserve. An
			// error, not Unschedulable, sends the pod to the backoff queue
			// to be placed again soon, elsewhere if need be: as
			// Unschedulable it would wait for an event saying space
			// appeared, and losing a race produces none.
			var noFit *ledger.ErrDoesNotFit
			if errors.As(err, &noFit) {
				filterRejections.WithLabelValues(reasonNoSpace).Inc()
			}
			return fwk.AsStatus(err)
		}
		reservationsHeld.Set(float64(pl.ledger.Reservations()))
		pl.waiting.remove(pod.UID)
		pl.waitingForDiskNode.remove(pod.UID)
		if logger.V(4).Enabled() {
			for i, c := range s.claims {
				logger.V(4).Info("Reserved disk", "pod", klog.KObj(pod), "pvc", c.Name, "node", nodeName, "disk", disks[i])
			}
		}
	}
	return pl.vb.Reserve(ctx, cs, pod, nodeName)
}

// Unreserve releases the pod's disk reservations and VolumeBinding's
// assumed objects. Both are idempotent. Freed space produces no API event,
// so pods that were rejected for lack of space are activated here.
func (pl *DiskFit) Unreserve(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodeName string) {
	pl.vb.Unreserve(ctx, cs, pod, nodeName)
	freed := pl.ledger.Unreserve(pod.UID)
	reservationsHeld.Set(float64(pl.ledger.Reservations()))
	if freed {
		pl.wake(&pl.waiting, "reservation released")
	}
}

// PreBind is VolumeBinding's: one PVC update sets selected-node and the
// selected disk together, then it waits for the volumes to be bound.
func (pl *DiskFit) PreBind(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodeName string) *fwk.Status {
	return pl.vb.PreBind(ctx, cs, pod, nodeName)
}
