package webhook

import (
	"context"
	"encoding/json"
	"fmt"

	admissionv1 "k8s.io/api/admission/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/diskfit/diskfit/apis/diskfit"
)

// OptOutKey, set to OptOutValue as a label or an annotation of a pod, or as
// a label of its namespace, keeps the webhook away from the pod. The
// manifests' objectSelector and namespaceSelector use the labels, so the API
// server does not even call the webhook for such pods.
const (
	OptOutKey   = diskfit.GroupName + "/scheduler"
	OptOutValue = "skip"
)

// Outcomes of an admission request, the values of the metric's "outcome"
// label.
const (
	outcomeMutated = "mutated"
	outcomeSkipped = "skipped"
	outcomeError   = "error"
)

// schedulerNamePatch is the JSONPatch of every mutated pod. "add" replaces
// a member that exists, so it serves an empty and a default-scheduler name
// alike.
var schedulerNamePatch = []byte(`[{"op":"add","path":"/spec/schedulerName","value":"` + diskfit.SchedulerName + `"}]`)

// mutator decides whether a pod uses a diskfit volume. It reads claims and
// classes from informer caches, and from the API server when a cache does
// not have them yet: a StatefulSet creates a pod right after its claims,
// sooner than a watch may deliver them.
type mutator struct {
	client  kubernetes.Interface
	claims  corelisters.PersistentVolumeClaimLister
	classes storagelisters.StorageClassLister
}

// admit answers one admission request. It always allows the request; an
// error leaves the pod as it is, with a warning for the client.
func (m *mutator) admit(ctx context.Context, req *admissionv1.AdmissionRequest) (*admissionv1.AdmissionResponse, string) {
	resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	if req.Kind.Group != "" || req.Kind.Kind != "Pod" || req.SubResource != "" || req.Operation != admissionv1.Create {
		return resp, outcomeSkipped
	}
	logger := klog.FromContext(ctx)
	pod := &v1.Pod{}
	if err := json.Unmarshal(req.Object.Raw, pod); err != nil {
		logger.Error(err, "Decoding the pod of an admission request", "namespace", req.Namespace, "uid", req.UID)
		resp.Warnings = []string{"diskfit webhook: could not decode the pod; spec.schedulerName left unchanged"}
		return resp, outcomeError
	}
	if pod.Labels[OptOutKey] == OptOutValue || pod.Annotations[OptOutKey] == OptOutValue {
		return resp, outcomeSkipped
	}
	if pod.Spec.SchedulerName != "" && pod.Spec.SchedulerName != v1.DefaultSchedulerName {
		return resp, outcomeSkipped
	}
	// A pod being created may have only generateName; the request has the
	// namespace even when the object does not.
	podRef := klog.KRef(req.Namespace, pod.Name+pod.GenerateName)
	uses, err := m.usesDiskFit(ctx, req.Namespace, pod)
	if err != nil {
		logger.Error(err, "Checking a pod's volumes for diskfit claims", "pod", podRef)
		resp.Warnings = []string{"diskfit webhook: could not read the pod's claims; spec.schedulerName left unchanged"}
		return resp, outcomeError
	}
	if !uses {
		return resp, outcomeSkipped
	}
	resp.Patch = schedulerNamePatch
	resp.PatchType = ptr.To(admissionv1.PatchTypeJSONPatch)
	logger.V(2).Info("Setting the scheduler of a pod with diskfit claims", "pod", podRef, "schedulerName", diskfit.SchedulerName)
	return resp, outcomeMutated
}

// usesDiskFit reports whether one of the pod's volumes is a claim, or a
// generic ephemeral volume, of a StorageClass whose provisioner is diskfit.
// A claim that does not exist (yet) counts as not diskfit: nothing tells
// its class.
func (m *mutator) usesDiskFit(ctx context.Context, namespace string, pod *v1.Pod) (bool, error) {
	for i := range pod.Spec.Volumes {
		vol := &pod.Spec.Volumes[i]
		var claim *v1.PersistentVolumeClaim
		switch {
		case vol.PersistentVolumeClaim != nil:
			var err error
			claim, err = m.claim(ctx, namespace, vol.PersistentVolumeClaim.ClaimName)
			if apierrors.IsNotFound(err) {
				klog.FromContext(ctx).V(4).Info("Claim of a new pod does not exist", "claim", klog.KRef(namespace, vol.PersistentVolumeClaim.ClaimName))
				continue
			}
			if err != nil {
				return false, err
			}
		case vol.Ephemeral != nil && vol.Ephemeral.VolumeClaimTemplate != nil:
			// The claim the ephemeral volume controller will create.
			tmpl := vol.Ephemeral.VolumeClaimTemplate
			claim = &v1.PersistentVolumeClaim{ObjectMeta: tmpl.ObjectMeta, Spec: tmpl.Spec}
		default:
			continue
		}
		class, err := m.claimClass(claim)
		if err != nil {
			return false, err
		}
		if class == "" {
			continue
		}
		ours, err := m.isDiskFitClass(ctx, class)
		if err != nil || ours {
			return ours, err
		}
	}
	return false, nil
}

func (m *mutator) claim(ctx context.Context, namespace, name string) (*v1.PersistentVolumeClaim, error) {
	claim, err := m.claims.PersistentVolumeClaims(namespace).Get(name)
	if apierrors.IsNotFound(err) {
		claim, err = m.client.CoreV1().PersistentVolumeClaims(namespace).Get(ctx, name, metav1.GetOptions{})
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("reading PVC %s/%s: %w", namespace, name, err)
	}
	return claim, err
}

// claimClass is the class of a claim (diskfit.ClaimClass), with the
// cluster's default class for a claim that names none and is not bound.
func (m *mutator) claimClass(claim *v1.PersistentVolumeClaim) (string, error) {
	classes, err := m.classes.List(labels.Everything())
	if err != nil {
		return "", fmt.Errorf("listing StorageClasses: %w", err)
	}
	return diskfit.ClaimClass(claim, diskfit.DefaultClass(classes)), nil
}

func (m *mutator) isDiskFitClass(ctx context.Context, name string) (bool, error) {
	class, err := m.classes.Get(name)
	if apierrors.IsNotFound(err) {
		class, err = m.client.StorageV1().StorageClasses().Get(ctx, name, metav1.GetOptions{})
	}
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading StorageClass %s: %w", name, err)
	}
	return diskfit.IsDiskFitClass(class), nil
}
