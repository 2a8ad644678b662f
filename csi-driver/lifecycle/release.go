package lifecycle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"

	"github.com/diskfit/diskfit/apis/diskfit"
)

// provisionerFinalizer is the finalizer external-provisioner puts on the
// PVs it provisioned, removed once it has deleted the volume.
const provisionerFinalizer = "external-provisioner.volume.kubernetes.io/finalizer"

// Claim is a bound claim, its diskfit volume and the StorageClass it was
// made with (nil when gone).
type Claim struct {
	PVC   *v1.PersistentVolumeClaim
	PV    *v1.PersistentVolume
	Class *storagev1.StorageClass
}

// StillReleasedOnDiskLoss reads c's claim from the API server: a release
// decided on a copy from a cache, or from a list made long before, goes
// on with the claim as it is now, and only if it still asks to be released
// from its disk (diskfit.ReleasedOnDiskLoss) under the same UID and bound
// to the same PV; otherwise ErrClaimChanged.
func StillReleasedOnDiskLoss(ctx context.Context, client kubernetes.Interface, c Claim) (Claim, error) {
	pvc, err := client.CoreV1().PersistentVolumeClaims(c.PVC.Namespace).Get(ctx, c.PVC.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return c, fmt.Errorf("PVC %s/%s is gone: %w", c.PVC.Namespace, c.PVC.Name, ErrClaimChanged)
	case err != nil:
		return c, fmt.Errorf("reading PVC %s/%s: %w", c.PVC.Namespace, c.PVC.Name, err)
	case pvc.UID != c.PVC.UID || pvc.Spec.VolumeName != c.PV.Name || !diskfit.ReleasedOnDiskLoss(pvc, c.Class):
		return c, fmt.Errorf("PVC %s/%s: %w, and no longer asks for it", c.PVC.Namespace, c.PVC.Name, ErrClaimChanged)
	}
	c.PVC = pvc
	return c, nil
}

// ReleaseKeepingData lets a claim go from a disk whose volume its
// workload no longer needs there (the disk failed, or an admin drains
// it): the PV's reclaim policy becomes Retain, so the volume and its data
// stay on the disk until an admin deletes the PV; then the claim and the
// pods on the volume's node that use it are deleted, so a StatefulSet
// recreates pod and claim and the new volume is placed on a working disk.
// Every write carries the UID it was decided for, so a claim re-created
// meanwhile under the same name is not touched. A claim changed since it
// was read stays (ErrClaimChanged), and its PV gets back the reclaim
// policy it had (DeleteClaimKeepingData).
//
// Its pods are deleted, not evicted: the disk failed, so the replica is
// down already, and a PodDisruptionBudget that counts it would refuse for
// ever. An admin's drain, of a disk that works, evicts them instead
// (EvictPod).
func ReleaseKeepingData(ctx context.Context, client kubernetes.Interface, c Claim, node string) error {
	if err := DeleteClaimKeepingData(ctx, client, c); err != nil {
		return err
	}
	return deletePodsUsing(ctx, client, c.PVC, node)
}

// DeleteClaimKeepingData makes c's PV Retain and then deletes c's claim.
// A claim whose delete the API server refused (changed since it was read,
// ErrClaimChanged, or otherwise turned down) and that stays gets its PV's
// reclaim policy back (retain): read again, it is still there under its
// UID and not being deleted, and no other release of it is on the PV's
// list (one may be deleting it now). Left Retain, such a claim, deleted
// later by its owner, would leave its volume and data for good. Every
// other claim keeps a Retain PV (with Delete, the volume would go with the claim):
// one gone, being deleted or not readable after a refusal, and one whose
// delete failed with no answer (a timeout, an etcd error, a lost
// connection or leadership), which may go through after any read that
// finds the claim still there.
func DeleteClaimKeepingData(ctx context.Context, client kubernetes.Interface, c Claim) error {
	restore, err := retain(ctx, client, c.PV)
	if err != nil {
		return err
	}
	err = deleteClaim(ctx, client, c.PVC)
	if err == nil {
		return nil
	}
	if !errors.Is(err, ErrClaimChanged) && !refused(err) {
		return fmt.Errorf("%w; PV %s stays Retain, as the delete may still go through: %s", err, c.PV.Name, byHand)
	}
	// The context may end meanwhile (leadership lost): the claim is read
	// and the policy put back all the same.
	after, cancel := context.WithTimeout(context.WithoutCancel(ctx), afterFailedDeleteTimeout)
	defer cancel()
	// Read again however the delete was refused: another release of the
	// claim, or its owner, may have deleted it since deleteClaim read it.
	if !claimStays(after, client, c.PVC) {
		// Gone or going (or not readable): its PV stays Retain.
		return fmt.Errorf("%w; PV %s stays Retain: %s", err, c.PV.Name, byHand)
	}
	if rerr := restore(after); rerr != nil {
		// The claim that stays keeps a Retain PV: deleted later,
		// its volume and data would stay for good.
		klog.FromContext(ctx).Error(rerr, "A claim that stays keeps reclaim policy Retain; "+byHand, "pvc", klog.KObj(c.PVC), "pv", c.PV.Name)
		return errors.Join(err, rerr)
	}
	return err
}

