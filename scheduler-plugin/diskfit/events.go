package diskfit

import (
	"context"
	"fmt"
	"sync"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/util"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
)

// EventsToRegister returns VolumeBinding's events, narrowed where they
// cannot help a pod DiskFit rejected, plus those that can free disk space
// (a DiskNode reporting more room or becoming fresh again, a diskfit PV or
// annotated PVC deleted, a PVC losing its selected-node: a reschedule
// releases its disk) and those that can locate the snapshot a claim
// restores (a VolumeSnapshot or VolumeSnapshotContent created or
// changed). StorageClass and Node additions are already among
// VolumeBinding's events.
//
// VolumeBinding queues every pod it rejected on any PV added or updated,
// and on new CSIStorageCapacity. Neither can make room on a disk: a diskfit
// PV only ever takes space, and DiskFit does not use CSIStorageCapacity for
// its claims. Those events are skipped for diskfit's objects, so pods that
// lost the race for space are not retried every time a winner's volume is
// provisioned; events about other drivers' objects queue as before.
//
// The hints only decide. The ledger is fed by the plugin's own handlers
// (feed.go), which the scheduler's run independently of: a pod a hint
// retries before the ledger saw the change fails again, waits, and is
// activated by the feed once it has the change.
func (pl *DiskFit) EventsToRegister(ctx context.Context) ([]fwk.ClusterEventWithHint, error) {
	events, err := pl.vb.EventsToRegister(ctx)
	if err != nil {
		return nil, fmt.Errorf("VolumeBinding events: %w", err)
	}
	for i := range events {
		e := &events[i]
		switch e.Event.Resource {
		case fwk.PersistentVolumeClaim:
			if e.Event.ActionType&fwk.Update != 0 {
				e.QueueingHintFn = pl.pvcUpdateHint(e.QueueingHintFn)
			}
		case fwk.PersistentVolume:
			e.QueueingHintFn = skipDiskFitPVs(e.QueueingHintFn)
		case fwk.CSIStorageCapacity:
			e.QueueingHintFn = pl.skipDiskFitCapacities(e.QueueingHintFn)
		}
	}
	events = append(events,
		fwk.ClusterEventWithHint{Event: fwk.ClusterEvent{Resource: DiskNodeResource, ActionType: fwk.Add | fwk.Update}, QueueingHintFn: pl.isSchedulableAfterDiskNodeChange},
		fwk.ClusterEventWithHint{Event: fwk.ClusterEvent{Resource: fwk.PersistentVolume, ActionType: fwk.Delete}, QueueingHintFn: pl.isSchedulableAfterPVDelete},
		fwk.ClusterEventWithHint{Event: fwk.ClusterEvent{Resource: fwk.PersistentVolumeClaim, ActionType: fwk.Delete}, QueueingHintFn: pl.isSchedulableAfterPVCDelete},
	)
	if pl.watchSnapshots {
		events = append(events,
			fwk.ClusterEventWithHint{Event: fwk.ClusterEvent{Resource: volumeSnapshotEvents, ActionType: fwk.Add | fwk.Update}, QueueingHintFn: pl.isSchedulableAfterSnapshotChange},
			fwk.ClusterEventWithHint{Event: fwk.ClusterEvent{Resource: volumeSnapshotContentEvents, ActionType: fwk.Add | fwk.Update}, QueueingHintFn: pl.isSchedulableAfterSnapshotContentChange},
		)
	}
	return events, nil
}

// isSchedulableAfterSnapshotChange queues a pod that restores the
// VolumeSnapshot: one created or changed (bound to its content) may now be
// located (source.go).
func (pl *DiskFit) isSchedulableAfterSnapshotChange(logger klog.Logger, pod *v1.Pod, _, newObj interface{}) (fwk.QueueingHint, error) {
	snap, ok := newObj.(*unstructured.Unstructured)
	if !ok {
		return fwk.Queue, fmt.Errorf("unexpected VolumeSnapshot object %T", newObj)
	}
	if !pl.copies(pod, snapshotGroup, "VolumeSnapshot", snap.GetNamespace(), snap.GetName()) {
		return fwk.QueueSkip, nil
	}
	logger.V(5).Info("VolumeSnapshot the pod restores changed, which may make the pod schedulable", "pod", klog.KObj(pod), "volumeSnapshot", klog.KObj(snap))
	return fwk.Queue, nil
}

// isSchedulableAfterSnapshotContentChange queues a pod that restores the
// VolumeSnapshot the content belongs to: its handle and node label are
// where the restore goes.
func (pl *DiskFit) isSchedulableAfterSnapshotContentChange(logger klog.Logger, pod *v1.Pod, _, newObj interface{}) (fwk.QueueingHint, error) {
	content, ok := newObj.(*unstructured.Unstructured)
	if !ok {
		return fwk.Queue, fmt.Errorf("unexpected VolumeSnapshotContent object %T", newObj)
	}
	namespace, _, _ := unstructured.NestedString(content.Object, "spec", "volumeSnapshotRef", "namespace")
	name, _, _ := unstructured.NestedString(content.Object, "spec", "volumeSnapshotRef", "name")
	if !pl.copies(pod, snapshotGroup, "VolumeSnapshot", namespace, name) {
		return fwk.QueueSkip, nil
	}
	logger.V(5).Info("VolumeSnapshotContent of the snapshot the pod restores changed, which may make the pod schedulable", "pod", klog.KObj(pod), "volumeSnapshotContent", klog.KObj(content))
	return fwk.Queue, nil
}

