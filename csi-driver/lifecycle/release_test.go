package lifecycle

import (
	"errors"
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	clienttesting "k8s.io/client-go/testing"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/csi-driver/lifecycle/lifecycletest"
)

// refuseClaimDelete makes the API server refuse the deletion of claims
// with a conflict, as it does when the claim changed after it was read
// (its owner opted out, say).
func refuseClaimDelete(e *env) {
	e.client.PrependReactor("delete", "persistentvolumeclaims", func(a clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "persistentvolumeclaims"},
			a.(clienttesting.DeleteAction).GetName(), errors.New("the object has been modified"))
	})
}

// release releases the claim of objs (claim's PVC and PV) from node n1.
func release(e *env, objs []runtime.Object) error {
	return ReleaseKeepingData(e.ctx, e.client, Claim{PVC: objs[0].(*v1.PersistentVolumeClaim), PV: objs[1].(*v1.PersistentVolume)}, "n1")
}

// TestReleaseRetainsThePVAsItIsNow: the copy of the PV the release was
// decided on (an informer's, or a list drain made long before) says
// Retain, but the PV was set back to Delete since. Its reclaim policy
// must be Retain before the claim goes, or the volume and its data are
// deleted with the claim.
func TestReleaseRetainsThePVAsItIsNow(t *testing.T) {
	objs := claim("a", plainClass, "n1", "d0", releaseAnnotation)
	e := newEnv(t, append(objs, node("n1"), podUsing("web-0", "a", "n1")))
	stale := objs[1].(*v1.PersistentVolume).DeepCopy()
	stale.Spec.PersistentVolumeReclaimPolicy = v1.PersistentVolumeReclaimRetain
	if err := ReleaseKeepingData(e.ctx, e.client, Claim{PVC: objs[0].(*v1.PersistentVolumeClaim), PV: stale}, "n1"); err != nil {
		t.Fatal(err)
	}
	if e.pvcExists("a") {
		t.Fatal("claim kept, want it released")
	}
	if got := e.pv("pv-a").Spec.PersistentVolumeReclaimPolicy; got != v1.PersistentVolumeReclaimRetain {
		t.Errorf("released claim's PV has reclaim policy %s: its volume is deleted with the claim; want Retain", got)
	}
}

// TestReleaseStopsWhenTheClaimStays: the claim stays, not being deleted,
// so the release says so, deletes no pod, and puts back the PV's reclaim
// policy it had changed: nothing is left half-made. Left Retain, the
// claim deleted later by its owner would leave its volume and its space
// taken for good.
//   - changed: the claim changed after the release was decided (its
//     owner opted out), so the API server refuses its deletion
//     (ErrClaimChanged);
//   - delete refused: the API server turns the delete down (the
//     controller's role lost the right to delete claims), and before any
//     pass releases the claim again its disk recovers.
//
// A delete that fails without such an answer may still go through:
// TestReleaseWhoseClaimDeleteTimedOutKeepsRetain.
func TestReleaseStopsWhenTheClaimStays(t *testing.T) {
	for _, tc := range []struct {
		name    string
		failure error
	}{
		{"changed", apierrors.NewConflict(schema.GroupResource{Resource: "persistentvolumeclaims"}, "a", errors.New("the object has been modified"))},
		{"delete refused", apierrors.NewForbidden(schema.GroupResource{Resource: "persistentvolumeclaims"}, "a", errors.New("no delete for diskfit-controller"))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := claim("a", plainClass, "n1", "d0", releaseAnnotation)
			e := newEnv(t, append(objs, node("n1"), podUsing("web-0", "a", "n1")))
			e.client.PrependReactor("delete", "persistentvolumeclaims", func(clienttesting.Action) (bool, runtime.Object, error) {
				return true, nil, tc.failure
			})
			err := release(e, objs)
			if err == nil || apierrors.IsConflict(tc.failure) && !errors.Is(err, ErrClaimChanged) {
				t.Errorf("release of a claim whose deletion failed with %v returned %v, want an error (ErrClaimChanged for a conflict)", tc.failure, err)
			}
			if !e.pvcExists("a") || !e.podExists("web-0") {
				t.Error("the claim that stays, or its pod, was deleted")
			}
			if got := e.pv("pv-a").Spec.PersistentVolumeReclaimPolicy; got != v1.PersistentVolumeReclaimDelete {
				t.Errorf("PV of a claim that stays has reclaim policy %s, want its own (Delete) back", got)
			}
		})
	}
}

