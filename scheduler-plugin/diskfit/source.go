package diskfit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/diskfit/diskfit/apis/diskfit"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
)

// A claim that restores a VolumeSnapshot or clones another PVC is a reflink
// copy of its source, which only the disk holding the source can make. The
// scheduler must therefore place it on that node and that disk; any other
// choice ends in a CreateVolume that cannot succeed.

// snapshotGroup is the API group of VolumeSnapshots (external-snapshotter).
const snapshotGroup = "snapshot.storage.k8s.io"

// snapshotManagedByLabel is the label snapshot-controller puts on a
// VolumeSnapshotContent in distributed mode: the node whose csi-snapshotter
// takes the snapshot, the node of the source volume.
const snapshotManagedByLabel = "snapshot.storage.kubernetes.io/managed-by"

var (
	volumeSnapshots       = schema.GroupVersionResource{Group: snapshotGroup, Version: "v1", Resource: "volumesnapshots"}
	volumeSnapshotContent = schema.GroupVersionResource{Group: snapshotGroup, Version: "v1", Resource: "volumesnapshotcontents"}
)

// The same resources as the scheduler's event resources
// (<plural>.<version>.<group>), watched through its dynamic informers.
const (
	volumeSnapshotEvents        fwk.EventResource = "volumesnapshots.v1." + snapshotGroup
	volumeSnapshotContentEvents fwk.EventResource = "volumesnapshotcontents.v1." + snapshotGroup
)

// sourceTimeout bounds the reads of a snapshot and its content. Only pods
// restoring snapshots wait for them.
const sourceTimeout = 5 * time.Second

// sourceLocation returns where the data a claim copies lives. ok is false
// for claims without a data source and for sources that are not
// diskfit's to place (volume populators).
func (pl *DiskFit) sourceLocation(ctx context.Context, pvc *v1.PersistentVolumeClaim) (loc diskfit.Location, ok bool, err error) {
	group, kind, namespace, name := dataSource(pvc)
	switch {
	case group == "" && kind == "PersistentVolumeClaim":
		loc, err = pl.claimLocation(namespace, name)
	case group == snapshotGroup && kind == "VolumeSnapshot":
		loc, err = pl.snapshotLocation(ctx, namespace, name)
	default:
		return diskfit.Location{}, false, nil
	}
	if err != nil && namespace != pvc.Namespace {
		// The claim's events must not tell what another namespace holds
		// (whether the object exists, is bound, its content): the
		// scheduler reads it whether or not a ReferenceGrant lets the
		// claim's namespace copy it, which external-provisioner checks.
		klog.FromContext(ctx).V(4).Info("A claim's source in another namespace cannot be located", "pvc", klog.KObj(pvc), "source", klog.KRef(namespace, name), "kind", kind, "err", err)
		hidden := fmt.Errorf("PVC %s/%s copies %s %s/%s, which cannot be located from namespace %s (missing, not ready, or not diskfit's)", pvc.Namespace, pvc.Name, kind, namespace, name, pvc.Namespace)
		var verdict *unresolvableError
		if errors.As(err, &verdict) {
			hidden = unresolvable(hidden)
		}
		return diskfit.Location{}, false, hidden
	}
	if err != nil {
		return diskfit.Location{}, false, fmt.Errorf("PVC %s/%s copies %s %s/%s: %w", pvc.Namespace, pvc.Name, kind, namespace, name, err)
	}
	return loc, true, nil
}

// dataSource returns the claim's data source, preferring dataSourceRef,
// which the API server keeps in step with dataSource: in the claim's
// namespace unless dataSourceRef names another (a cross-namespace source,
// which a ReferenceGrant allows and external-provisioner checks).
func dataSource(pvc *v1.PersistentVolumeClaim) (group, kind, namespace, name string) {
	namespace = pvc.Namespace
	if ref := pvc.Spec.DataSourceRef; ref != nil {
		if ref.APIGroup != nil {
			group = *ref.APIGroup
		}
		if ref.Namespace != nil && *ref.Namespace != "" {
			namespace = *ref.Namespace
		}
		return group, ref.Kind, namespace, ref.Name
	}
	if ref := pvc.Spec.DataSource; ref != nil {
		if ref.APIGroup != nil {
			group = *ref.APIGroup
		}
		return group, ref.Kind, namespace, ref.Name
	}
	return "", "", "", ""
}