// toDiskNode accepts typed DiskNodes and the unstructured objects the
// scheduler's dynamic informers deliver.
func (pl *DiskFit) toDiskNode(obj interface{}) (*v1alpha1.DiskNode, error) {
	switch o := obj.(type) {
	case nil:
		return nil, nil
	case *v1alpha1.DiskNode:
		return o, nil
	case *unstructured.Unstructured:
		return pl.conversions.convert(o)
	default:
		return nil, fmt.Errorf("unexpected DiskNode object %T", obj)
	}
}

// diskNodeConversions remembers the last conversions from unstructured: the
// queue calls the hint once per pending pod with the same old and new
// objects, and converting each time would cost a conversion per pod.
type diskNodeConversions struct {
	mu   sync.Mutex
	src  [2]*unstructured.Unstructured
	dn   [2]*v1alpha1.DiskNode
	next int
}

func (c *diskNodeConversions) convert(u *unstructured.Unstructured) (*v1alpha1.DiskNode, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range c.src {
		if c.src[i] == u {
			return c.dn[i], nil
		}
	}
	dn := &v1alpha1.DiskNode{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, dn); err != nil {
		return nil, fmt.Errorf("converting DiskNode %s: %w", u.GetName(), err)
	}
	c.src[c.next], c.dn[c.next] = u, dn
	c.next = (c.next + 1) % len(c.src)
	return dn, nil
}

// isSchedulableAfterDiskNodeChange queues the pod when a node's disks may
// hold more than before: a new DiskNode, a disk that is new, newly healthy
// or back in service, freer or of another class, or a status that was stale and is fresh again.
func (pl *DiskFit) isSchedulableAfterDiskNodeChange(logger klog.Logger, pod *v1.Pod, oldObj, newObj interface{}) (fwk.QueueingHint, error) {
	oldDN, err := pl.toDiskNode(oldObj)
	if err != nil {
		return fwk.Queue, err
	}
	newDN, err := pl.toDiskNode(newObj)
	if err != nil || newDN == nil {
		return fwk.Queue, err
	}
	logger = klog.LoggerWithValues(logger, "pod", klog.KObj(pod), "diskNode", klog.KObj(newDN))
	if oldDN == nil {
		logger.V(5).Info("DiskNode created, which may make the pod schedulable")
		return fwk.Queue, nil
	}
	if pl.freshAgain(oldDN, newDN) {
		logger.V(5).Info("DiskNode is fresh again, which may make the pod schedulable")
		return fwk.Queue, nil
	}
	if moreRoom(oldDN, newDN) {
		logger.V(5).Info("DiskNode reports more usable space, which may make the pod schedulable")
		return fwk.Queue, nil
	}
	logger.V(5).Info("DiskNode changed without freeing space")
	return fwk.QueueSkip, nil
}

// freshAgain reports whether a DiskNode that was too old to place volumes
// on is recent again.
func (pl *DiskFit) freshAgain(oldDN, newDN *v1alpha1.DiskNode) bool {
	now := pl.now()
	return oldDN.Status.Stale(now, pl.fit.MaxAge) && !newDN.Status.Stale(now, pl.fit.MaxAge)
}

// moreRoom reports whether a disk of newDN that takes new volumes (healthy,
// not taken out of service by the spec) is new, newly open, freer, larger
// or of another class than in oldDN. The ledger's room on a disk is the
// smaller of its reported free space and its capacity less what is placed
// on it, so either growing can make room. Capacity grows alone when a
// report came between a volume's deletion and the filesystem freeing its
// blocks in the background (XFS does), and a new volume took the freed
// space meanwhile: the free space stays, the capacity comes back. A
// capacity that only moves with filesystem metadata costs at most a
// needless retry.
func moreRoom(oldDN, newDN *v1alpha1.DiskNode) bool {
	open := func(dn *v1alpha1.DiskNode, d *v1alpha1.DiskStatus) bool {
		out, _ := dn.Spec.DiskUnschedulable(d.Name)
		return d.Healthy && !out
	}
	for i := range newDN.Status.Disks {
		n := &newDN.Status.Disks[i]
		if !open(newDN, n) {
			continue
		}
		o := oldDN.Status.Disk(n.Name)
		if o == nil || !open(oldDN, o) || n.FreeBytes > o.FreeBytes || n.CapacityBytes > o.CapacityBytes || n.DeviceClass != o.DeviceClass {
			return true
		}
	}
	return false
}