// TestNodeReleaseStopsWhenTheClaimChanged: the same for a claim of a
// deleted Node: when the claim's deletion is refused, its PV keeps its
// provisioner's finalizer and is not deleted (a claim left bound to a PV
// being deleted loses its volume's DeleteVolume for good).
func TestNodeReleaseStopsWhenTheClaimChanged(t *testing.T) {
	objs := claim("a", plainClass, "gone", "d0", nodeDeletionAnnotation)
	objs[1].(*v1.PersistentVolume).Finalizers = []string{provisionerFinalizer}
	e := newEnv(t, objs)
	refuseClaimDelete(e)
	err := ReleaseWithNode(e.ctx, e.client, Claim{PVC: objs[0].(*v1.PersistentVolumeClaim), PV: objs[1].(*v1.PersistentVolume)})
	if !errors.Is(err, ErrClaimChanged) {
		t.Errorf("release of a claim whose deletion was refused returned %v, want ErrClaimChanged", err)
	}
	pv := e.pv("pv-a")
	if pv == nil || pv.DeletionTimestamp != nil || len(pv.Finalizers) != 1 {
		t.Errorf("PV of a claim that stays was deleted or lost its provisioner's finalizer: %+v", pv)
	}
}

// TestReleaseStopsWhenTheClaimChangedPutsBackThePolicyAfterAnotherWrite:
// as above, but the PV changed after the release set it to Retain (its
// node's external-provisioner removes its finalizer from every Retain PV
// at once). Its own reclaim policy still comes back: a claim that stays,
// left with a Retain PV, would keep its volume and data for good once
// deleted.
func TestReleaseStopsWhenTheClaimChangedPutsBackThePolicyAfterAnotherWrite(t *testing.T) {
	objs := claim("a", plainClass, "n1", "d0", releaseAnnotation)
	objs[1].(*v1.PersistentVolume).Finalizers = []string{provisionerFinalizer}
	objs[1].(*v1.PersistentVolume).ResourceVersion = "1"
	e := newEnv(t, append(objs, node("n1")))
	gvr := v1.SchemeGroupVersion.WithResource("persistentvolumes")
	lifecycletest.VersionPatches(e.client, "persistentvolumes")
	e.client.PrependReactor("delete", "persistentvolumeclaims", func(a clienttesting.Action) (bool, runtime.Object, error) {
		// The provisioner removes its finalizer from the PV, now Retain.
		obj, err := e.client.Tracker().Get(gvr, "", "pv-a")
		if err != nil {
			return true, nil, err
		}
		pv := obj.(*v1.PersistentVolume).DeepCopy()
		pv.Finalizers = nil
		pv.ResourceVersion = "after-provisioner"
		if err := e.client.Tracker().Update(gvr, pv, ""); err != nil {
			return true, nil, err
		}
		return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "persistentvolumeclaims"}, "a", errors.New("the object has been modified"))
	})
	err := release(e, objs)
	if !errors.Is(err, ErrClaimChanged) {
		t.Errorf("release returned %v, want ErrClaimChanged", err)
	}
	if got := e.pv("pv-a").Spec.PersistentVolumeReclaimPolicy; got != v1.PersistentVolumeReclaimDelete {
		t.Errorf("PV of a claim that stays has reclaim policy %s, want its own (Delete) back", got)
	}
}