// byHand says how an admin gives a claim that stays, its release cut
// short, its PV's reclaim policy back.
const byHand = "if the claim stays and no release of it runs, set the PV's reclaim policy to the one its annotation " + diskfit.ReclaimPolicyBeforeReleaseAnnotation + " names"

// afterFailedDeleteTimeout bounds the reads and writes that put back a
// PV's reclaim policy after its claim's delete was refused.
const afterFailedDeleteTimeout = 10 * time.Second

// conflictBackoff paces the retries of a write refused for a conflict.
var conflictBackoff = retry.DefaultRetry

// refused says whether err is the API server's answer that it turned the
// request down (a 4xx status other than 408): the request was not carried
// out and never will be. A request that failed otherwise (timed out, an
// internal or etcd error, a lost connection, a cancelled context) may
// still be.
func refused(err error) bool {
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return false
	}
	code := status.Status().Code
	return code >= 400 && code < 500 && code != http.StatusRequestTimeout
}

// claimNow reads pvc's claim from the API server: nil when it is gone or
// was made anew under its name (another UID).
func claimNow(ctx context.Context, client kubernetes.Interface, pvc *v1.PersistentVolumeClaim) (*v1.PersistentVolumeClaim, error) {
	now, err := client.CoreV1().PersistentVolumeClaims(pvc.Namespace).Get(ctx, pvc.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err), err == nil && now.UID != pvc.UID:
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading PVC %s/%s: %w", pvc.Namespace, pvc.Name, err)
	}
	return now, nil
}

// claimStays says whether pvc's claim is still there under its UID and
// not being deleted; false when it cannot say.
func claimStays(ctx context.Context, client kubernetes.Interface, pvc *v1.PersistentVolumeClaim) bool {
	now, err := claimNow(ctx, client, pvc)
	return err == nil && now != nil && now.DeletionTimestamp == nil
}

