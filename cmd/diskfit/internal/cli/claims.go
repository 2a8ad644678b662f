package cli

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/csi-driver/lifecycle"
)

// diskClaim is a bound claim on a diskfit volume.
type diskClaim struct {
	lifecycle.Claim
	// loc is where the volume lives.
	loc diskfit.Location
	// release is true when the claim asked to be released when its disk
	// is lost (diskfit.ReleasedOnDiskLoss).
	release bool
	// deleting is true when the claim is being deleted: it stays, and its
	// volume in use, as long as a pod uses it.
	deleting bool
}

// key is the claim's namespace/name.
func (d diskClaim) key() string {
	return d.PVC.Namespace + "/" + d.PVC.Name
}

// onDiskLoss is what becomes of the claim when its disk is lost or
// drained with --release, as the annotation says it, and whether it is
// being deleted.
func (d diskClaim) onDiskLoss() string {
	return onDiskLoss(d.release, d.deleting)
}

func onDiskLoss(release, deleting bool) string {
	what := diskfit.OnDiskLossKeep
	if release {
		what = diskfit.OnDiskLossRelease
	}
	if deleting {
		what += ", being deleted"
	}
	return what
}

// claimsOn lists the bound claims whose volumes live on the disks keep
// accepts, sorted by node, disk, namespace and name. A claim being deleted
// is listed: it stays as long as a pod uses its volume (a release left
// half done by an interrupted drain is one). PVs whose claim is gone are
// left out.
func claimsOn(ctx context.Context, c *Clients, keep func(diskfit.Location) bool) ([]diskClaim, error) {
	pvs, err := c.Kube.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing PersistentVolumes: %w", err)
	}
	var out []diskClaim
	for i := range pvs.Items {
		pv := &pvs.Items[i]
		if loc, ok := diskfit.PVLocation(pv); ok && keep(loc) && pv.Spec.ClaimRef != nil {
			out = append(out, diskClaim{Claim: lifecycle.Claim{PV: pv}, loc: loc})
		}
	}
	if len(out) == 0 {
		return nil, nil
	}
	pvcs, err := c.Kube.CoreV1().PersistentVolumeClaims(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing PersistentVolumeClaims: %w", err)
	}
	byName := map[types.NamespacedName]int{}
	for i, pvc := range pvcs.Items {
		byName[types.NamespacedName{Namespace: pvc.Namespace, Name: pvc.Name}] = i
	}
	classes, err := c.Kube.StorageV1().StorageClasses().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing StorageClasses: %w", err)
	}
	out = slices.DeleteFunc(out, func(d diskClaim) bool {
		ref := d.PV.Spec.ClaimRef
		i, ok := byName[types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}]
		if !ok {
			return true
		}
		pvc := &pvcs.Items[i]
		return !diskfit.BoundClaim(d.PV, pvc)
	})
	for i := range out {
		d := &out[i]
		ref := d.PV.Spec.ClaimRef
		d.PVC = &pvcs.Items[byName[types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}]]
		if name := diskfit.ClaimClass(d.PVC, ""); name != "" {
			if j := slices.IndexFunc(classes.Items, func(sc storagev1.StorageClass) bool { return sc.Name == name }); j >= 0 {
				d.Class = &classes.Items[j]
			}
		}
		d.release = diskfit.ReleasedOnDiskLoss(d.PVC, d.Class)
		d.deleting = d.PVC.DeletionTimestamp != nil
	}
	slices.SortFunc(out, func(a, b diskClaim) int {
		return cmp.Or(cmp.Compare(a.loc.Node, b.loc.Node), cmp.Compare(a.loc.Disk, b.loc.Disk),
			cmp.Compare(a.PVC.Namespace, b.PVC.Namespace), cmp.Compare(a.PVC.Name, b.PVC.Name))
	})
	return out, nil
}
