package diskfit

import (
	"strings"

	v1 "k8s.io/api/core/v1"
)

// ClaimWaitsFor reports whether claim, the one a volume with the name, or
// the handle disk:name, volume was made for on node, may still get a PV for that volume,
// so that the volume must not be deleted although no PV refers to it yet:
// external-provisioner saves the PV only once it can, and retries for as
// long as it takes. It is that claim (external-provisioner names the
// volume pvc-<claim UID>, see NamedFor, so a claim made again under the
// same name has another UID), and either it is bound to no PV and not scheduled to
// another node (a node provisions only the claims scheduled to it), or it
// is bound under the volume's name (a PV of that name that exists and does
// not refer to the volume means the claim was provisioned again on another
// node: pvOfName tells, checked by the caller).
func ClaimWaitsFor(claim *v1.PersistentVolumeClaim, volume, node string) (waits, pvOfName bool) {
	if claim == nil || !NamedFor(volume, string(claim.UID)) {
		return false, false
	}
	if claim.Spec.VolumeName == "" {
		selected, ok := claim.Annotations[SelectedNodeAnnotation]
		return !ok || selected == node, false
	}
	bound := claim.Spec.VolumeName
	underName := volume == bound || strings.HasSuffix(volume, ":"+bound)
	return underName, underName
}

// NamedFor reports whether a sidecar named an object name (or the handle
// disk:name) for the API object of UID uid: <prefix>-<uid>, or, with
// external-provisioner's --volume-name-uuid-length or csi-snapshotter's
// --snapshot-name-uuid-length, <prefix>-<uid without dashes, cut>.
func NamedFor(name, uid string) bool {
	if uid == "" {
		return false
	}
	if strings.HasSuffix(name, "-"+uid) {
		return true
	}
	cut := name[strings.LastIndex(name, "-")+1:]
	return cut != "" && strings.HasPrefix(strings.ReplaceAll(uid, "-", ""), cut)
}