// retain makes the reclaim policy of the PV as the API server has it now
// Retain (the copy the release was decided on, an informer's or a list
// made long before, may say Retain of a PV set back to Delete since, whose
// volume would be deleted with its claim), and adds this release to the
// PV's list of releases (diskfit.ReleasesAnnotation), the first with the
// policy the PV had before (diskfit.ReclaimPolicyBeforeReleaseAnnotation).
//
// restore takes this release off the list and, if it was the last, puts
// that policy back: another release of the claim on the list may be
// deleting it now (or did, or was cut short and may yet), and its claim
// must find the PV Retain. Every write is conditional on the PV's
// resourceVersion: a release is on the list before it deletes the claim,
// or finds the policy put back and makes the PV Retain again.
func retain(ctx context.Context, client kubernetes.Interface, decided *v1.PersistentVolume) (restore func(context.Context) error, err error) {
	id := string(uuid.NewUUID())
	err = retry.RetryOnConflict(conflictBackoff, func() error {
		pv, err := pvNow(ctx, client, decided)
		if err != nil {
			return err
		}
		releases := releasesOf(pv)
		before, ok := pv.Annotations[diskfit.ReclaimPolicyBeforeReleaseAnnotation]
		if len(releases) == 0 || !ok {
			before = string(pv.Spec.PersistentVolumeReclaimPolicy)
		}
		return patchPV(ctx, client, pv, v1.PersistentVolumeReclaimRetain, map[string]any{
			diskfit.ReleasesAnnotation:                   strings.Join(append(releases, id), ","),
			diskfit.ReclaimPolicyBeforeReleaseAnnotation: before,
		})
	})
	if err != nil {
		return nil, fmt.Errorf("keeping the data of PV %s (reclaim policy Retain): %w; a write that got no answer may have made it Retain: %s", decided.Name, err, byHand)
	}
	restore = func(ctx context.Context) error {
		return retry.RetryOnConflict(conflictBackoff, func() error {
			pv, err := pvNow(ctx, client, decided)
			if apierrors.IsNotFound(err) {
				return nil // gone with its claim: nothing to put back
			}
			if err != nil {
				return fmt.Errorf("putting back the reclaim policy of PV %s: %w", decided.Name, err)
			}
			others := slices.DeleteFunc(releasesOf(pv), func(r string) bool { return r == id })
			if len(others) > 0 {
				klog.FromContext(ctx).V(2).Info("Other releases of the claim made its PV Retain: it stays Retain", "pv", pv.Name, "releases", others)
				return patchPV(ctx, client, pv, v1.PersistentVolumeReclaimRetain, map[string]any{diskfit.ReleasesAnnotation: strings.Join(others, ",")})
			}
			before := v1.PersistentVolumeReclaimPolicy(pv.Annotations[diskfit.ReclaimPolicyBeforeReleaseAnnotation])
			if before == "" {
				before = v1.PersistentVolumeReclaimRetain
			}
			return patchPV(ctx, client, pv, before, map[string]any{
				diskfit.ReleasesAnnotation:                   nil,
				diskfit.ReclaimPolicyBeforeReleaseAnnotation: nil,
			})
		})
	}
	return restore, nil
}

// releasesOf returns the releases on pv's list (diskfit.ReleasesAnnotation)
// while pv is Retain, without empty entries and spaces (an admin may
// edit it). A list is void on a PV that is not Retain: every release on
// it made the PV Retain, so someone (an admin, as a release's error asks)
// set the policy since, and no release still deletes the claim on it.
func releasesOf(pv *v1.PersistentVolume) []string {
	if pv.Spec.PersistentVolumeReclaimPolicy != v1.PersistentVolumeReclaimRetain {
		return nil
	}
	var releases []string
	for r := range strings.SplitSeq(pv.Annotations[diskfit.ReleasesAnnotation], ",") {
		if r = strings.TrimSpace(r); r != "" {
			releases = append(releases, r)
		}
	}
	return releases
}

// pvNow reads the PV decided was made for from the API server.
func pvNow(ctx context.Context, client kubernetes.Interface, decided *v1.PersistentVolume) (*v1.PersistentVolume, error) {
	pv, err := client.CoreV1().PersistentVolumes().Get(ctx, decided.Name, metav1.GetOptions{})
	if err == nil && pv.UID != decided.UID {
		return nil, fmt.Errorf("PV %s was made anew", decided.Name)
	}
	return pv, err
}

