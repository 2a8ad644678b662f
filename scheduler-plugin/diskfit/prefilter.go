package diskfit

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"sync"
	"sync/atomic"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/component-helpers/storage/ephemeral"
	storagehelpers "k8s.io/component-helpers/storage/volume"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/scheduler-plugin/ledger"
	"github.com/diskfit/diskfit/scheduler-plugin/packing"
)

const stateKey fwk.StateKey = Name

// stateData is what PreFilter learns about the pod's diskfit claims.
type stateData struct {
	// claims are the unbound diskfit claims still needing a disk, largest
	// first (packing.SortClaims).
	claims []packing.Claim
	// node is set when a claim copies data (source.go): the only node
	// that holds it.
	node string
	// deferVolumeBinding is set when VolumeBinding's Filter would give
	// every node the same answer for the pod's claims: it then runs in
	// Reserve, for the chosen node only (deferred.go).
	deferVolumeBinding bool
	// othersUnbound is set when the pod also has unbound claims that are
	// not diskfit's: only then has the embedded VolumeBinding something of
	// its own to score (it sees no capacity for diskfit claims).
	othersUnbound bool
	// vbScores records whether the embedded VolumeBinding's score is
	// averaged in; only PreScore of a pod with claims writes it, before any
	// Score reads it.
	vbScores bool
	// diskScores holds, by node name, the disk score Filter computed for
	// each node it passed, for Score (score.go).
	diskScores sync.Map
	// waitingForSpace and waitingForDiskNode are set by the first Filter
	// that rejects a node for lack of space, or for a missing or stale
	// DiskNode, so the pod is recorded as waiting once per cycle.
	waitingForSpace, waitingForDiskNode atomic.Bool
}

// Clone shares the state: claims never change after PreFilter, and a
// node's disk score is the same in a clone (preemption), which Filter
// passes the same nodes.
func (s *stateData) Clone() fwk.StateData { return s }

// lastCycle remembers the state of the most recent PreFilter, so that the
// per-node calls of the same cycle find it without a CycleState lookup,
// which costs as much as the rest of DiskFit's work for a pod without
// diskfit claims. Cloned states (preemption) miss and fall back to Read.
type lastCycle struct {
	cs fwk.CycleState
	s  *stateData
}

func (pl *DiskFit) getState(cs fwk.CycleState) (*stateData, error) {
	if last := pl.last.Load(); last != nil && last.cs == cs {
		return last.s, nil
	}
	return readState(cs)
}

func readState(cs fwk.CycleState) (*stateData, error) {
	v, err := cs.Read(stateKey)
	if err != nil {
		return nil, err
	}
	s, ok := v.(*stateData)
	if !ok {
		return nil, fmt.Errorf("unexpected DiskFit state type %T", v)
	}
	return s, nil
}

// PreFilter runs VolumeBinding's PreFilter and then collects the pod's
// unbound diskfit claims (plain and StatefulSet PVCs, generic ephemeral
// volumes) with their sizes and device classes, once per cycle.
func (pl *DiskFit) PreFilter(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodes []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	// Forget the previous cycle first: a CycleState must never be matched
	// with another cycle's claims.
	pl.last.Store(nil)
	res, status := pl.vb.PreFilter(ctx, cs, pod, nodes)
	if !status.IsSuccess() {
		// Skip (no PVCs) or a rejection VolumeBinding explains.
		return res, status
	}
	s, err := pl.podClaims(ctx, pod)
	if err != nil {
		return nil, claimsStatus(err)
	}
	if len(s.claims) == 0 {
		s = pl.noClaims
	} else {
		klog.FromContext(ctx).V(4).Info("DiskFit claims", "pod", klog.KObj(pod), "count", len(s.claims), "sourceNode", s.node)
	}
	if s.node != "" {
		// Only the node holding the data can make the copies.
		if res.AllNodes() {
			res = &fwk.PreFilterResult{NodeNames: sets.New(s.node)}
		} else {
			res = &fwk.PreFilterResult{NodeNames: res.NodeNames.Intersection(sets.New(s.node))}
		}
	}
	cs.Write(stateKey, s)
	pl.last.Store(&lastCycle{cs: cs, s: s})
	return res, nil
}