// TestReleaseOfAClaimAnotherReleaseDeletedKeepsRetain: two releases of one
// claim at once (diskfit-controller, and `diskfit drain --release` that
// its ReleaseHeld event suggested). This one read the claim and set the
// PV to Retain; the other, finding the PV Retain already, deleted the
// claim first, which its pod's protection keeps, terminating and with a
// new resourceVersion, so this one's delete is refused. The claim is
// going all the same: its PV must stay Retain, or the volume and its data
// are deleted with it.
func TestReleaseOfAClaimAnotherReleaseDeletedKeepsRetain(t *testing.T) {
	objs := claim("a", plainClass, "n1", "d0", releaseAnnotation)
	objs[0].(*v1.PersistentVolumeClaim).ResourceVersion = "100"
	e := newEnv(t, append(objs, node("n1"), podUsing("web-0", "a", "n1")))
	gvr := v1.SchemeGroupVersion.WithResource("persistentvolumeclaims")
	first := true
	e.client.PrependReactor("delete", "persistentvolumeclaims", func(a clienttesting.Action) (bool, runtime.Object, error) {
		if first {
			// The other release's delete lands first.
			first = false
			obj, err := e.client.Tracker().Get(gvr, "ns", "a")
			if err != nil {
				return true, nil, err
			}
			pvc := obj.(*v1.PersistentVolumeClaim).DeepCopy()
			pvc.DeletionTimestamp = &metav1.Time{Time: time.Now()}
			pvc.ResourceVersion = "101"
			if err := e.client.Tracker().Update(gvr, pvc, "ns"); err != nil {
				return true, nil, err
			}
		}
		return false, nil, nil // the env checks the preconditions
	})
	err := release(e, objs)
	if err != nil {
		t.Errorf("release of a claim being deleted by another release: %v, want it released", err)
	}
	if got := e.pv("pv-a").Spec.PersistentVolumeReclaimPolicy; got != v1.PersistentVolumeReclaimRetain {
		t.Errorf("the claim is being deleted, and its PV has reclaim policy %s: the volume is deleted with it; want Retain", got)
	}
}

// TestNodeReleaseInterruptedAfterTheClaimKeepsTheVolume: the release of a
// deleted Node's claim deletes the claim and then the PV; the API server
// fails every write after the claim's delete (a timeout, a restart). No
// later pass looks at a PV whose claim is gone, and the Node may register
// again under its name (a machine back from maintenance): its
// provisioner must then find nothing to delete, so the PV is Retain
// before the claim goes.
func TestNodeReleaseInterruptedAfterTheClaimKeepsTheVolume(t *testing.T) {
	objs := claim("lost", plainClass, "gone", "d0", nodeDeletionAnnotation)
	objs[1].(*v1.PersistentVolume).Finalizers = []string{provisionerFinalizer}
	e := newEnv(t, objs)
	claimDeleted := false
	e.client.PrependReactor("delete", "persistentvolumeclaims", func(clienttesting.Action) (bool, runtime.Object, error) {
		claimDeleted = true
		return false, nil, nil
	})
	e.client.PrependReactor("*", "persistentvolumes", func(a clienttesting.Action) (bool, runtime.Object, error) {
		if claimDeleted && a.GetVerb() != "get" {
			return true, nil, apierrors.NewInternalError(errors.New("etcdserver: request timed out"))
		}
		return false, nil, nil
	})
	err := ReleaseWithNode(e.ctx, e.client, Claim{PVC: objs[0].(*v1.PersistentVolumeClaim), PV: objs[1].(*v1.PersistentVolume)})
	if err == nil {
		t.Error("the release whose PV writes failed reported no error")
	}
	if e.pvcExists("lost") {
		t.Fatal("the claim was not deleted")
	}
	if pv := e.pv("pv-lost"); pv != nil && pv.Spec.PersistentVolumeReclaimPolicy != v1.PersistentVolumeReclaimRetain {
		t.Errorf("the claim is gone and its PV stays with reclaim policy %s: the volume is deleted if the node comes back; want Retain", pv.Spec.PersistentVolumeReclaimPolicy)
	}
}

