package kube

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/pager"
	"k8s.io/klog/v2"

	"github.com/diskfit/diskfit/apis/diskfit"
)

// VolumeSnapshotContents is external-snapshotter's cluster-scoped CRD
// binding a CSI snapshot handle to a VolumeSnapshot.
var VolumeSnapshotContents = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshotcontents"}

// volumeHandleIndex indexes the PVs that may refer to this node's volumes
// by their CSI volume handle.
const volumeHandleIndex = "diskfit.io/volume-handle"

// OrphanFinder tells the driver which of its volumes no PersistentVolume
// and which of its snapshots no VolumeSnapshotContent refers to.
//
// PVs are watched through an informer, so that a sweep in which every
// volume has its PV makes no API call; a volume the cache has no PV for is
// confirmed by listing the PVs from the API server, because a lagging
// cache (a broken watch, a PV made a moment ago) must never cost a volume.
// VolumeSnapshotContents are listed from the API server when there is a
// snapshot to ask about; they are a CRD that may not be installed, and
// there are few of them. They are watched too, once the API serves them,
// so that a content deleted between two sweeps still counts
// (OnSnapshotHandle).
type OrphanFinder struct {
	client  kubernetes.Interface
	dynamic dynamic.Interface
	pvs     cache.SharedIndexInformer
	// contents is nil without a dynamic client.
	contents cache.SharedIndexInformer
	// node is the node whose volumes the finder is asked about.
	node string
	// servedPoll is how often RunContentInformer asks whether the API
	// serves VolumeSnapshotContents, until it does.
	servedPoll time.Duration
}

// NewOrphanFinder registers a PV informer with factory, which the caller
// starts, for the volumes of node, and makes the VolumeSnapshotContent
// informer RunContentInformer runs. dyn may be nil: snapshots are then
// never reported as orphans.
func NewOrphanFinder(client kubernetes.Interface, dyn dynamic.Interface, factory informers.SharedInformerFactory, node string) (*OrphanFinder, error) {
	f := &OrphanFinder{client: client, dynamic: dyn, node: node, pvs: factory.Core().V1().PersistentVolumes().Informer(), servedPoll: time.Minute}
	if err := f.pvs.AddIndexers(cache.Indexers{volumeHandleIndex: func(obj any) ([]string, error) {
		return f.volumeHandles(obj), nil
	}}); err != nil {
		return nil, fmt.Errorf("indexing PVs by volume handle: %w", err)
	}
	if dyn != nil {
		f.contents = dynamicinformer.NewFilteredDynamicInformer(dyn, VolumeSnapshotContents, "", 0, cache.Indexers{}, nil).Informer()
	}
	return f, nil
}

// volumeHandle returns the handle of a PV that may refer to a volume of
// this node. Volume IDs do not name the node and disk names repeat across
// nodes, so a PV of another node with the same handle (the claim was
// provisioned again there after CreateVolume had succeeded here) is not
// this volume's; counting it would keep the volume here forever, unseen.
// A PV that is not provably on another node counts (diskfit.PVRefersTo):
// it must never cost a volume.
func (f *OrphanFinder) volumeHandle(pv *corev1.PersistentVolume) (string, bool) {
	if !diskfit.IsDiskFitPV(pv) || !diskfit.PVRefersTo(pv, f.node, pv.Spec.CSI.VolumeHandle) {
		return "", false
	}
	return pv.Spec.CSI.VolumeHandle, true
}

// volumeHandles is volumeHandle of a PV, for the informer's index and
// handler.
func (f *OrphanFinder) volumeHandles(obj any) []string {
	if pv, ok := obj.(*corev1.PersistentVolume); ok {
		if handle, ok := f.volumeHandle(pv); ok {
			return []string{handle}
		}
	}
	return nil
}

// snapshotHandles returns the snapshot handles a VolumeSnapshotContent of
// this driver names: in its status (a snapshot this driver made) or in its
// spec (a pre-provisioned one).
func snapshotHandles(obj any) []string {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil
	}
	if driver, _, _ := unstructured.NestedString(u.Object, "spec", "driver"); driver != diskfit.DriverName {
		return nil
	}
	var handles []string
	for _, path := range [][]string{{"status", "snapshotHandle"}, {"spec", "source", "snapshotHandle"}} {
		if handle, ok, _ := unstructured.NestedString(u.Object, path...); ok && handle != "" {
			handles = append(handles, handle)
		}
	}
	return handles
}