// patchPV sets pv's reclaim policy and annotations (nil removes one), if
// pv is unchanged.
func patchPV(ctx context.Context, client kubernetes.Interface, pv *v1.PersistentVolume, policy v1.PersistentVolumeReclaimPolicy, annotations map[string]any) error {
	patch, _ := json.Marshal(map[string]any{
		"metadata": map[string]any{"uid": pv.UID, "resourceVersion": pv.ResourceVersion, "annotations": annotations},
		"spec":     map[string]any{"persistentVolumeReclaimPolicy": policy},
	})
	_, err := client.CoreV1().PersistentVolumes().Patch(ctx, pv.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

// released says whether the claim deleted for pvc is still there, being
// deleted, under its UID: a claim of that name with another UID was made
// anew (its StatefulSet was faster), and a claim not being deleted was
// changed before the delete reached it; neither's pods are ours to delete.
func released(ctx context.Context, client kubernetes.Interface, pvc *v1.PersistentVolumeClaim) (bool, error) {
	now, err := claimNow(ctx, client, pvc)
	return now != nil && now.DeletionTimestamp != nil, err
}

// ReleaseWithNode lets a claim go whose node was deleted: the claim and
// the PV are deleted. The PV's provisioner died with the node and can
// never remove its finalizer, so that finalizer is removed here. Whatever
// the machine held stays on it: the driver never removes a volume that
// had a PV (docs/reliability.md). The PV is made Retain before the claim
// goes, so that a release cut short after that (no later pass looks at a
// PV whose claim is gone) leaves a PV whose volume the provisioner of a
// node registered again under the name does not delete.
func ReleaseWithNode(ctx context.Context, client kubernetes.Interface, c Claim) error {
	if err := DeleteClaimKeepingData(ctx, client, c); err != nil {
		return err
	}
	// The PV changes under us (the PV controller marks it Released when
	// the claim goes), so the finalizer is removed from a fresh copy, with
	// its resourceVersion, again on a conflict.
	err := retry.RetryOnConflict(conflictBackoff, func() error {
		pv, err := client.CoreV1().PersistentVolumes().Get(ctx, c.PV.Name, metav1.GetOptions{})
		if err != nil || pv.UID != c.PV.UID || !slices.Contains(pv.Finalizers, provisionerFinalizer) {
			return err
		}
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{
			"finalizers":      slices.DeleteFunc(slices.Clone(pv.Finalizers), func(f string) bool { return f == provisionerFinalizer }),
			"resourceVersion": pv.ResourceVersion,
		}})
		_, err = client.CoreV1().PersistentVolumes().Patch(ctx, pv.Name, types.MergePatchType, patch, metav1.PatchOptions{})
		return err
	})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("removing the provisioner's finalizer from PV %s: %w", c.PV.Name, err)
	}
	err = client.CoreV1().PersistentVolumes().Delete(ctx, c.PV.Name, metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{UID: &c.PV.UID},
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("deleting PV %s: %w", c.PV.Name, err)
	}
	return nil
}

// deleteClaim deletes the claim as it was decided on: same UID, and, when
// pvc was read with one, same resourceVersion (an owner who changed the
// claim meanwhile, say to opt out, keeps it: ErrClaimChanged). A claim
// already gone, or made anew under its name, is no error.
func deleteClaim(ctx context.Context, client kubernetes.Interface, pvc *v1.PersistentVolumeClaim) error {
	pre := &metav1.Preconditions{UID: &pvc.UID}
	if pvc.ResourceVersion != "" {
		pre.ResourceVersion = &pvc.ResourceVersion
	}
	err := client.CoreV1().PersistentVolumeClaims(pvc.Namespace).Delete(ctx, pvc.Name, metav1.DeleteOptions{Preconditions: pre})
	switch {
	case err == nil || apierrors.IsNotFound(err):
		return nil
	case apierrors.IsConflict(err):
		// Refused for the UID (the claim is gone, one was made anew under
		// its name) or for the resourceVersion (it changed, and stays, or
		// it is being deleted already).
		// A claim being deleted under its UID is going all the same
		// (another release, or its owner, deleted it first).
		now, err := claimNow(ctx, client, pvc)
		switch {
		case err != nil:
			return fmt.Errorf("after its deletion was refused: %w", err)
		case now == nil || now.DeletionTimestamp != nil:
			return nil
		}
		return fmt.Errorf("PVC %s/%s: %w; it stays", pvc.Namespace, pvc.Name, ErrClaimChanged)
	}
	return fmt.Errorf("deleting PVC %s/%s: %w", pvc.Namespace, pvc.Name, err)
}

// PodsOfReleasedClaim returns the pods on node, and only those, that
// mount the claim deleted for pvc (PodsUsing): those a release removes. A
// claim in use by a scheduled pod is not removed (PVC protection) and the
// pod could never start again on its lost volume.
// The pods are listed first and returned only if the claim still has
// pvc's UID after that, being deleted: every pod listed was made while the
// name meant this claim. A claim made anew under the name keeps its pods.
func PodsOfReleasedClaim(ctx context.Context, client kubernetes.Interface, pvc *v1.PersistentVolumeClaim, node string) ([]v1.Pod, error) {
	pods, err := PodsUsing(ctx, client, pvc, node)
	if err != nil {
		return nil, err
	}
	if ours, err := released(ctx, client, pvc); err != nil || !ours {
		return nil, err
	}
	return pods, nil
}

