package diskfit

import (
	"context"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/volumebinding"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/scheduler-plugin/ledger"
	"github.com/diskfit/diskfit/scheduler-plugin/packing"
)

// diskBinder decorates VolumeBinding's Binder. AssumePodVolumes is where
// VolumeBinding copies each PVC to provision, sets selected-node on the copy
// and assumes it; PreBind later writes exactly those copies. Putting the
// reserved disk on the PVCs just before that copy makes the one PVC update
// carry selected-node and selected-disk together: no second write, no
// conflict, and the two can never disagree.
type diskBinder struct {
	volumebinding.SchedulerVolumeBinder
	ledger *ledger.Ledger
	// recorder is the profile's event recorder; nil (a framework built
	// without one, as in simulations) records nothing.
	recorder events.EventRecorder
}

// ReasonDiskSelected is the reason of the Normal event recorded on a claim
// when its disk is written to it.
const ReasonDiskSelected = "DiskSelected"

var _ volumebinding.SchedulerVolumeBinder = &diskBinder{}

// AssumePodVolumes annotates the claims DiskFit reserved for the pod on
// nodeName with their disks (overwriting a stale annotation from an earlier
// attempt) and then assumes them as VolumeBinding does.
func (b *diskBinder) AssumePodVolumes(logger klog.Logger, pod *v1.Pod, nodeName string, podVolumes *volumebinding.PodVolumes) (bool, error) {
	if podVolumes != nil {
		for i, dp := range podVolumes.DynamicProvisions {
			if dp == nil || dp.PVC == nil {
				continue
			}
			disk, ok := b.ledger.ReservedDisk(pod.UID, nodeName, string(dp.PVC.UID))
			if !ok || dp.PVC.Annotations[diskfit.SelectedDiskAnnotation] == disk {
				continue
			}
			// The PVC may point into the informer cache: never modify it.
			pvc := dp.PVC.DeepCopy()
			metav1.SetMetaDataAnnotation(&pvc.ObjectMeta, diskfit.SelectedDiskAnnotation, disk)
			podVolumes.DynamicProvisions[i] = &volumebinding.DynamicProvision{PVC: pvc, NodeCapacity: dp.NodeCapacity}
			logger.V(4).Info("Selected disk for claim", "pvc", klog.KObj(pvc), "node", nodeName, "disk", disk)
		}
	}
	return b.SchedulerVolumeBinder.AssumePodVolumes(logger, pod, nodeName, podVolumes)
}

// BindPodVolumes records a DiskSelected event on every claim that carries a
// disk DiskFit reserved for it, then lets VolumeBinding write the claims
// and wait until they are bound. The event is recorded before the write
// because the wait that follows it lasts until the volume is provisioned:
// recorded after, it would come after the provisioner's own events, and
// not at all when provisioning fails, which is when the disk matters most.
func (b *diskBinder) BindPodVolumes(ctx context.Context, pod *v1.Pod, podVolumes *volumebinding.PodVolumes) error {
	if b.recorder != nil && podVolumes != nil {
		for _, dp := range podVolumes.DynamicProvisions {
			if dp == nil || dp.PVC == nil {
				continue
			}
			// The node and disk the write carries.
			node := dp.PVC.Annotations[diskfit.SelectedNodeAnnotation]
			r, ok := b.ledger.Reservation(pod.UID, node, string(dp.PVC.UID))
			if !ok || dp.PVC.Annotations[diskfit.SelectedDiskAnnotation] != r.Disk {
				continue
			}
			b.recorder.Eventf(dp.PVC, pod, v1.EventTypeNormal, ReasonDiskSelected, "Binding",
				"disk %s on node %s (%s free before this claim)", r.Disk, node, packing.FormatBytes(r.FreeBefore))
		}
	}
	return b.SchedulerVolumeBinder.BindPodVolumes(ctx, pod, podVolumes)
}