// copies reports whether one of the pod's claims copies the object
// group/kind namespace/name.
func (pl *DiskFit) copies(pod *v1.Pod, group, kind, namespace, name string) bool {
	for pvc, err := range pl.podPVCs(pod) {
		if err != nil {
			continue
		}
		if g, k, ns, n := dataSource(pvc); g == group && k == kind && ns == namespace && n == name {
			return true
		}
	}
	return false
}

// claimLocation is where the bound diskfit PVC namespace/name lives.
func (pl *DiskFit) claimLocation(namespace, name string) (diskfit.Location, error) {
	src, err := pl.getPVC(namespace, name)
	if err != nil {
		return diskfit.Location{}, unresolvableIfNotFound(err)
	}
	if src.Spec.VolumeName == "" {
		return diskfit.Location{}, unresolvable(errors.New("the source is not bound yet"))
	}
	pv, err := pl.pvLister.Get(src.Spec.VolumeName)
	if err != nil {
		return diskfit.Location{}, unresolvableIfNotFound(err)
	}
	loc, ok := diskfit.PVLocation(pv)
	if !ok {
		return diskfit.Location{}, unresolvable(fmt.Errorf("the source's volume %s is not a diskfit volume", pv.Name))
	}
	return loc, nil
}

// snapshotLocation is where the VolumeSnapshot namespace/name lives: the
// disk in its snapshot handle ("<disk>:<key>", like volume IDs) and the
// node snapshot-controller labelled its content with.
func (pl *DiskFit) snapshotLocation(ctx context.Context, namespace, name string) (diskfit.Location, error) {
	if pl.snapshots == nil {
		return diskfit.Location{}, unresolvable(errors.New("the scheduler has no client for VolumeSnapshots"))
	}
	ctx, cancel := context.WithTimeout(ctx, sourceTimeout)
	defer cancel()
	snap, err := pl.snapshots.Resource(volumeSnapshots).Namespace(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return diskfit.Location{}, unresolvableIfNotFound(err)
	}
	contentName, _, _ := unstructured.NestedString(snap.Object, "status", "boundVolumeSnapshotContentName")
	if contentName == "" {
		return diskfit.Location{}, unresolvable(errors.New("the snapshot has no content yet"))
	}
	content, err := pl.snapshots.Resource(volumeSnapshotContent).Get(ctx, contentName, metav1.GetOptions{})
	if err != nil {
		return diskfit.Location{}, unresolvableIfNotFound(err)
	}
	handle, _, _ := unstructured.NestedString(content.Object, "status", "snapshotHandle")
	disk, _, found := strings.Cut(handle, ":")
	if !found || diskfit.ValidateDiskName(disk) != nil {
		return diskfit.Location{}, unresolvable(fmt.Errorf("VolumeSnapshotContent %s has no diskfit snapshot handle yet (%q)", contentName, handle))
	}
	node := content.GetLabels()[snapshotManagedByLabel]
	if node == "" {
		return diskfit.Location{}, unresolvable(fmt.Errorf("VolumeSnapshotContent %s has no %s label: snapshot-controller must run with --enable-distributed-snapshotting", contentName, snapshotManagedByLabel))
	}
	return diskfit.Location{Node: node, Disk: disk}, nil
}

// snapshotAPIServed reports whether the cluster serves VolumeSnapshots and
// their contents. The scheduler waits for the informer of every event a
// plugin registers to sync before it schedules anything, so registering
// snapshot events on a cluster without the snapshot CRDs (they are
// optional: manifests/snapshot) would keep it from ever starting. Without
// them, a restore waiting for its snapshot is retried by the queue's
// periodic flush; the API is looked up once, at start.
func snapshotAPIServed(c kubernetes.Interface) (bool, error) {
	list, err := c.Discovery().ServerResourcesForGroupVersion(volumeSnapshots.GroupVersion().String())
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("looking up the VolumeSnapshot API: %w", err)
	}
	served := 0
	for _, r := range list.APIResources {
		if r.Name == volumeSnapshots.Resource || r.Name == volumeSnapshotContent.Resource {
			served++
		}
	}
	return served == 2, nil
}