// OnVolumeHandle calls fn with the volume handle of every PV that may
// refer to a volume of this node (see volumeHandle) the informer sees
// added or updated.
func (f *OrphanFinder) OnVolumeHandle(fn func(handle string)) error {
	if err := onHandles(f.pvs, f.volumeHandles, fn); err != nil {
		return fmt.Errorf("watching PVs: %w", err)
	}
	return nil
}

// OnSnapshotHandle calls fn with the snapshot handles of every
// VolumeSnapshotContent of this driver the informer RunContentInformer
// runs sees added or updated. Without a dynamic client it does nothing.
func (f *OrphanFinder) OnSnapshotHandle(fn func(handle string)) error {
	if f.contents == nil {
		return nil
	}
	if err := onHandles(f.contents, snapshotHandles, fn); err != nil {
		return fmt.Errorf("watching VolumeSnapshotContents: %w", err)
	}
	return nil
}

// onHandles calls fn with each handle handles finds in an object inf sees
// added or updated.
func onHandles(inf cache.SharedIndexInformer, handles func(obj any) []string, fn func(handle string)) error {
	each := func(obj any) {
		for _, handle := range handles(obj) {
			fn(handle)
		}
	}
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    each,
		UpdateFunc: func(_, obj any) { each(obj) },
	})
	return err
}

// RunContentInformer runs the VolumeSnapshotContent informer until ctx
// ends. The CRD is external-snapshotter's and may not be installed, or be
// installed later: until the API serves VolumeSnapshotContents, it asks
// every servedPoll, rather than have the informer fail and log every few
// seconds. Without a dynamic client it returns at once.
func (f *OrphanFinder) RunContentInformer(ctx context.Context) {
	if f.contents == nil {
		return
	}
	logger := klog.FromContext(ctx)
	toldMissing := false
	err := wait.PollUntilContextCancel(ctx, f.servedPoll, true, func(ctx context.Context) (bool, error) {
		served, err := f.servesContents(ctx)
		switch {
		case err != nil:
			logger.Error(err, "Asking whether the API serves VolumeSnapshotContents")
		case !served && !toldMissing:
			logger.Info("The API serves no VolumeSnapshotContents; snapshots are watched once it does", "groupVersion", VolumeSnapshotContents.GroupVersion())
			toldMissing = true
		}
		return served, nil
	})
	if err != nil {
		return
	}
	logger.V(2).Info("Watching VolumeSnapshotContents")
	f.contents.RunWithContext(ctx)
}

// servesContents tells whether the API serves VolumeSnapshotContents.
func (f *OrphanFinder) servesContents(ctx context.Context) (bool, error) {
	list, err := discovery.ToServerResourcesInterfaceWithContext(f.client.Discovery()).
		ServerResourcesForGroupVersionWithContext(ctx, VolumeSnapshotContents.GroupVersion().String())
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	for _, r := range list.APIResources {
		if r.Name == VolumeSnapshotContents.Resource {
			return true, nil
		}
	}
	return false, nil
}

// VolumesWithoutPV implements driver.OrphanFinder.
func (f *OrphanFinder) VolumesWithoutPV(ctx context.Context, ids []string, confirm bool) ([]string, error) {
	if !f.pvs.HasSynced() {
		return nil, errors.New("the PV cache has not synced yet")
	}
	var uncached []string
	for _, id := range ids {
		pvs, err := f.pvs.GetIndexer().ByIndex(volumeHandleIndex, id)
		if err != nil {
			return nil, fmt.Errorf("looking up PVs of volume %s: %w", id, err)
		}
		if len(pvs) == 0 {
			uncached = append(uncached, id)
		}
	}
	if len(uncached) == 0 || !confirm {
		return uncached, nil
	}
	handles := sets.New[string]()
	if err := f.listPVs(ctx, func(pv *corev1.PersistentVolume) { handles.Insert(f.volumeHandles(pv)...) }); err != nil {
		return nil, err
	}
	return without(uncached, handles), nil
}

