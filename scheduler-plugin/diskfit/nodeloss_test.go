package diskfit

import (
	"context"
	"testing"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clienttesting "k8s.io/client-go/testing"

	"github.com/diskfit/diskfit/csi-driver/apis/diskfit"
)

// TestReleaseVolumesOfDeletedNodes checks that deleting a Node releases
// exactly the claims on it that opted in: the PVC and its PV are deleted
// (the PV's provisioner finalizer removed first, its provisioner died with
// the node), while claims that did not opt in and claims on live nodes stay.
func TestReleaseVolumesOfDeletedNodes(t *testing.T) {
	optIn := func(b pvcBuilder) *v1.PersistentVolumeClaim {
		return b.annotate(diskfit.ReleaseOnNodeDeletionAnnotation, "true").PersistentVolumeClaim
	}
	bound := func(pvc *v1.PersistentVolumeClaim, pv string) *v1.PersistentVolumeClaim {
		pvc.Spec.VolumeName = pv
		return pvc
	}
	lostPV := boundPV("pv-lost", "lost", "gone", "d0", gi)
	lostPV.Finalizers = []string{provisionerFinalizer, "kubernetes.io/pv-protection"}
	objs := []runtime.Object{
		node("alive"),
		bound(optIn(makePVC("lost", diskfitClass, gi)), "pv-lost"), lostPV,
		bound(makePVC("kept", diskfitClass, gi).PersistentVolumeClaim, "pv-kept"), boundPV("pv-kept", "kept", "gone", "d1", gi),
		bound(optIn(makePVC("alive", diskfitClass, gi)), "pv-alive"), boundPV("pv-alive", "alive", "alive", "d0", gi),
	}
	// The plugin releases lost volumes as soon as its caches are filled.
	env := newTestEnv(t, nil, objs, diskNode("alive", freeDisk("d0", 10*gi)))
	ctx := context.Background()
	waitFor(t, "the released PV to leave the cache", func() bool {
		_, err := env.pl.pvLister.Get("pv-lost")
		return apierrors.IsNotFound(err)
	})
	if _, err := env.client.CoreV1().PersistentVolumeClaims("ns").Get(ctx, "lost", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("opted-in claim on the deleted node: %v, want it deleted", err)
	}
	if _, err := env.client.CoreV1().PersistentVolumes().Get(ctx, "pv-lost", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("its PV: %v, want it deleted", err)
	}
	for _, a := range env.client.Actions() {
		if p, ok := a.(clienttesting.PatchAction); ok && p.GetName() == "pv-lost" {
			if want := `{"metadata":{"finalizers":["kubernetes.io/pv-protection"],"resourceVersion":""}}`; string(p.GetPatch()) != want {
				t.Errorf("finalizer patch %s, want %s", p.GetPatch(), want)
			}
		}
	}
	for _, name := range []string{"kept", "alive"} {
		if _, err := env.client.CoreV1().PersistentVolumeClaims("ns").Get(ctx, name, metav1.GetOptions{}); err != nil {
			t.Errorf("claim %s: %v, want it kept", name, err)
		}
		if _, err := env.client.CoreV1().PersistentVolumes().Get(ctx, "pv-"+name, metav1.GetOptions{}); err != nil {
			t.Errorf("PV of %s: %v, want it kept", name, err)
		}
	}

	// A second pass (another replica, the next tick) finds nothing to do.
	env.client.ClearActions()
	env.pl.releaseLostVolumes(env.ctx, env.client)
	for _, a := range env.client.Actions() {
		if a.GetVerb() == "delete" || a.GetVerb() == "patch" {
			t.Errorf("second pass did %s %s", a.GetVerb(), a.GetResource().Resource)
		}
	}
}