// unresolvableError is why the pod's claims cannot be placed as the
// cluster is: a missing object, a source without a location yet. Only a
// change of the cluster lifts it, and the events that can are registered
// (events.go). Every other error of PreFilter is a failed read (a lister,
// an API call that timed out) and says nothing about the pod.
type unresolvableError struct{ error }

func (e *unresolvableError) Unwrap() error { return e.error }

// unresolvable marks err as a verdict on the pod.
func unresolvable(err error) error { return &unresolvableError{err} }

// unresolvableIfNotFound marks a read that found nothing as a verdict; the
// read's other failures stay transient.
func unresolvableIfNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return unresolvable(err)
	}
	return err
}

// claimsStatus is PreFilter's answer to an error of podClaims: a verdict
// rejects the pod until an event may change it; any other error is an
// Error, which the scheduler retries after backoff.
func claimsStatus(err error) *fwk.Status {
	var verdict *unresolvableError
	if errors.As(err, &verdict) {
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, err.Error())
	}
	return fwk.AsStatus(err)
}

// PreFilterExtensions returns nil: adding or removing pods does not change
// disk space.
func (pl *DiskFit) PreFilterExtensions() fwk.PreFilterExtensions { return nil }

// getPVC reads a PVC from the informer cache. It uses the indexer directly:
// the lister's namespace view costs an allocation per call, and PreFilter
// runs for every pod with volumes.
func (pl *DiskFit) getPVC(namespace, name string) (*v1.PersistentVolumeClaim, error) {
	obj, exists, err := pl.pvcIndexer.GetByKey(namespace + "/" + name)
	if err != nil {
		return nil, err
	}
	if !exists {
		return nil, apierrors.NewNotFound(v1.Resource("persistentvolumeclaims"), name)
	}
	pvc, ok := obj.(*v1.PersistentVolumeClaim)
	if !ok {
		return nil, fmt.Errorf("unexpected object %T in the PVC cache", obj)
	}
	return pvc, nil
}

// claimName returns the name of the PVC a volume uses: its claim, or for a
// generic ephemeral volume the PVC created for it (<pod>-<volume>).
func claimName(pod *v1.Pod, vol *v1.Volume) (string, bool) {
	switch {
	case vol.PersistentVolumeClaim != nil:
		return vol.PersistentVolumeClaim.ClaimName, true
	case vol.Ephemeral != nil:
		return ephemeral.VolumeClaimName(pod, vol), true
	default:
		return "", false
	}
}

// podPVCs yields the PVCs of the pod's volumes from the informer cache, or
// why one cannot be read (a missing PVC is a verdict).
func (pl *DiskFit) podPVCs(pod *v1.Pod) iter.Seq2[*v1.PersistentVolumeClaim, error] {
	return func(yield func(*v1.PersistentVolumeClaim, error) bool) {
		for i := range pod.Spec.Volumes {
			name, ok := claimName(pod, &pod.Spec.Volumes[i])
			if !ok {
				continue
			}
			pvc, err := pl.getPVC(pod.Namespace, name)
			if err != nil {
				err = fmt.Errorf("reading PVC %s/%s: %w", pod.Namespace, name, unresolvableIfNotFound(err))
			}
			if !yield(pvc, err) {
				return
			}
		}
	}
}

// errNotDiskFit marks a PVC that DiskFit leaves to VolumeBinding alone.
var errNotDiskFit = errors.New("not a diskfit claim")