// PVsOf implements driver.OrphanFinder: the PVs of the volume (see
// volumeHandle) in a consistent list from the API server. Not the cache:
// it may not have seen a PV Released yet, or deleted, and a PV it never
// saw (its watch broken or behind) would let DeleteVolume delete the data
// that PV's claim uses. A list per deletion is what that costs.
func (f *OrphanFinder) PVsOf(ctx context.Context, volumeID string) ([]*corev1.PersistentVolume, error) {
	var pvs []*corev1.PersistentVolume
	err := f.listPVs(ctx, func(pv *corev1.PersistentVolume) {
		if handle, ok := f.volumeHandle(pv); ok && handle == volumeID {
			pvs = append(pvs, pv)
		}
	})
	return pvs, err
}

// listPVs calls each for every PV in a consistent list (listAll).
func (f *OrphanFinder) listPVs(ctx context.Context, each func(*corev1.PersistentVolume)) error {
	err := listAll(ctx, func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		return f.client.CoreV1().PersistentVolumes().List(ctx, opts)
	}, func(obj runtime.Object) {
		if pv, ok := obj.(*corev1.PersistentVolume); ok {
			each(pv)
		}
	})
	if err != nil {
		return fmt.Errorf("listing PVs: %w", err)
	}
	return nil
}

// Retain implements driver.OrphanFinder: pv gets reclaim policy Retain, as
// long as it is still as it was read (its resourceVersion).
func (f *OrphanFinder) Retain(ctx context.Context, pv *corev1.PersistentVolume) error {
	patch := fmt.Appendf(nil, `{"metadata":{"resourceVersion":%q},"spec":{"persistentVolumeReclaimPolicy":"Retain"}}`, pv.ResourceVersion)
	if _, err := f.client.CoreV1().PersistentVolumes().Patch(ctx, pv.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("setting PV %s to reclaim policy Retain: %w", pv.Name, err)
	}
	return nil
}

// ClaimWaits implements driver.OrphanFinder with diskfit.ClaimWaitsFor;
// a claim bound under the volume's name waits for it if the PV of that
// name refers to it or is gone. The claim and the PV are read from the API
// server, not a cache.
func (f *OrphanFinder) ClaimWaits(ctx context.Context, namespace, name, volumeID, volumeName string) (bool, error) {
	claim, err := f.client.CoreV1().PersistentVolumeClaims(namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("reading claim %s/%s: %w", namespace, name, err)
	}
	waits, checkPV := diskfit.ClaimWaitsFor(claim, volumeName, f.node)
	if !waits || !checkPV {
		return waits, nil
	}
	pv, err := f.client.CoreV1().PersistentVolumes().Get(ctx, claim.Spec.VolumeName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		// Bound to a PV that is gone: keep the volume, it may be the
		// claim's data.
		return true, nil
	case err != nil:
		return false, fmt.Errorf("reading PV %s of claim %s/%s: %w", claim.Spec.VolumeName, namespace, name, err)
	}
	handle, ours := f.volumeHandle(pv)
	return ours && handle == volumeID, nil
}

// SnapshotsWithoutContent implements driver.OrphanFinder (see
// snapshotHandles).
func (f *OrphanFinder) SnapshotsWithoutContent(ctx context.Context, ids []string) ([]string, error) {
	if f.dynamic == nil {
		return nil, errors.New("no client for VolumeSnapshotContents")
	}
	handles := sets.New[string]()
	err := listAll(ctx, func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		return f.dynamic.Resource(VolumeSnapshotContents).List(ctx, opts)
	}, func(obj runtime.Object) {
		handles.Insert(snapshotHandles(obj)...)
	})
	if err != nil {
		return nil, fmt.Errorf("listing VolumeSnapshotContents: %w", err)
	}
	return without(ids, handles), nil
}