// TestReleaseKeepsAPodOnNoNode: the released claim is used by the pod on
// its volume's node and by a pod Pending on no node (a bare pod, say,
// that nothing would make again), and it stays a moment, being deleted.
// The pod on the node is deleted, so that its workload makes it anew
// with a new claim; the pod on no node never ran on the volume and stays.
func TestReleaseKeepsAPodOnNoNode(t *testing.T) {
	objs := claim("a", plainClass, "n1", "d0", releaseAnnotation)
	e := newEnv(t, append(objs, node("n1"), podUsing("web-0", "a", "n1"), podUsing("pending", "a", "")))
	// The claim stays a moment, being deleted: the pvc-protection
	// controller has yet to see it.
	lifecycletest.ProtectClaimsFor(e.client, time.Hour)
	if err := release(e, objs); err != nil {
		t.Fatal(err)
	}
	if e.pvcExists("a") {
		t.Error("claim kept, want it released")
	}
	if e.podExists("web-0") {
		t.Error("the pod on the volume's node was kept: it can never start again on its lost volume")
	}
	if !e.podExists("pending") {
		t.Error("the pod on no node was deleted: nothing makes it again")
	}
}

// TestReleaseWhoseClaimDeleteFailedButWentThroughKeepsRetain: the claim's
// delete reports an error, but it went through (the answer was lost): the
// claim is being deleted. Its PV stays Retain, or the volume and its data
// are deleted with the claim.
func TestReleaseWhoseClaimDeleteFailedButWentThroughKeepsRetain(t *testing.T) {
	objs := claim("a", plainClass, "n1", "d0", releaseAnnotation)
	e := newEnv(t, append(objs, node("n1"), podUsing("web-0", "a", "n1")))
	gvr := v1.SchemeGroupVersion.WithResource("persistentvolumeclaims")
	e.client.PrependReactor("delete", "persistentvolumeclaims", func(a clienttesting.Action) (bool, runtime.Object, error) {
		obj, err := e.client.Tracker().Get(gvr, "ns", "a")
		if err != nil {
			return true, nil, err
		}
		pvc := obj.(*v1.PersistentVolumeClaim).DeepCopy()
		pvc.DeletionTimestamp = &metav1.Time{Time: time.Now()}
		if err := e.client.Tracker().Update(gvr, pvc, "ns"); err != nil {
			return true, nil, err
		}
		return true, nil, apierrors.NewTimeoutError("request did not complete within the allowed duration", 0)
	})
	if err := release(e, objs); err == nil {
		t.Error("the release whose claim delete failed reported no error")
	}
	if got := e.pv("pv-a").Spec.PersistentVolumeReclaimPolicy; got != v1.PersistentVolumeReclaimRetain {
		t.Errorf("the claim is being deleted, and its PV has reclaim policy %s: the volume is deleted with it; want Retain", got)
	}
}

// TestReleaseWhoseClaimDeleteTimedOutKeepsRetain: the claim's delete
// fails with no answer on whether it happened (the API server timed out,
// etcd timed out), and goes through only after the release gave up. The
// claim is going: its PV must stay Retain, or the volume and its data are
// deleted with it. Before, a read right after the failure found the claim
// still there and put Delete back.
func TestReleaseWhoseClaimDeleteTimedOutKeepsRetain(t *testing.T) {
	for _, failure := range []error{
		apierrors.NewTimeoutError("request did not complete within the allowed duration", 0),
		apierrors.NewInternalError(errors.New("etcdserver: request timed out")),
	} {
		t.Run(failure.Error(), func(t *testing.T) {
			objs := claim("a", plainClass, "n1", "d0", releaseAnnotation)
			e := newEnv(t, append(objs, node("n1"), podUsing("web-0", "a", "n1")))
			e.client.PrependReactor("delete", "persistentvolumeclaims", func(clienttesting.Action) (bool, runtime.Object, error) {
				return true, nil, failure
			})
			if err := release(e, objs); err == nil {
				t.Error("the release whose claim delete failed reported no error")
			}
			// The delete goes through now.
			gvr := v1.SchemeGroupVersion.WithResource("persistentvolumeclaims")
			obj, err := e.client.Tracker().Get(gvr, "ns", "a")
			if err != nil {
				t.Fatal(err)
			}
			pvc := obj.(*v1.PersistentVolumeClaim).DeepCopy()
			pvc.DeletionTimestamp = &metav1.Time{Time: time.Now()}
			if err := e.client.Tracker().Update(gvr, pvc, "ns"); err != nil {
				t.Fatal(err)
			}
			if got := e.pv("pv-a").Spec.PersistentVolumeReclaimPolicy; got != v1.PersistentVolumeReclaimRetain {
				t.Errorf("the claim is being deleted, and its PV has reclaim policy %s: the volume is deleted with it; want Retain", got)
			}
		})
	}
}

