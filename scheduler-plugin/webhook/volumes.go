package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// ValidateVolumePath is the path the API server posts AdmissionReviews of
// PVs created by the node driver's ServiceAccount to.
const ValidateVolumePath = "/validate-volume"

// SelectedNodeAnnotation is where the scheduler writes the node of a
// WaitForFirstConsumer claim, and what a node's external-provisioner
// provisions the claims of.
const SelectedNodeAnnotation = "volume.kubernetes.io/selected-node"

// Outcomes of a volume admission request.
const (
	outcomeAllowed = "allowed"
	outcomeDenied  = "denied"
)

// volumeValidator judges the PVs that a node's driver creates. Every node
// shares one ServiceAccount, whose RBAC (external-provisioner's) grants PV
// create cluster-wide, and the admission policy diskfit-volumes-own-node
// keeps a node's PVs on that node. What a policy cannot see is the claim a
// PV is pre-bound to: the PV controller binds a claim to a PV whose
// claimRef names it even when the claim waits for its first consumer, and
// the pod follows its volume. So root on one node could take any tenant's
// pending claim, and the data written to it, onto a volume of its own.
// A node's provisioner creates a PV only after the scheduler wrote the
// node into the claim; the validator allows exactly that: a PV pre-bound,
// by UID, to an existing claim that is not bound to another PV and whose
// selected node is the node the request's token is bound to.
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
	deny := func(code int32, reason metav1.StatusReason, outcome, msg string) (*admissionv1.AdmissionResponse, string) {
		resp.Allowed = false
		resp.Result = &metav1.Status{Status: metav1.StatusFailure, Code: code, Reason: reason, Message: msg}
		klog.FromContext(ctx).Info("Refused a PV of the node driver", "pv", req.Name, "user", req.UserInfo.Username, "reason", msg)
		return resp, outcome
	}
	forbid := func(format string, args ...any) (*admissionv1.AdmissionResponse, string) {
		return deny(http.StatusForbidden, metav1.StatusReasonForbidden, outcomeDenied, fmt.Sprintf(format, args...))
	}

	var node string
	if names := req.UserInfo.Extra[serviceaccount.NodeNameKey]; len(names) == 1 {
		node = names[0]
	}
	if node == "" {
		return forbid("a token of the diskfit node driver that is bound to no node may not create PVs")
	}
	pv := &v1.PersistentVolume{}
	if err := json.Unmarshal(req.Object.Raw, pv); err != nil {
		return deny(http.StatusBadRequest, metav1.StatusReasonBadRequest, outcomeError, fmt.Sprintf("decoding the PV: %v", err))
	}
	only := fmt.Sprintf("the diskfit node driver of %s may create a PV only for a claim scheduled to %s (%s)", node, node, SelectedNodeAnnotation)
	ref := pv.Spec.ClaimRef
	if ref == nil || ref.Namespace == "" || ref.Name == "" || ref.UID == "" {
		return forbid("%s: PV %s names no claim by namespace, name and UID", only, pv.Name)
	}
	claimRef := klog.KRef(ref.Namespace, ref.Name)
	claim, err := v.client.CoreV1().PersistentVolumeClaims(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return forbid("%s: claim %s does not exist", only, claimRef)
	case err != nil:
		return deny(http.StatusInternalServerError, metav1.StatusReasonInternalError, outcomeError,
			fmt.Sprintf("reading claim %s of PV %s: %v", claimRef, pv.Name, err))
	case claim.UID != ref.UID:
		return forbid("%s: claim %s has UID %s, not the PV's %s", only, claimRef, claim.UID, ref.UID)
	case claim.Spec.VolumeName != "" && claim.Spec.VolumeName != pv.Name:
		return forbid("%s: claim %s is bound to PV %s", only, claimRef, claim.Spec.VolumeName)
	}
	switch selected, ok := claim.Annotations[SelectedNodeAnnotation]; {
	case !ok:
		return forbid("%s: claim %s is scheduled to no node", only, claimRef)
	case selected != node:
		return forbid("%s: claim %s is scheduled to %s", only, claimRef, selected)
	}
	return resp, outcomeAllowed
}