// SnapshotWaits implements driver.OrphanFinder: a VolumeSnapshotContent
// of this driver that is being made for the snapshot (diskfit.NamedFor) from the
// volume and has no snapshot handle yet, listed from the API server.
func (f *OrphanFinder) SnapshotWaits(ctx context.Context, volumeID, snapshotName string) (bool, error) {
	if f.dynamic == nil {
		return false, errors.New("no client for VolumeSnapshotContents")
	}
	waits := false
	err := listAll(ctx, func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		return f.dynamic.Resource(VolumeSnapshotContents).List(ctx, opts)
	}, func(obj runtime.Object) {
		u := obj.(*unstructured.Unstructured)
		driver, _, _ := unstructured.NestedString(u.Object, "spec", "driver")
		source, _, _ := unstructured.NestedString(u.Object, "spec", "source", "volumeHandle")
		uid, _, _ := unstructured.NestedString(u.Object, "spec", "volumeSnapshotRef", "uid")
		waits = waits || driver == diskfit.DriverName && source == volumeID && len(snapshotHandles(u)) == 0 && diskfit.NamedFor(snapshotName, uid)
	})
	if apierrors.IsNotFound(err) {
		// The API serves no VolumeSnapshotContents: none is being made.
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("listing VolumeSnapshotContents: %w", err)
	}
	return waits, nil
}

// ContentsOf implements driver.OrphanFinder: the VolumeSnapshotContents
// of this driver that name the snapshot (snapshotHandles), listed from the
// API server (a consistent read: a content made a moment ago counts).
func (f *OrphanFinder) ContentsOf(ctx context.Context, snapshotID string) ([]*unstructured.Unstructured, error) {
	if f.dynamic == nil {
		return nil, errors.New("no client for VolumeSnapshotContents")
	}
	var out []*unstructured.Unstructured
	err := listAll(ctx, func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		return f.dynamic.Resource(VolumeSnapshotContents).List(ctx, opts)
	}, func(obj runtime.Object) {
		if slices.Contains(snapshotHandles(obj), snapshotID) {
			out = append(out, obj.(*unstructured.Unstructured))
		}
	})
	if apierrors.IsNotFound(err) {
		// The API serves no VolumeSnapshotContents: none refers to it.
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing VolumeSnapshotContents: %w", err)
	}
	return out, nil
}

// RetainContent implements driver.OrphanFinder: content gets deletion
// policy Retain, as long as it is still as it was read (its
// resourceVersion).
func (f *OrphanFinder) RetainContent(ctx context.Context, content *unstructured.Unstructured) error {
	patch := fmt.Appendf(nil, `{"metadata":{"resourceVersion":%q},"spec":{"deletionPolicy":"Retain"}}`, content.GetResourceVersion())
	if _, err := f.dynamic.Resource(VolumeSnapshotContents).Patch(ctx, content.GetName(), types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("setting VolumeSnapshotContent %s to deletionPolicy Retain: %w", content.GetName(), err)
	}
	return nil
}

// listAll lists every object from the API server (not its watch cache),
// page by page, and fails on any error rather than return part of them.
func listAll(ctx context.Context, list pager.ListPageFunc, each func(runtime.Object)) error {
	p := pager.New(list)
	p.PageSize = 500
	// A consistent read: what is listed includes every object created
	// before the call.
	return p.EachListItem(ctx, metav1.ListOptions{}, func(obj runtime.Object) error {
		each(obj)
		return nil
	})
}

func without(ids []string, handles sets.Set[string]) []string {
	var out []string
	for _, id := range ids {
		if !handles.Has(id) {
			out = append(out, id)
		}
	}
	return out
}

// CachedPVs returns how many PVs the informer holds.
func (f *OrphanFinder) CachedPVs() int { return len(f.pvs.GetStore().ListKeys()) }

// DisksOfPVs implements driver.OrphanFinder.
func (f *OrphanFinder) DisksOfPVs(node string) map[string]int {
	if !f.pvs.HasSynced() {
		return nil
	}
	out := map[string]int{}
	for _, obj := range f.pvs.GetStore().List() {
		if loc, ok := diskfit.PVLocation(obj.(*corev1.PersistentVolume)); ok && loc.Node == node {
			out[loc.Disk]++
		}
	}
	return out
}