// isSchedulableAfterPVDelete queues the pod when a diskfit PV, and so its
// space on a disk, is gone.
func (pl *DiskFit) isSchedulableAfterPVDelete(logger klog.Logger, pod *v1.Pod, oldObj, _ interface{}) (fwk.QueueingHint, error) {
	pv, ok := tombstone[*v1.PersistentVolume](oldObj)
	if !ok {
		return fwk.Queue, fmt.Errorf("unexpected PV object %T", oldObj)
	}
	if _, ours := diskfit.PVLocation(pv); !ours {
		return fwk.QueueSkip, nil
	}
	logger.V(5).Info("diskfit PV deleted, which may make the pod schedulable", "pod", klog.KObj(pod), "pv", klog.KObj(pv))
	return fwk.Queue, nil
}

// isSchedulableAfterPVCDelete queues the pod when a PVC that held a disk
// without a PV yet is gone. A PVC whose class is not the diskfit driver's
// held nothing, however it was annotated.
func (pl *DiskFit) isSchedulableAfterPVCDelete(logger klog.Logger, pod *v1.Pod, oldObj, _ interface{}) (fwk.QueueingHint, error) {
	pvc, ok := tombstone[*v1.PersistentVolumeClaim](oldObj)
	if !ok {
		return fwk.Queue, fmt.Errorf("unexpected PVC object %T", oldObj)
	}
	if _, placed := pl.ledger.CountedPVCLocation(pvc); !placed {
		return fwk.QueueSkip, nil
	}
	logger.V(5).Info("placed PVC deleted, which may make the pod schedulable", "pod", klog.KObj(pod), "pvc", klog.KObj(pvc))
	return fwk.Queue, nil
}

// pvcUpdateHint keeps VolumeBinding's hint and adds two cases: an unbound
// PVC that lost its selected-node (external-provisioner asking for a
// reschedule) no longer holds its disk, and a PVC the pod clones that got
// its volume can now be located (source.go).
func (pl *DiskFit) pvcUpdateHint(vbHint fwk.QueueingHintFn) fwk.QueueingHintFn {
	return func(logger klog.Logger, pod *v1.Pod, oldObj, newObj interface{}) (fwk.QueueingHint, error) {
		if vbHint != nil {
			if hint, err := vbHint(logger, pod, oldObj, newObj); err != nil || hint == fwk.Queue {
				return hint, err
			}
		} else {
			return fwk.Queue, nil
		}
		oldPVC, newPVC, err := util.As[*v1.PersistentVolumeClaim](oldObj, newObj)
		if err != nil {
			return fwk.Queue, err
		}
		if oldPVC == nil {
			return fwk.QueueSkip, nil
		}
		_, wasPlaced := pl.ledger.CountedPVCLocation(oldPVC)
		_, isPlaced := diskfit.PVCLocation(newPVC)
		if wasPlaced && !isPlaced && newPVC.Spec.VolumeName == "" {
			logger.V(5).Info("PVC released its disk, which may make the pod schedulable", "pod", klog.KObj(pod), "pvc", klog.KObj(newPVC))
			return fwk.Queue, nil
		}
		if oldPVC.Spec.VolumeName == "" && newPVC.Spec.VolumeName != "" && pl.copies(pod, "", "PersistentVolumeClaim", newPVC.Namespace, newPVC.Name) {
			logger.V(5).Info("PVC the pod clones is bound, which may make the pod schedulable", "pod", klog.KObj(pod), "pvc", klog.KObj(newPVC))
			return fwk.Queue, nil
		}
		return fwk.QueueSkip, nil
	}
}

// skipDiskFitPVs keeps VolumeBinding's PV hint (none: always queue) for PVs
// of other drivers and skips diskfit's.
func skipDiskFitPVs(vbHint fwk.QueueingHintFn) fwk.QueueingHintFn {
	return func(logger klog.Logger, pod *v1.Pod, oldObj, newObj interface{}) (fwk.QueueingHint, error) {
		if pv, ok := newObj.(*v1.PersistentVolume); ok && diskfit.IsDiskFitPV(pv) {
			logger.V(5).Info("diskfit PV added or updated, which frees no space", "pod", klog.KObj(pod), "pv", klog.KObj(pv))
			return fwk.QueueSkip, nil
		}
		if vbHint == nil {
			return fwk.Queue, nil
		}
		return vbHint(logger, pod, oldObj, newObj)
	}
}

// skipDiskFitCapacities keeps VolumeBinding's CSIStorageCapacity hint for
// other drivers' StorageClasses and skips diskfit's.
func (pl *DiskFit) skipDiskFitCapacities(vbHint fwk.QueueingHintFn) fwk.QueueingHintFn {
	return func(logger klog.Logger, pod *v1.Pod, oldObj, newObj interface{}) (fwk.QueueingHint, error) {
		if c, ok := newObj.(*storagev1.CSIStorageCapacity); ok {
			if sc, err := pl.scLister.Get(c.StorageClassName); err == nil && diskfit.IsDiskFitClass(sc) {
				return fwk.QueueSkip, nil
			}
		}
		if vbHint == nil {
			return fwk.Queue, nil
		}
		return vbHint(logger, pod, oldObj, newObj)
	}
}
