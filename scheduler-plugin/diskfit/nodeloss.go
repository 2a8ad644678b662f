package diskfit

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
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

	"github.com/diskfit/diskfit/apis/diskfit"
)

// A local volume dies with its node. When a Node is deleted (the machine is
// gone for good: an operator or the cloud's node controller removed it),
// the claims on it that opted in with ReleaseOnNodeDeletionAnnotation are
// released: the PVC is deleted, so the StatefulSet creates a new one with
// its next pod, which the scheduler places on a live node. The PV is
// deleted too; its external-provisioner died with the node and can never
// remove its finalizer, so the finalizer is removed here.
//
// Deleting is final, so the scheduler's Node cache only nominates nodes: a
// relist in progress or a missed watch event makes a live Node look gone
// there. A node's claims are released only when a quorum read of the Node
// from the API server answers NotFound, has answered so for nodeGoneDwell
// (counted from the first such answer; seeing the Node again, in the cache
// or the API server, starts over), and answers so once more right before
// the deletes.
//
// Only the elected leader releases. Plugins are built in every replica,
// before leader election, and nothing in the framework tells a plugin
// whether it leads; but only the leader runs scheduling cycles
// (kube-scheduler calls Scheduler.Run from OnStartedLeading), and a
// replica that loses the lease exits (OnStoppedLeading). So the first
// PreFilter call marks the plugin as the leader's for the rest of the
// process. A standby never reads Nodes for this nor deletes anything, and
// a new leader counts the dwell time from its own first read.
//
// It runs when a Node is deleted and every releaseInterval, which also
// catches nodes deleted while no scheduler ran and retries failures. The
// deletes carry UID preconditions, so a second attempt (two instances of
// the plugin in two profiles, a leader that has just lost its lease) finds
// nothing to do.

// provisionerFinalizer is the finalizer external-provisioner puts on the
// PVs it provisioned, removed once it has deleted the volume.
const provisionerFinalizer = "external-provisioner.volume.kubernetes.io/finalizer"

const releaseInterval = time.Minute

// nodeGoneDwell is how long the API server must have answered NotFound for
// a Node before its claims are released: longer than a Node's
// re-registration or a lagging cache takes, short enough that a
// StatefulSet pod moves within minutes.
const nodeGoneDwell = 2 * time.Minute

// nodeLoss is the plugin's state for releasing claims of deleted nodes.
type nodeLoss struct {
	clock clock.WithTicker
	// leading is set by the first scheduling cycle: only the elected
	// leader runs them.
	leading atomic.Bool
	// mu serializes passes.
	mu sync.Mutex
	// goneSince is when the API server first answered NotFound for each
	// node with claims to release.
	goneSince map[string]time.Time
}

// scheduling records that a scheduling cycle called the plugin, so this
// replica is the elected leader.
func (nl *nodeLoss) scheduling() {
	if !nl.leading.Load() {
		nl.leading.Store(true)
	}
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
// node that the API server has said for nodeGoneDwell does not exist. It
// does nothing until the plugin has run a scheduling cycle.
func (pl *DiskFit) releaseLostVolumes(ctx context.Context, client kubernetes.Interface) {
	nl := &pl.nodeLoss
	if !nl.leading.Load() {
		return
	}
	nl.mu.Lock()
	defer nl.mu.Unlock()
	logger := klog.FromContext(ctx)
	pvs, err := pl.pvLister.List(labels.Everything())
	if err != nil {
		logger.Error(err, "Listing PVs to release volumes of deleted nodes")
		return
	}
	// The opted-in volumes of nodes missing from the cache, by node.
	lost := map[string][]*v1.PersistentVolume{}
	for _, pv := range pvs {
		loc, ok := diskfit.PVLocation(pv)
		if !ok {
			continue
		}
		if _, err := pl.nodeLister.Get(loc.Node); !apierrors.IsNotFound(err) {
			continue
		}
		if pvc, err := pl.optedInClaim(pv); err != nil {
			logger.Error(err, "Reading the claim of a volume of a deleted node", "node", loc.Node, "pv", pv.Name)
		} else if pvc != nil {
			lost[loc.Node] = append(lost[loc.Node], pv)
		}
	}
	// A node back in the cache, or without claims left to release,
	// starts over.
	for name := range nl.goneSince {
		if _, ok := lost[name]; !ok {
			delete(nl.goneSince, name)
		}
	}
	now := nl.clock.Now()
	for name, pvs := range lost {
		// A GET without resourceVersion is a quorum read: the API server's
		// answer, not a cache's.
		_, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		switch {
		case err == nil:
			logger.V(2).Info("Node missing from the cache exists; its volumes stay", "node", name)
			delete(nl.goneSince, name)
			continue
		case !apierrors.IsNotFound(err):
			logger.Error(err, "Reading a Node missing from the cache; its volumes are not released now", "node", name)
			continue
		}
		since, ok := nl.goneSince[name]
		if !ok {
			nl.goneSince[name] = now
			logger.Info("Node is gone; releasing its opted-in claims unless it comes back", "node", name, "after", nodeGoneDwell)
			continue
		}
		if now.Sub(since) < nodeGoneDwell {
			continue
		}
		for _, pv := range pvs {
			released, err := pl.release(ctx, client, pv)
			if err != nil {
				logger.Error(err, "Releasing a volume of a deleted node", "node", name, "pv", pv.Name)
				continue
			}
			if released {
				loc, _ := diskfit.PVLocation(pv)
				logger.Info("Released a volume of a deleted node", "node", name, "disk", loc.Disk, "pv", pv.Name,
					"pvc", klog.KRef(pv.Spec.ClaimRef.Namespace, pv.Spec.ClaimRef.Name))
			}
		}
	}
}

// optedInClaim returns pv's claim from the cache if it opted in, else nil.
func (pl *DiskFit) optedInClaim(pv *v1.PersistentVolume) (*v1.PersistentVolumeClaim, error) {
	ref := pv.Spec.ClaimRef
	if ref == nil {
		return nil, nil
	}
	pvc, err := pl.getPVC(ref.Namespace, ref.Name)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if pvc.UID != ref.UID || pvc.Annotations[diskfit.ReleaseOnNodeDeletionAnnotation] != "true" {
		return nil, nil
	}
	return pvc, nil
}

// release deletes pv and, if it opted in, its claim; released is false for
// volumes whose claim did not opt in.
func (pl *DiskFit) release(ctx context.Context, client kubernetes.Interface, pv *v1.PersistentVolume) (released bool, err error) {
	pvc, err := pl.optedInClaim(pv)
	if pvc == nil || err != nil {
		return false, err
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
