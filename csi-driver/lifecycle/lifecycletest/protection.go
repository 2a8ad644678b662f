// Package lifecycletest makes a fake clientset delete claims, and evict
// pods, the way a real cluster does, for tests of code that releases
// claims.
package lifecycletest

import (
	"fmt"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clienttesting "k8s.io/client-go/testing"
)

var (
	pvcs = v1.SchemeGroupVersion.WithResource("persistentvolumeclaims")
	pods = v1.SchemeGroupVersion.WithResource("pods")
)

// ProtectClaims makes client delete claims as an API server with the
// pvc-protection controller does: a UID precondition that does not match
// is a Conflict; a claim that a scheduled pod uses only gets a deletion
// timestamp, and goes once the last such pod is deleted.
func ProtectClaims(client Client) { ProtectClaimsFor(client, 0) }

// ProtectClaimsFor is ProtectClaims with the time the pvc-protection
// controller takes to see a claim being deleted: every deleted claim
// stays, being deleted, for at least hold, even when no scheduled pod
// uses it, and goes with the first request after that once none does.
func ProtectClaimsFor(client Client, hold time.Duration) {
	tracker := client.Tracker()
	// letGo deletes the claims in namespace being deleted for hold that
	// no scheduled pod uses.
	letGo := func(namespace string) error {
		list, err := tracker.List(pvcs, v1.SchemeGroupVersion.WithKind("PersistentVolumeClaim"), namespace)
		if err != nil {
			return err
		}
		for _, c := range list.(*v1.PersistentVolumeClaimList).Items {
			if c.DeletionTimestamp != nil && time.Since(c.DeletionTimestamp.Time) >= hold && !usedByScheduledPod(tracker, &c) {
				_ = tracker.Delete(pvcs, c.Namespace, c.Name)
			}
		}
		return nil
	}
	if hold > 0 {
		client.PrependReactor("*", "*", func(a clienttesting.Action) (bool, runtime.Object, error) {
			_ = letGo(a.GetNamespace())
			return false, nil, nil
		})
	}
	client.PrependReactor("delete", "persistentvolumeclaims", func(a clienttesting.Action) (bool, runtime.Object, error) {
		del := a.(clienttesting.DeleteActionImpl)
		obj, err := tracker.Get(pvcs, a.GetNamespace(), del.Name)
		if err != nil {
			return true, nil, err
		}
		pvc := obj.(*v1.PersistentVolumeClaim).DeepCopy()
		if p := del.DeleteOptions.Preconditions; p != nil && p.UID != nil && *p.UID != pvc.UID {
			return true, nil, apierrors.NewConflict(pvcs.GroupResource(), del.Name,
				fmt.Errorf("precondition UID %s, object UID %s", *p.UID, pvc.UID))
		}
		if p := del.DeleteOptions.Preconditions; p != nil && p.ResourceVersion != nil && *p.ResourceVersion != pvc.ResourceVersion {
			return true, nil, apierrors.NewConflict(pvcs.GroupResource(), del.Name,
				fmt.Errorf("precondition resourceVersion %s, object resourceVersion %s", *p.ResourceVersion, pvc.ResourceVersion))
		}
		if hold == 0 && !usedByScheduledPod(tracker, pvc) {
			return true, nil, tracker.Delete(pvcs, pvc.Namespace, pvc.Name)
		}
		if pvc.DeletionTimestamp == nil {
			pvc.DeletionTimestamp = &metav1.Time{Time: time.Now()}
		}
		return true, nil, tracker.Update(pvcs, pvc, pvc.Namespace)
	})
	// deletePod deletes the pod of name, if it has the UID of the
	// preconditions, as the API server does.
	deletePod := func(namespace, name string, pre *metav1.Preconditions) error {
		obj, err := tracker.Get(pods, namespace, name)
		if err != nil {
			return err
		}
		pod := obj.(*v1.Pod)
		if pre != nil && pre.UID != nil && *pre.UID != pod.UID {
			return apierrors.NewConflict(pods.GroupResource(), name,
				fmt.Errorf("precondition UID %s, object UID %s", *pre.UID, pod.UID))
		}
		if err := tracker.Delete(pods, pod.Namespace, pod.Name); err != nil {
			return err
		}
		// The pvc-protection controller lets claims being deleted go once
		// no scheduled pod uses them.
		return letGo(pod.Namespace)
	}
	client.PrependReactor("delete", "pods", func(a clienttesting.Action) (bool, runtime.Object, error) {
		del := a.(clienttesting.DeleteActionImpl)
		return true, nil, deletePod(a.GetNamespace(), del.Name, del.DeleteOptions.Preconditions)
	})
	// An eviction that no budget refuses (RefuseEvictions) deletes the
	// pod; a dry-run one only checks that it is there with that UID.
	client.PrependReactor("create", "pods", func(a clienttesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "eviction" {
			return false, nil, nil
		}
		ev := a.(clienttesting.CreateAction).GetObject().(*policyv1.Eviction)
		var pre *metav1.Preconditions
		dryRun := false
		if o := ev.DeleteOptions; o != nil {
			pre, dryRun = o.Preconditions, len(o.DryRun) > 0
		}
		if dryRun {
			obj, err := tracker.Get(pods, a.GetNamespace(), ev.Name)
			if err == nil && pre != nil && pre.UID != nil && *pre.UID != obj.(*v1.Pod).UID {
				err = apierrors.NewConflict(pods.GroupResource(), ev.Name, fmt.Errorf("precondition UID %s", *pre.UID))
			}
			return true, nil, err
		}
		return true, nil, deletePod(a.GetNamespace(), ev.Name, pre)
	})
}

// RefuseEvictions makes client refuse to evict a pod while refuse
// returns a reason for it, as the API server does for a pod whose
// PodDisruptionBudget allows no disruption now: 429 TooManyRequests, the
// reason as a cause. dryRun says whether the eviction is a dry run (which
// the API server checks against the budget but does not count). Other
// evictions go on to the reactors before (ProtectClaims').
func RefuseEvictions(client Client, refuse func(pod *v1.Pod, dryRun bool) string) {
	tracker := client.Tracker()
	client.PrependReactor("create", "pods", func(a clienttesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "eviction" {
			return false, nil, nil
		}
		ev := a.(clienttesting.CreateAction).GetObject().(*policyv1.Eviction)
		obj, err := tracker.Get(pods, a.GetNamespace(), ev.Name)
		if err != nil {
			return false, nil, nil
		}
		why := refuse(obj.(*v1.Pod), ev.DeleteOptions != nil && len(ev.DeleteOptions.DryRun) > 0)
		if why == "" {
			return false, nil, nil
		}
		err = apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
		status := err.(*apierrors.StatusError)
		status.ErrStatus.Details.Causes = append(status.ErrStatus.Details.Causes,
			metav1.StatusCause{Type: policyv1.DisruptionBudgetCause, Message: why})
		return true, nil, err
	})
}

func usedByScheduledPod(tracker clienttesting.ObjectTracker, pvc *v1.PersistentVolumeClaim) bool {
	list, err := tracker.List(pods, v1.SchemeGroupVersion.WithKind("Pod"), pvc.Namespace)
	if err != nil {
		return false
	}
	return slices.ContainsFunc(list.(*v1.PodList).Items, func(p v1.Pod) bool {
		return p.Spec.NodeName != "" && slices.ContainsFunc(p.Spec.Volumes, func(v v1.Volume) bool {
			return v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == pvc.Name
		})
	})
}
