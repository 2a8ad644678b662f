// Package lifecycletest makes a fake clientset delete claims the way a
// real cluster does, for tests of code that releases claims.
package lifecycletest

import (
	"fmt"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8sfake "k8s.io/client-go/kubernetes/fake"
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
func ProtectClaims(client *k8sfake.Clientset) { ProtectClaimsFor(client, 0) }

// ProtectClaimsFor is ProtectClaims with the time the pvc-protection
// controller takes to see a claim being deleted: every deleted claim
// stays, being deleted, for at least hold, even when no scheduled pod
// uses it, and goes with the first request after that once none does.
func ProtectClaimsFor(client *k8sfake.Clientset, hold time.Duration) {
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
	client.PrependReactor("delete", "pods", func(a clienttesting.Action) (bool, runtime.Object, error) {
		del := a.(clienttesting.DeleteActionImpl)
		obj, err := tracker.Get(pods, a.GetNamespace(), del.Name)
		if err != nil {
			return true, nil, err
		}
		pod := obj.(*v1.Pod)
		if p := del.DeleteOptions.Preconditions; p != nil && p.UID != nil && *p.UID != pod.UID {
			return true, nil, apierrors.NewConflict(pods.GroupResource(), del.Name,
				fmt.Errorf("precondition UID %s, object UID %s", *p.UID, pod.UID))
		}
		if err := tracker.Delete(pods, pod.Namespace, pod.Name); err != nil {
			return true, nil, err
		}
		// The pvc-protection controller lets claims being deleted go once
		// no scheduled pod uses them.
		return true, nil, letGo(pod.Namespace)
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
