package lifecycle

import (
	"context"
	"encoding/json"
	"reflect"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
)

// A DiskNode outlives its Node while its spec holds an admin's decision
// (a disk, or the node, taken out of service): a Node is deleted and
// registered again under the same name (kubectl delete node for
// maintenance, a kubelet registering anew), and a cordon lost with it
// would send new volumes to a disk taken out of service. So no DiskNode is
// owned by its Node, and tidyDiskNodes does what the garbage collector did
// for the others: it deletes the DiskNode of a node gone for NodeLossGrace
// (confirmed by quorum reads) when its spec is empty. One that holds a
// decision stays until the Node is back or an admin deletes it. So does
// one its driver still refreshes (the node is not gone): the driver makes
// a DiskNode only for a Node that exists, and could not make it again.

// tidyDiskNodes removes the Node owner references drivers of earlier
// versions set, and deletes the DiskNodes of nodes gone for the grace time
// whose spec is empty.
func (c *Controller) tidyDiskNodes(ctx context.Context, claims map[diskfit.Location][]Claim, losses lostNodes) {
	logger := klog.FromContext(ctx)
	dns, err := c.diskNodes.List(labels.Everything())
	if err != nil {
		logger.Error(err, "Listing DiskNodes")
		return
	}
	now := c.opts.Clock.Now()
	gone := map[string]bool{}
	for _, dn := range dns {
		if slices.ContainsFunc(dn.OwnerReferences, isNode) {
			c.disown(ctx, dn)
		}
		if !c.seemsGone(dn.Name) {
			continue
		}
		if !reflect.DeepEqual(dn.Spec, v1alpha1.DiskNodeSpec{}) {
			continue
		}
		gone[dn.Name] = true
		since, ok := c.diskNodeGoneSince[dn.Name]
		if !ok {
			c.diskNodeGoneSince[dn.Name] = now
			continue
		}
		if now.Sub(since) < c.opts.NodeLossGrace {
			continue
		}
		// Nodes lost at once (lostnodes.go): their DiskNodes count them,
		// and stay for LossWindow after they went silent, and while
		// claims of a node lost with them are held.
		if now.Sub(losses.byNode[dn.Name].silentSince) < LossWindow || c.keepsCount(dn.Name, losses, claims) {
			continue
		}
		if gone, err := c.gone(ctx, dn.Name); err != nil || !gone {
			if err != nil {
				logger.Error(err, "Reading a node that seems gone; its DiskNode stays for now", "node", dn.Name)
			}
			continue
		}
		err := c.diskfit.DiskfitV1alpha1().DiskNodes().Delete(ctx, dn.Name, metav1.DeleteOptions{
			Preconditions: &metav1.Preconditions{UID: &dn.UID, ResourceVersion: &dn.ResourceVersion}})
		if err != nil && !apierrors.IsNotFound(err) {
			// A conflict is a DiskNode changed since the cache saw it (a
			// cordon, maybe): the next pass looks again.
			logger.Error(err, "Deleting the DiskNode of a deleted Node", "node", dn.Name)
			continue
		}
		logger.Info("Deleted the DiskNode of a deleted Node", "node", dn.Name, "goneSince", since)
	}
	for name := range c.diskNodeGoneSince {
		if !gone[name] {
			delete(c.diskNodeGoneSince, name)
		}
	}
}

func isNode(ref metav1.OwnerReference) bool { return ref.APIVersion == "v1" && ref.Kind == "Node" }

// disown removes dn's owner references to its Node, with a merge patch
// of the list: an update would conflict with the driver's status writes.
func (c *Controller) disown(ctx context.Context, dn *v1alpha1.DiskNode) {
	refs := slices.DeleteFunc(slices.Clone(dn.OwnerReferences), isNode)
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"ownerReferences": refs}})
	if err == nil {
		_, err = c.diskfit.DiskfitV1alpha1().DiskNodes().Patch(ctx, dn.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	}
	if err != nil {
		klog.FromContext(ctx).Error(err, "Removing the Node owner reference of a DiskNode; until then it goes, spec and all, with its Node", "node", dn.Name)
	}
}

// A node is gone when its Node is deleted and its driver no longer
// reports: it has no DiskNode, or one whose status is not fresh (the
// freshness a failed disk's status needs). A Node is deleted while its
// machine runs on (kubectl delete node for maintenance, a cloud
// controller's bug), its volumes and their data intact. The caches only
// nominate (seemsGone); quorum reads decide (gone).

// seemsGone says whether the caches have neither Node name nor a fresh
// DiskNode of it.
func (c *Controller) seemsGone(name string) bool {
	if _, err := c.nodes.Get(name); !apierrors.IsNotFound(err) {
		return false
	}
	dn, err := c.diskNodes.Get(name)
	return apierrors.IsNotFound(err) || err == nil && !c.fresh(dn)
}

// gone asks the API server (quorum reads, not caches) whether node name
// is gone.
func (c *Controller) gone(ctx context.Context, name string) (bool, error) {
	if _, err := c.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		return false, err
	}
	dn, err := c.diskfit.DiskfitV1alpha1().DiskNodes().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return true, nil
	}
	return err == nil && !c.fresh(dn), err
}
