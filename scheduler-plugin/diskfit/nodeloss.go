package diskfit

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/utils/clock"

	"github.com/diskfit/diskfit/csi-driver/apis/diskfit"
	"github.com/diskfit/diskfit/scheduler-plugin/ledger"
)

// A local volume dies with its node. When a Node is deleted (the machine is
// gone for good: an operator or the cloud's node controller removed it),
// the claims on it that opted in with ReleaseOnNodeDeletionAnnotation are
// released: the PVC is deleted, so the StatefulSet creates a new one with
// its next pod, which the scheduler places on a live node. The PV is
// deleted too; its external-provisioner died with the node and can never
// remove its finalizer, so the finalizer is removed here.
//
// It runs when a Node is deleted and every releaseInterval, which also
// catches nodes deleted while no scheduler ran and retries failures. Every
// replica of the scheduler runs it (plugins exist on standbys too); the
// deletes carry UID preconditions, so a second attempt finds nothing to do.

// provisionerFinalizer is the finalizer external-provisioner puts on the
// PVs it provisioned, removed once it has deleted the volume.
const provisionerFinalizer = "external-provisioner.volume.kubernetes.io/finalizer"

const releaseInterval = time.Minute

// nodeLoss is the plugin's state for releasing claims of deleted nodes.
type nodeLoss struct {
	clock clock.WithTicker
}

// watchNodeLoss starts releasing volumes of deleted nodes once the Node,
// PV and PVC caches are filled: before that, every node would look gone.
func (pl *DiskFit) watchNodeLoss(ctx context.Context, h fwk.Handle) error {
	nodes := h.SharedInformerFactory().Core().V1().Nodes()
	pl.nodeLister = nodes.Lister()
	deleted := make(chan struct{}, 1)
	reg, err := nodes.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		DeleteFunc: func(interface{}) {
			select {
			case deleted <- struct{}{}:
			default:
			}
		},
	})
	if err != nil {
		return fmt.Errorf("watching Nodes: %w", err)
	}
	synced := append([]cache.InformerSynced{reg.HasSynced}, pl.handlersSynced...)
	go func() {
		if !cache.WaitForCacheSync(ctx.Done(), synced...) {
			return
		}
		ticker := pl.nodeLoss.clock.NewTicker(releaseInterval)
		defer ticker.Stop()
		for {
			pl.releaseLostVolumes(ctx, h.ClientSet())
			select {
			case <-ctx.Done():
				return
			case <-deleted:
			case <-ticker.C():
			}
		}
	}()
	return nil
}

// releaseLostVolumes releases the opted-in claims whose volumes live on a
// node that no longer exists.
func (pl *DiskFit) releaseLostVolumes(ctx context.Context, client kubernetes.Interface) {
	logger := klog.FromContext(ctx)
	pvs, err := pl.pvLister.List(labels.Everything())
	if err != nil {
		logger.Error(err, "Listing PVs to release volumes of deleted nodes")
		return
	}
	for _, pv := range pvs {
		loc, ok := ledger.PVLocation(pv)
		if !ok {
			continue
		}
		if _, err := pl.nodeLister.Get(loc.Node); !apierrors.IsNotFound(err) {
			continue
		}
		released, err := pl.release(ctx, client, pv)
		if err != nil {
			logger.Error(err, "Releasing a volume of a deleted node", "node", loc.Node, "pv", pv.Name)
			continue
		}
		if released {
			logger.Info("Released a volume of a deleted node", "node", loc.Node, "disk", loc.Disk, "pv", pv.Name,
				"pvc", klog.KRef(pv.Spec.ClaimRef.Namespace, pv.Spec.ClaimRef.Name))
		}
	}
}

// release deletes pv and, if it opted in, its claim; released is false for
// volumes whose claim did not opt in.
func (pl *DiskFit) release(ctx context.Context, client kubernetes.Interface, pv *v1.PersistentVolume) (released bool, err error) {
	ref := pv.Spec.ClaimRef
	if ref == nil {
		return false, nil
	}
	pvc, err := pl.getPVC(ref.Namespace, ref.Name)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if pvc.UID != ref.UID || pvc.Annotations[diskfit.ReleaseOnNodeDeletionAnnotation] != "true" {
		return false, nil
	}
	err = client.CoreV1().PersistentVolumeClaims(pvc.Namespace).Delete(ctx, pvc.Name, metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{UID: &pvc.UID},
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return false, fmt.Errorf("deleting PVC %s/%s: %w", pvc.Namespace, pvc.Name, err)
	}
	if slices.Contains(pv.Finalizers, provisionerFinalizer) {
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{
			"finalizers":      slices.DeleteFunc(slices.Clone(pv.Finalizers), func(f string) bool { return f == provisionerFinalizer }),
			"resourceVersion": pv.ResourceVersion,
		}})
		_, err := client.CoreV1().PersistentVolumes().Patch(ctx, pv.Name, types.MergePatchType, patch, metav1.PatchOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return false, fmt.Errorf("removing the provisioner's finalizer from PV %s: %w", pv.Name, err)
		}
	}
	err = client.CoreV1().PersistentVolumes().Delete(ctx, pv.Name, metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{UID: &pv.UID},
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return false, fmt.Errorf("deleting PV %s: %w", pv.Name, err)
	}
	return true, nil
}
