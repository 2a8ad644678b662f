package diskfit

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/client-go/tools/cache"
	storagehelpers "k8s.io/component-helpers/storage/volume"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/diskfit/diskfit/apis/diskfit"
)

// VolumeBinding's Filter works out, for every node the framework tries,
// what the pod's claims would need there: for each unbound claim, a static
// PV that could be bound to it (class, size, access modes, node affinity),
// and for the claims left to provision, the StorageClass's provisioner,
// allowedTopologies and CSIStorageCapacity. For a pod whose every claim is
// an unbound diskfit claim, none of that depends on the node when
//
//   - no PV could be bound to any of the claims: no PV of their classes is
//     without a claimRef, and no claimRef names one of the claims;
//   - their classes set no allowedTopologies;
//   - no claim has a selected node yet.
//
// The provisioner is diskfit's and VolumeBinding checks no capacity for
// diskfit claims (capacity.go), so every node gets the same answer:
// provision all of them. For such a pod DiskFit's disk check alone decides
// in Filter, which runs for hundreds of nodes per pod, and VolumeBinding's
// Filter runs only for the node Reserve is given, where it records what
// PreBind binds. It works there from what its PreFilter read, as it does
// in Filter; a node it rejects (or one deleted since) is not reserved, and
// the pod is tried again after backoff, as when it loses a race for disk
// space (reserve.go).

// pvBindableIndex indexes PVs by the unbound claims they could be bound
// to: bindableClassKey for a PV without a claimRef (any claim of its class
// may match it), bindableClaimKey for a PV whose claimRef names a claim.
const pvBindableIndex = "diskfit.io/bindable"

func bindableClassKey(class string) string { return "class/" + class }

func bindableClaimKey(namespace, name string) string { return "claim/" + namespace + "/" + name }

func pvBindableKeys(obj interface{}) ([]string, error) {
	pv, ok := obj.(*v1.PersistentVolume)
	if !ok {
		return nil, nil
	}
	if ref := pv.Spec.ClaimRef; ref != nil {
		return []string{bindableClaimKey(ref.Namespace, ref.Name)}, nil
	}
	return []string{bindableClassKey(storagehelpers.GetPersistentVolumeClass(pv))}, nil
}

// addPVBindableIndex adds the index to the shared PV informer, once even
// when several profiles use DiskFit.
func addPVBindableIndex(pvs cache.SharedIndexInformer) error {
	if _, ok := pvs.GetIndexer().GetIndexers()[pvBindableIndex]; ok {
		return nil
	}
	return pvs.AddIndexers(cache.Indexers{pvBindableIndex: pvBindableKeys})
}

// sameOnEveryNode reports whether VolumeBinding's Filter would give the
// diskfit claim pvc of class sc the same answer on every node: provision
// it (see above).
func (pl *DiskFit) sameOnEveryNode(pvc *v1.PersistentVolumeClaim, sc *storagev1.StorageClass) bool {
	if len(sc.AllowedTopologies) > 0 {
		return false
	}
	if _, selected := pvc.Annotations[diskfit.SelectedNodeAnnotation]; selected {
		return false
	}
	for _, key := range [...]string{bindableClassKey(sc.Name), bindableClaimKey(pvc.Namespace, pvc.Name)} {
		pvs, err := pl.pvIndexer.IndexKeys(pvBindableIndex, key)
		if err != nil || len(pvs) > 0 {
			return false
		}
	}
	return true
}

// filterVolumeBinding runs VolumeBinding's Filter for the one node the pod
// is reserved on, when PreFilter deferred it (see above). A rejection is
// an error: the node was chosen by a Filter that did not see it.
func (pl *DiskFit) filterVolumeBinding(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodeName string) *fwk.Status {
	node, err := pl.nodeLister.Get(nodeName)
	if err != nil {
		return fwk.AsStatus(fmt.Errorf("reading node %s: %w", nodeName, err))
	}
	ni := framework.NewNodeInfo()
	ni.SetNode(node)
	if status := pl.vb.Filter(ctx, cs, pod, ni); !status.IsSuccess() {
		return fwk.AsStatus(fmt.Errorf("node %s: %s", nodeName, status.Message()))
	}
	return nil
}
