package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"

	admissionv1 "k8s.io/api/admission/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/diskfit/diskfit/apis/diskfit"
)

// ValidateVolumePath is the path the API server posts AdmissionReviews of
// PVs created by the node driver's ServiceAccount to.
const ValidateVolumePath = "/validate-volume"

// storageProvisionerAnnotation is where the PV controller names the
// provisioner it hands a claim to; external-provisioner provisions only
// the claims that name it.
const storageProvisionerAnnotation = "volume.kubernetes.io/storage-provisioner"

// Outcomes of a volume admission request.
const (
	outcomeAllowed = "allowed"
	outcomeDenied  = "denied"
)

// betaStorageProvisionerAnnotation is the older name of
// storageProvisionerAnnotation, still read by external-provisioner.
const betaStorageProvisionerAnnotation = "volume.beta.kubernetes.io/storage-provisioner"

// boundByControllerAnnotation on a PV tells the PV controller that it set
// the claimRef itself, so it takes the claimRef off again when the claim
// is bound to another PV, and the PV is then free for any claim.
const boundByControllerAnnotation = "pv.kubernetes.io/bound-by-controller"

// volumeValidator judges the PVs that a node's driver creates. Every node
// shares one ServiceAccount, whose RBAC (external-provisioner's) grants PV
// create cluster-wide, and the admission policy diskfit-volumes-own-node
// keeps a node's PVs on that node and their claimRef as created. What a
// policy cannot see is the claim a PV is pre-bound to: the PV controller
// binds a claim to a PV whose claimRef names it even when the claim waits
// for its first consumer, and the pod follows its volume. So root on one
// node could take any tenant's pending claim, and the data written to it,
// onto a volume of its own.
//
// A node's provisioner creates a PV only after the scheduler wrote the
// node into the claim, and only the one PV external-provisioner makes for
// it; the validator allows exactly that: a diskfit CSI PV named
// pvc-<claim UID>, pre-bound by UID, not marked as bound by the PV
// controller, not recycled, and, when that claim still exists, for a claim
// of diskfit's provisioner bound to no other PV, whose selected node is
// the node the request's token is bound to, of the PV's class and volume
// mode and access modes and asking for no more than its capacity. A PV
// for a claim that is gone (deleted, or deleted and created again under a
// new UID, while its volume was made) is allowed as before: the PV
// controller releases it and its reclaim policy applies; its name ties it
// to that claim alone.
type volumeValidator struct {
	// client reads claims from the API server, not a cache: the
	// provisioner creates the PV right after it saw the scheduler's
	// write, sooner than a watch may deliver it here.
	client kubernetes.Interface
}

// admit answers one admission request for a PV.
func (v *volumeValidator) admit(ctx context.Context, req *admissionv1.AdmissionRequest) (*admissionv1.AdmissionResponse, string) {
	resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	if req.Kind.Group != "" || req.Kind.Kind != "PersistentVolume" || req.SubResource != "" || req.Operation != admissionv1.Create {
		return resp, outcomeSkipped
	}
	refusal := v.refusal(ctx, req)
	if refusal == nil {
		return resp, outcomeAllowed
	}
	resp.Allowed, resp.Result = false, refusal
	klog.FromContext(ctx).Info("Refused a PV of the node driver", "pv", req.Name, "user", req.UserInfo.Username, "reason", refusal.Message)
	if refusal.Code == http.StatusForbidden {
		return resp, outcomeDenied
	}
	return resp, outcomeError
}

