package diskfit

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
)

// DiskNamePattern is the syntax of a disk name. The CRD schema enforces the
// same pattern (checked by a test), so a name that passes ValidateDiskName
// can always be published.
const DiskNamePattern = `^[a-z0-9]([a-z0-9._-]*[a-z0-9])?$`

// MaxDiskNameLength bounds a disk name; disk names end up in volume IDs.
const MaxDiskNameLength = 63

var diskNameRE = regexp.MustCompile(DiskNamePattern)

// ValidateDiskName returns an error when name cannot name a disk. Besides
// DiskNamePattern it refuses "..": the driver rejects every volume ID
// containing "..", so a disk named "a..b" would issue IDs it then refuses.
func ValidateDiskName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("disk name is empty")
	case len(name) > MaxDiskNameLength:
		return fmt.Errorf("disk name %.20q... is longer than %d characters", name, MaxDiskNameLength)
	case !diskNameRE.MatchString(name):
		return fmt.Errorf("disk name %q must be lower-case letters, digits, '.', '_' or '-', starting and ending with a letter or digit", name)
	case strings.Contains(name, ".."):
		return fmt.Errorf("disk name %q must not contain \"..\"", name)
	}
	return nil
}

// Location is where a volume lives or will live.
type Location struct {
	Node string
	Disk string
}

// IsDiskFitPV reports whether pv is a volume of the diskfit driver,
// wherever it says it lives.
func IsDiskFitPV(pv *v1.PersistentVolume) bool {
	return pv.Spec.CSI != nil && pv.Spec.CSI.Driver == DriverName
}

// VolumeIDSeparator separates the disk from the rest in the driver's
// volume and snapshot IDs, "<disk>:<key>"; a disk name cannot hold it.
const VolumeIDSeparator = ":"

// HandleDisk returns the disk a volume handle of the diskfit driver names,
// "" when it names none.
func HandleDisk(handle string) string {
	disk, _, ok := strings.Cut(handle, VolumeIDSeparator)
	if !ok {
		return ""
	}
	return disk
}

// PVLocation returns where a diskfit PV lives, and false for PVs of other
// drivers or without a well-formed disk name (one that no DiskNode can
// hold counts against nothing). The disk is the one its volume attributes
// name (VolumeContextDiskKey), as the provisioner writes them, or else the
// one its handle names, which the driver serves it from (a PV made by hand
// may carry no attributes).
func PVLocation(pv *v1.PersistentVolume) (Location, bool) {
	if !IsDiskFitPV(pv) {
		return Location{}, false
	}
	disk := pv.Spec.CSI.VolumeAttributes[VolumeContextDiskKey]
	if disk == "" {
		disk = HandleDisk(pv.Spec.CSI.VolumeHandle)
	}
	if ValidateDiskName(disk) != nil {
		return Location{}, false
	}
	node := ""
	if na := pv.Spec.NodeAffinity; na != nil && na.Required != nil {
	terms:
		for _, term := range na.Required.NodeSelectorTerms {
			for _, expr := range term.MatchExpressions {
				if expr.Key == TopologyKey && expr.Operator == v1.NodeSelectorOpIn && len(expr.Values) == 1 {
					node = expr.Values[0]
					break terms
				}
			}
		}
	}
	if node == "" {
		return Location{}, false
	}
	return Location{Node: node, Disk: disk}, true
}

// PVCLocation returns the node and disk an unbound PVC has been placed on
// by the scheduler, and false when it has not (or no longer) been: a PVC
// whose selected-node was removed does not count, whatever its stale disk
// annotation says. Neither does a disk annotation that is not a well-formed
// disk name (DiskNamePattern): it names no disk, so the claim is placed
// again and AssumePodVolumes overwrites the annotation, where counting it
// as placed would leave it to the driver to refuse.
func PVCLocation(pvc *v1.PersistentVolumeClaim) (Location, bool) {
	if pvc.Spec.VolumeName != "" {
		return Location{}, false
	}
	loc, ok := SelectedLocation(pvc)
	if !ok || ValidateDiskName(loc.Disk) != nil {
		return Location{}, false
	}
	return loc, true
}

// SelectedLocation returns the node and disk a PVC's annotations name
// (SelectedNodeAnnotation, SelectedDiskAnnotation), the disk as written,
// and false when they name none that counts: no disk, or no node. A disk
// annotation without selected-node is left over from before a reschedule
// (external-provisioner removed selected-node) and no longer counts.
// PVCLocation, which the scheduler side counts, also wants the claim
// unbound and the disk name well-formed; the driver refuses a malformed one
// (ResourceExhausted) so that the claim is placed again.
func SelectedLocation(pvc *v1.PersistentVolumeClaim) (Location, bool) {
	node := pvc.Annotations[SelectedNodeAnnotation]
	disk := pvc.Annotations[SelectedDiskAnnotation]
	if node == "" || disk == "" {
		return Location{}, false
	}
	return Location{Node: node, Disk: disk}, true
}

// BoundClaim reports whether pvc is the claim pv is bound to: the PV's
// claimRef names it with its UID, and the claim names the PV. A claim made
// anew under the same name is not.
func BoundClaim(pv *v1.PersistentVolume, pvc *v1.PersistentVolumeClaim) bool {
	ref := pv.Spec.ClaimRef
	return ref != nil && ref.Namespace == pvc.Namespace && ref.Name == pvc.Name &&
		ref.UID == pvc.UID && pvc.Spec.VolumeName == pv.Name
}

// ReleasedOnDiskLoss reports whether pvc asked to be released when its disk
// is lost (OnDiskLossAnnotation); class is its StorageClass, nil when
// unknown.
func ReleasedOnDiskLoss(pvc *v1.PersistentVolumeClaim, class *storagev1.StorageClass) bool {
	if v, ok := pvc.Annotations[OnDiskLossAnnotation]; ok {
		return v == OnDiskLossRelease
	}
	return class != nil && class.Parameters[OnDiskLossAnnotation] == OnDiskLossRelease
}

// ReleasedOnNodeLoss reports whether pvc asked to be released when its
// node is deleted: with ReleaseOnNodeDeletionAnnotation, or by asking to
// be released when its disk is lost.
func ReleasedOnNodeLoss(pvc *v1.PersistentVolumeClaim, class *storagev1.StorageClass) bool {
	return pvc.Annotations[ReleaseOnNodeDeletionAnnotation] == "true" || ReleasedOnDiskLoss(pvc, class)
}

// PVRefersTo reports whether pv may refer to the volume handle on node: it
// is a diskfit PV with that handle and not provably on another node.
// Volume handles name a disk, not a node, and disk names repeat across
// nodes. A PV is provably elsewhere only when every one of its node
// selector terms requires the topology key to be a node other than this
// one; anything else (no node affinity, as a PV made by hand may have, a
// term without the key) refers to it, so that how a PV was written never
// makes a volume look unused.
func PVRefersTo(pv *v1.PersistentVolume, node, handle string) bool {
	if !IsDiskFitPV(pv) || pv.Spec.CSI.VolumeHandle != handle {
		return false
	}
	na := pv.Spec.NodeAffinity
	if na == nil || na.Required == nil {
		return true
	}
	for _, term := range na.Required.NodeSelectorTerms {
		elsewhere := false
		for _, expr := range term.MatchExpressions {
			if expr.Key == TopologyKey && expr.Operator == v1.NodeSelectorOpIn && !slices.Contains(expr.Values, node) {
				elsewhere = true
			}
		}
		if !elsewhere {
			return true
		}
	}
	return len(na.Required.NodeSelectorTerms) == 0
}