// podClaims returns the pod's claims that DiskFit must place: unbound,
// provisioned by the diskfit driver, and not already placed on a disk. A
// PVC that already carries this cycle's node and a disk (a pod scheduled
// again before provisioning finished) is counted by the ledger and keeps
// its disk. A claim that copies a snapshot or volume is restricted to the
// source's disk, and the pod to the source's node.
func (pl *DiskFit) podClaims(ctx context.Context, pod *v1.Pod) (*stateData, error) {
	s := &stateData{deferVolumeBinding: true}
	for pvc, err := range pl.podPVCs(pod) {
		if err != nil {
			// VolumeBinding's PreFilter has already rejected missing PVCs;
			// one deleted since then ends this cycle the same way.
			return nil, err
		}
		c, sc, err := pl.claimFor(pvc)
		if errors.Is(err, errNotDiskFit) {
			s.othersUnbound = s.othersUnbound || pvc.Spec.VolumeName == ""
			s.deferVolumeBinding = false
			continue
		}
		if err != nil {
			return nil, err
		}
		loc, copies, err := pl.sourceLocation(ctx, pvc)
		if err != nil {
			return nil, err
		}
		if copies {
			if s.node != "" && s.node != loc.Node {
				return nil, unresolvable(fmt.Errorf("the pod's claims copy data held on different nodes (%s and %s)", s.node, loc.Node))
			}
			c.Disk, s.node = loc.Disk, loc.Node
		}
		s.claims = append(s.claims, c)
		s.deferVolumeBinding = s.deferVolumeBinding && pl.sameOnEveryNode(pvc, sc)
	}
	packing.SortClaims(s.claims)
	return s, nil
}

// claimFor turns a PVC into a claim of StorageClass sc, or errNotDiskFit
// when DiskFit has nothing to decide for it.
func (pl *DiskFit) claimFor(pvc *v1.PersistentVolumeClaim) (packing.Claim, *storagev1.StorageClass, error) {
	if pvc.Spec.VolumeName != "" {
		return packing.Claim{}, nil, errNotDiskFit
	}
	if _, placed := diskfit.PVCLocation(pvc); placed {
		return packing.Claim{}, nil, errNotDiskFit
	}
	className := storagehelpers.GetPersistentVolumeClaimClass(pvc)
	if className == "" {
		return packing.Claim{}, nil, errNotDiskFit
	}
	sc, err := pl.scLister.Get(className)
	if apierrors.IsNotFound(err) {
		// VolumeBinding reports a missing class for claims that need one.
		return packing.Claim{}, nil, errNotDiskFit
	}
	if err != nil {
		return packing.Claim{}, nil, fmt.Errorf("reading StorageClass %s: %w", className, err)
	}
	if !diskfit.IsDiskFitClass(sc) {
		return packing.Claim{}, nil, errNotDiskFit
	}
	return packing.Claim{
		Key:         string(pvc.UID),
		Name:        pvc.Namespace + "/" + pvc.Name,
		Size:        ledger.ClaimSize(pvc),
		DeviceClass: sc.Parameters[diskfit.DeviceClassParameter],
	}, sc, nil
}

// hasDiskFitClaims reports whether the pod references any PVC DiskFit
// would place, without failing on missing objects.
func (pl *DiskFit) hasDiskFitClaims(pod *v1.Pod) bool {
	for pvc, err := range pl.podPVCs(pod) {
		if err != nil {
			// Unknown yet: assume it may become ours.
			return true
		}
		if _, _, err := pl.claimFor(pvc); !errors.Is(err, errNotDiskFit) {
			return true
		}
	}
	return false
}

// SignPod lets pods without diskfit claims take part in opportunistic
// batching exactly as VolumeBinding allows. Pods with diskfit claims are not
// signed: every placement changes the free space of a disk, so a result
// computed for one pod must not be reused for the next.
func (pl *DiskFit) SignPod(ctx context.Context, pod *v1.Pod) ([]fwk.SignFragment, *fwk.Status) {
	if pl.hasDiskFitClaims(pod) {
		return nil, fwk.NewStatus(fwk.Unschedulable, "pods with diskfit volumes are placed one at a time")
	}
	return pl.vb.SignPod(ctx, pod)
}