// TestTwoReleasesOfOneClaimKeepItsDataInEveryOrder: the controller and
// `diskfit drain --release` (which the controller's ReleaseHeld event
// suggests) release one claim at once, their requests reaching the API
// server in every order they can. Whenever the claim is being deleted or
// gone, its PV must be Retain: the PV controller deletes a Delete PV's
// volume, and its data, the moment the claim goes. A release that backs
// out (the claim changed since it read it) must leave the claim, if it
// stays, its own reclaim policy.
func TestTwoReleasesOfOneClaimKeepItsDataInEveryOrder(t *testing.T) {
	// Conflicts are retried at once: thousands of orders are run.
	defer func(b wait.Backoff) { conflictBackoff = b }(conflictBackoff)
	conflictBackoff = wait.Backoff{Steps: conflictBackoff.Steps}
	for _, tc := range []struct {
		name string
		// fresh says which release reads the claim as it is now; the
		// other read it before its owner changed it, so its delete is
		// refused.
		fresh [2]bool
		pod   bool
		stays bool
	}{
		{name: "one backs out", fresh: [2]bool{false, true}},
		{name: "one backs out, pod holds the claim", fresh: [2]bool{false, true}, pod: true},
		{name: "both back out", fresh: [2]bool{false, false}, stays: true},
		{name: "both go through", fresh: [2]bool{true, true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := claim("a", plainClass, "n1", "d0", releaseAnnotation)
			pvc, pv := objs[0].(*v1.PersistentVolumeClaim), objs[1].(*v1.PersistentVolume)
			before := pvc.DeepCopy()
			before.ResourceVersion = "100"
			pvc.ResourceVersion = "101" // its owner changed it since
			pv.ResourceVersion = "1"
			server := func() *lifecycletest.Server {
				all := []runtime.Object{pvc.DeepCopy(), pv.DeepCopy(), node("n1")}
				if tc.pod {
					all = append(all, podUsing("web-0", "a", "n1"))
				}
				s := lifecycletest.NewServer(all...)
				lifecycletest.ProtectClaims(s)
				lifecycletest.VersionPatches(s, "persistentvolumes")
				return s
			}
			check := func(s *lifecycletest.Server, done bool) error {
				pvNow, err := s.Tracker().Get(v1.SchemeGroupVersion.WithResource("persistentvolumes"), "", "pv-a")
				if err != nil {
					return err
				}
				policy := pvNow.(*v1.PersistentVolume).Spec.PersistentVolumeReclaimPolicy
				obj, err := s.Tracker().Get(v1.SchemeGroupVersion.WithResource("persistentvolumeclaims"), "ns", "a")
				going := apierrors.IsNotFound(err) || (err == nil && obj.(*v1.PersistentVolumeClaim).DeletionTimestamp != nil)
				switch {
				case err != nil && !going:
					return err
				case going && policy != v1.PersistentVolumeReclaimRetain:
					return fmt.Errorf("the claim is being deleted or gone, and its PV has reclaim policy %s: the volume and its data are deleted with it", policy)
				case done && going == tc.stays:
					return fmt.Errorf("claim going: %t, want %t", going, !tc.stays)
				case done && tc.stays && policy != v1.PersistentVolumeReclaimDelete:
					return fmt.Errorf("the claim stays with reclaim policy %s, want its own (Delete) back (%v)", policy, pvNow.(*v1.PersistentVolume).Annotations)
				}
				return nil
			}
			release := func(fresh bool) func(kubernetes.Interface) error {
				return func(client kubernetes.Interface) error {
					c := Claim{PVC: before, PV: pv}
					if fresh {
						var err error
						if c, err = StillReleasedOnDiskLoss(t.Context(), client, c); err != nil {
							return err
						}
					}
					return ReleaseKeepingData(t.Context(), client, c, "n1")
				}
			}
			runs := interleavings(t, server, check, release(tc.fresh[0]), release(tc.fresh[1]))
			t.Logf("%d orders", runs)
		})
	}
}

