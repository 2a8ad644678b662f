package diskfit

import (
	"context"
	"errors"
	"fmt"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/diskfit/diskfit/apis/client/clientset/versioned"
	"github.com/diskfit/diskfit/apis/client/informers/externalversions"
	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
)

// The ledger is fed here, and only here, from informers: the scheduler's
// shared PV, PVC and StorageClass informers and the plugin's own DiskNode
// informer. (Reserve and Unreserve add and drop the plugin's own
// reservations.) Each change that may let a pod DiskFit rejected fit also
// activates the pods waiting for it (waiting.go). The queueing hints
// (events.go) see the same API events through the scheduler's own
// handlers, in no fixed order with these: they only decide whether a pod
// is worth retrying, and a pod they retry before the change reaches the
// ledger is rejected again, waits, and is activated here.

// startFeeds registers the ledger's handlers on the scheduler's shared
// informers, which the scheduler starts after all plugins are built, then
// starts the DiskNode informer and waits until the ledger has every node's
// disks, so the first Filter sees them.
func (pl *DiskFit) startFeeds(ctx context.Context, h fwk.Handle, client versioned.Interface) error {
	f := h.SharedInformerFactory()
	for _, feed := range []struct {
		what     string
		informer cache.SharedIndexInformer
		handler  cache.ResourceEventHandlerFuncs
	}{
		{"PVs", f.Core().V1().PersistentVolumes().Informer(), cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj interface{}) { pl.setPV(obj) },
			UpdateFunc: func(_, obj interface{}) { pl.setPV(obj) },
			DeleteFunc: pl.deletePV,
		}},
		{"PVCs", f.Core().V1().PersistentVolumeClaims().Informer(), cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj interface{}) { pl.setPVC(nil, obj) },
			UpdateFunc: pl.setPVC,
			DeleteFunc: pl.deletePVC,
		}},
		{"StorageClasses", f.Storage().V1().StorageClasses().Informer(), cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj interface{}) { pl.setStorageClass(obj) },
			UpdateFunc: func(_, obj interface{}) { pl.setStorageClass(obj) },
			DeleteFunc: pl.deleteStorageClass,
		}},
	} {
		reg, err := feed.informer.AddEventHandler(feed.handler)
		if err != nil {
			return fmt.Errorf("watching %s: %w", feed.what, err)
		}
		pl.handlersSynced = append(pl.handlersSynced, reg.HasSynced)
	}

	factory := externalversions.NewSharedInformerFactory(client, 0)
	reg, err := factory.Diskfit().V1alpha1().DiskNodes().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj interface{}) { pl.setDiskNode(nil, obj) },
		UpdateFunc: pl.setDiskNode,
		DeleteFunc: pl.deleteDiskNode,
	})
	if err != nil {
		return fmt.Errorf("watching DiskNodes: %w", err)
	}
	factory.Start(ctx.Done())
	// Said before waiting: without the DiskNode CRD the wait lasts until it
	// is installed, and the reflector's list errors alone do not say who
	// is waiting.
	klog.FromContext(ctx).V(1).Info("DiskFit waiting for DiskNodes to sync; the DiskNode CRD must be installed")
	// Waiting for the handler, not just the informer, means every DiskNode
	// is in the ledger before New returns.
	if !cache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
		return errors.New("DiskNode informer did not sync")
	}
	return nil
}

func (pl *DiskFit) setPV(obj interface{}) {
	if pv, ok := obj.(*v1.PersistentVolume); ok {
		pl.ledger.SetPV(pv)
		reservationsHeld.Set(float64(pl.ledger.Reservations()))
	}
}

func (pl *DiskFit) deletePV(obj interface{}) {
	if pv, ok := tombstone[*v1.PersistentVolume](obj); ok {
		pl.ledger.DeletePV(pv.Name)
		if _, ours := diskfit.PVLocation(pv); ours {
			pl.wake(&pl.waiting, "PV deleted")
		}
	}
}

// setPVC counts a PVC; a placed claim that lost its node (a reschedule)
// no longer holds its disk.
func (pl *DiskFit) setPVC(oldObj, obj interface{}) {
	pvc, ok := obj.(*v1.PersistentVolumeClaim)
	if !ok {
		return
	}
	wasPlaced := false
	if old, ok := oldObj.(*v1.PersistentVolumeClaim); ok {
		_, wasPlaced = pl.ledger.CountedPVCLocation(old)
	}
	pl.ledger.SetPVC(pvc)
	reservationsHeld.Set(float64(pl.ledger.Reservations()))
	if _, placed := pl.ledger.CountedPVCLocation(pvc); wasPlaced && !placed && pvc.Spec.VolumeName == "" {
		pl.wake(&pl.waiting, "PVC released its disk")
	}
}

func (pl *DiskFit) deletePVC(obj interface{}) {
	if pvc, ok := tombstone[*v1.PersistentVolumeClaim](obj); ok {
		_, placed := pl.ledger.CountedPVCLocation(pvc)
		pl.ledger.DeletePVC(pvc)
		reservationsHeld.Set(float64(pl.ledger.Reservations()))
		if placed {
			pl.wake(&pl.waiting, "placed PVC deleted")
		}
	}
}

// setStorageClass counts the claims of a class that is the diskfit
// driver's: a class created, replaced or deleted after its claims makes
// them start or stop counting, whichever informer delivers first.
func (pl *DiskFit) setStorageClass(obj interface{}) {
	if sc, ok := obj.(*storagev1.StorageClass); ok && pl.ledger.SetStorageClass(sc) {
		pl.wake(&pl.waiting, "StorageClass of placed claims no longer diskfit's")
	}
}

func (pl *DiskFit) deleteStorageClass(obj interface{}) {
	if sc, ok := tombstone[*storagev1.StorageClass](obj); ok && pl.ledger.DeleteStorageClass(sc.Name) {
		pl.wake(&pl.waiting, "StorageClass of placed claims deleted")
	}
}

// setDiskNode rebuilds a node's disks; a new or fresh again DiskNode
// activates the pods rejected for its absence or age, one with more room
// those rejected for lack of space.
func (pl *DiskFit) setDiskNode(oldObj, obj interface{}) {
	dn, ok := obj.(*v1alpha1.DiskNode)
	if !ok {
		return
	}
	pl.ledger.SetDiskNode(dn)
	ledgerRebuilds.Inc()
	old, ok := oldObj.(*v1alpha1.DiskNode)
	switch {
	case !ok:
		pl.wake(&pl.waitingForDiskNode, "DiskNode created")
	case pl.freshAgain(old, dn):
		pl.wake(&pl.waitingForDiskNode, "DiskNode fresh again")
	}
	if ok && moreRoom(old, dn) {
		pl.wake(&pl.waiting, "DiskNode reports more room")
	}
}

func (pl *DiskFit) deleteDiskNode(obj interface{}) {
	if dn, ok := tombstone[*v1alpha1.DiskNode](obj); ok {
		pl.ledger.DeleteDiskNode(dn.Name)
		ledgerRebuilds.Inc()
	}
}

// tombstone unwraps the final state of a deleted object.
func tombstone[T any](obj interface{}) (T, bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	t, ok := obj.(T)
	return t, ok
}