// deletePodsUsing deletes the pods of the claim deleted for pvc
// (PodsOfReleasedClaim), each if it is still the pod of its UID.
func deletePodsUsing(ctx context.Context, client kubernetes.Interface, pvc *v1.PersistentVolumeClaim, node string) error {
	pods, err := PodsOfReleasedClaim(ctx, client, pvc, node)
	if err != nil {
		return err
	}
	for _, pod := range pods {
		err := client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
			Preconditions: &metav1.Preconditions{UID: &pod.UID},
		})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("deleting pod %s/%s, which uses PVC %s: %w", pod.Namespace, pod.Name, pvc.Name, err)
		}
	}
	return nil
}

// EvictPod evicts pod through the Eviction API, if it is still the pod of
// that UID (gone, or made anew, is no error). The API server evicts a pod
// only while its PodDisruptionBudget allows a disruption, and counts the
// eviction against the budget at once, so that two drains at once never
// take down two replicas that the budget allows one of. A refusal
// (apierrors.IsTooManyRequests: the budget allows none now) is returned
// with the budget's reason (EvictionRefusal): try again later.
func EvictPod(ctx context.Context, client kubernetes.Interface, pod *v1.Pod) error {
	return evict(ctx, client, pod, false)
}

// CheckEviction asks the API server whether pod may be evicted now (a
// dry-run eviction: nothing is changed, the budget is not counted): nil
// when it may, or is gone or made anew (another UID).
func CheckEviction(ctx context.Context, client kubernetes.Interface, pod *v1.Pod) error {
	return evict(ctx, client, pod, true)
}

// evict evicts pod, if it is still the pod of that UID.
func evict(ctx context.Context, client kubernetes.Interface, pod *v1.Pod, dryRun bool) error {
	opts := &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &pod.UID}}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	err := client.PolicyV1().Evictions(pod.Namespace).Evict(ctx, &policyv1.Eviction{
		ObjectMeta:    metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace},
		DeleteOptions: opts,
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("evicting pod %s: %w", pod.Name, EvictionRefusal(err))
	}
	return nil
}

// EvictionRefusal says why the API server refused an eviction: its
// message and the reasons it gives (the budget that refused, and how many
// healthy pods it needs and has). It wraps err, so that
// apierrors.IsTooManyRequests still tells a budget's refusal.
func EvictionRefusal(err error) error {
	var status apierrors.APIStatus
	if !errors.As(err, &status) || status.Status().Details == nil {
		return err
	}
	var causes []string
	for _, c := range status.Status().Details.Causes {
		if c.Message != "" {
			causes = append(causes, c.Message)
		}
	}
	if len(causes) == 0 {
		return err
	}
	return fmt.Errorf("%w (%s)", err, strings.Join(causes, "; "))
}

// PodsUsing lists, from the API server, the pods on the nodes given that
// mount pvc ("" for the pods on no node yet). A release deletes only the
// pods on the node of pvc's volume: one of those cannot start again on
// its lost volume, and keeps the claim from going (PVC protection). A pod
// on no node never ran on the volume, and nothing may make a bare one
// again: it stays, and drain lists it only to wait for its replica.
func PodsUsing(ctx context.Context, client kubernetes.Interface, pvc *v1.PersistentVolumeClaim, nodes ...string) ([]v1.Pod, error) {
	var pods []v1.Pod
	for _, on := range nodes {
		list, err := client.CoreV1().Pods(pvc.Namespace).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + on})
		if err != nil {
			return nil, fmt.Errorf("listing the pods in %s on node %q: %w", pvc.Namespace, on, err)
		}
		for _, pod := range list.Items {
			if pod.Spec.NodeName != on {
				continue
			}
			if slices.ContainsFunc(pod.Spec.Volumes, func(v v1.Volume) bool {
				return (v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == pvc.Name) ||
					(v.Ephemeral != nil && pod.Name+"-"+v.Name == pvc.Name)
			}) {
				pods = append(pods, pod)
			}
		}
	}
	return pods, nil
}

// ErrClaimChanged is returned by a release whose claim changed after the
// release was decided on, so that it stays.
var ErrClaimChanged = errors.New("the claim changed since it was chosen for release")