// refusal says why the PV of req is refused, nil when it is allowed.
func (v *volumeValidator) refusal(ctx context.Context, req *admissionv1.AdmissionRequest) *metav1.Status {
	var node string
	if names := req.UserInfo.Extra[serviceaccount.NodeNameKey]; len(names) == 1 {
		node = names[0]
	}
	if node == "" {
		return failure(http.StatusForbidden, metav1.StatusReasonForbidden, "a token of the diskfit node driver that is bound to no node may not create PVs")
	}
	pv := &v1.PersistentVolume{}
	if err := json.Unmarshal(req.Object.Raw, pv); err != nil {
		return failure(http.StatusBadRequest, metav1.StatusReasonBadRequest, fmt.Sprintf("decoding the PV: %v", err))
	}
	// forbid says what a node may create, then why not this PV.
	forbid := func(format string, args ...any) *metav1.Status {
		return failure(http.StatusForbidden, metav1.StatusReasonForbidden,
			fmt.Sprintf("the diskfit node driver of %s may create a PV only for a claim scheduled to %s (%s): ", node, node, diskfit.SelectedNodeAnnotation)+
				fmt.Sprintf(format, args...))
	}
	ref := pv.Spec.ClaimRef
	if ref == nil || ref.Namespace == "" || ref.Name == "" || ref.UID == "" {
		return forbid("PV %s names no claim by namespace, name and UID", pv.Name)
	}
	claimRef := klog.KRef(ref.Namespace, ref.Name)
	switch {
	case pv.Name != "pvc-"+string(ref.UID):
		return forbid("PV %s is not named pvc-%s, as the one PV external-provisioner makes for claim %s", pv.Name, ref.UID, claimRef)
	case pv.Spec.CSI == nil || pv.Spec.CSI.Driver != diskfit.DriverName:
		return forbid("PV %s is not a CSI volume of %s", pv.Name, diskfit.DriverName)
	case pv.Spec.PersistentVolumeReclaimPolicy == v1.PersistentVolumeReclaimRecycle:
		return forbid("PV %s has reclaim policy Recycle", pv.Name)
	case metav1.HasAnnotation(pv.ObjectMeta, boundByControllerAnnotation):
		return forbid("PV %s carries %s, which only the PV controller sets", pv.Name, boundByControllerAnnotation)
	}

	claim, err := v.client.CoreV1().PersistentVolumeClaims(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err) || err == nil && claim.UID != ref.UID:
		klog.FromContext(ctx).V(2).Info("PV of the node driver for a claim that is gone; the PV controller releases it", "pv", pv.Name, "claim", claimRef, "uid", ref.UID)
		return nil
	case err != nil:
		return failure(http.StatusInternalServerError, metav1.StatusReasonInternalError, fmt.Sprintf("reading claim %s of PV %s: %v", claimRef, pv.Name, err))
	}
	if why := mismatch(pv, claim, node); why != "" {
		return forbid("%s", why)
	}
	return nil
}

func failure(code int32, reason metav1.StatusReason, msg string) *metav1.Status {
	return &metav1.Status{Status: metav1.StatusFailure, Code: code, Reason: reason, Message: msg}
}

// mismatch says why pv is not the PV the node's provisioner makes for
// claim, "" when it is.
func mismatch(pv *v1.PersistentVolume, claim *v1.PersistentVolumeClaim, node string) string {
	claimRef := klog.KObj(claim)
	provisioner, ok := claim.Annotations[storageProvisionerAnnotation]
	if !ok {
		provisioner = claim.Annotations[betaStorageProvisionerAnnotation]
	}
	class := diskfit.ClaimClass(claim, "")
	claimMode := ptr.Deref(claim.Spec.VolumeMode, v1.PersistentVolumeFilesystem)
	pvMode := ptr.Deref(pv.Spec.VolumeMode, v1.PersistentVolumeFilesystem)
	capacity, request := pv.Spec.Capacity[v1.ResourceStorage], claim.Spec.Resources.Requests[v1.ResourceStorage]
	selected, scheduled := claim.Annotations[diskfit.SelectedNodeAnnotation]
	switch {
	case claim.Spec.VolumeName != "" && claim.Spec.VolumeName != pv.Name:
		return fmt.Sprintf("claim %s is bound to PV %s", claimRef, claim.Spec.VolumeName)
	case !scheduled:
		return fmt.Sprintf("claim %s is scheduled to no node", claimRef)
	case selected != node:
		return fmt.Sprintf("claim %s is scheduled to %s", claimRef, selected)
	case provisioner != diskfit.DriverName:
		return fmt.Sprintf("claim %s is not provisioned by %s", claimRef, diskfit.DriverName)
	case pv.Spec.StorageClassName != class:
		return fmt.Sprintf("PV %s is of class %q, not the claim's %q", pv.Name, pv.Spec.StorageClassName, class)
	case pvMode != claimMode:
		return fmt.Sprintf("PV %s has volume mode %s, not the claim's %s", pv.Name, pvMode, claimMode)
	case !slices.Equal(pv.Spec.AccessModes, claim.Spec.AccessModes):
		// external-provisioner copies them; other modes would keep the
		// claim from binding to the one PV its name allows.
		return fmt.Sprintf("PV %s has access modes %v, not the claim's %v", pv.Name, pv.Spec.AccessModes, claim.Spec.AccessModes)
	case capacity.Cmp(request) < 0:
		return fmt.Sprintf("PV %s has capacity %s, which is less than the claim's request %s", pv.Name, capacity.String(), request.String())
	}
	return ""
}