// TestReleaseBackingOutAfterAnAdminPutThePolicyBack: a release cut short
// left its PV Retain, on the list of releases; the claim stays, and an
// admin put its reclaim policy back to Delete, as the release's error
// said. A list is void once the PV is not Retain: a later release that
// backs out must leave the claim its own policy (Delete), not Retain for
// the release long gone (its volume would outlive the claim). While the
// PV is Retain, a release on the list may still be deleting the claim: it
// stays Retain.
func TestReleaseBackingOutAfterAnAdminPutThePolicyBack(t *testing.T) {
	for _, tc := range []struct {
		name   string
		policy v1.PersistentVolumeReclaimPolicy
		list   string
		want   v1.PersistentVolumeReclaimPolicy
	}{
		{"policy put back", v1.PersistentVolumeReclaimDelete, "cut-short", v1.PersistentVolumeReclaimDelete},
		{"release still listed", v1.PersistentVolumeReclaimRetain, "cut-short", v1.PersistentVolumeReclaimRetain},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := claim("a", plainClass, "n1", "d0", releaseAnnotation)
			pv := objs[1].(*v1.PersistentVolume)
			pv.Spec.PersistentVolumeReclaimPolicy = tc.policy
			pv.Annotations = map[string]string{
				diskfit.ReleasesAnnotation:                   tc.list,
				diskfit.ReclaimPolicyBeforeReleaseAnnotation: string(v1.PersistentVolumeReclaimDelete),
			}
			e := newEnv(t, append(objs, node("n1")))
			refuseClaimDelete(e)
			if err := release(e, objs); !errors.Is(err, ErrClaimChanged) {
				t.Errorf("release returned %v, want ErrClaimChanged", err)
			}
			if got := e.pv("pv-a"); got.Spec.PersistentVolumeReclaimPolicy != tc.want {
				t.Errorf("the claim stays with reclaim policy %s (annotations %v), want %s", got.Spec.PersistentVolumeReclaimPolicy, got.Annotations, tc.want)
			}
		})
	}
}

// TestReleaseBackingOutOfAClaimWhosePVWentSaysNothingToFix: a release
// backing out finds the claim staying; before it puts the policy back,
// the claim and its PV go (the release of a deleted Node's claim). The
// release must not ask an admin to fix a PV that is gone.
func TestReleaseBackingOutOfAClaimWhosePVWentSaysNothingToFix(t *testing.T) {
	objs := claim("a", plainClass, "n1", "d0", releaseAnnotation)
	e := newEnv(t, append(objs, node("n1")))
	refuseClaimDelete(e)
	claimReads := 0
	e.client.PrependReactor("get", "persistentvolumeclaims", func(clienttesting.Action) (bool, runtime.Object, error) {
		if claimReads++; claimReads == 2 {
			// After this read (the claim stays), the PV goes.
			if err := e.client.Tracker().Delete(v1.SchemeGroupVersion.WithResource("persistentvolumes"), "", "pv-a"); err != nil {
				t.Fatal(err)
			}
		}
		return false, nil, nil
	})
	err := release(e, objs)
	if claimReads < 2 {
		t.Fatalf("release read the claim %d times: this test shows nothing", claimReads)
	}
	if !errors.Is(err, ErrClaimChanged) || apierrors.IsNotFound(err) {
		t.Errorf("release returned %v, want ErrClaimChanged alone", err)
	}
}
