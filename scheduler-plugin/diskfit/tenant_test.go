package diskfit

import (
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/diskfit/diskfit/apis/diskfit"
)

// forgedClaims are PVCs a tenant can create in their own namespace, each
// annotated by hand with n1's d0 and asking for all of it (or far more):
// a class that does not exist, another provisioner's class, no class, and
// another provisioner's class named by the legacy annotation.
func forgedClaims() []runtime.Object {
	noClass := makePVC("forged-no-class", "", 0).placed("n1", "d0").PersistentVolumeClaim
	noClass.Spec.StorageClassName = nil
	noClass.Spec.Resources.Requests[v1.ResourceStorage] = resource.MustParse("8Ei")
	legacy := makePVC("forged-legacy", "", 4*gi).placed("n1", "d0").
		annotate(v1.BetaStorageClassAnnotation, otherClass).PersistentVolumeClaim
	legacy.Spec.StorageClassName = nil
	return []runtime.Object{
		makePVC("forged-missing", "no-such-class", 4*gi).placed("n1", "d0").PersistentVolumeClaim,
		makePVC("forged-other", otherClass, 4*gi).placed("n1", "d0").PersistentVolumeClaim,
		noClass,
		legacy,
	}
}

// TestForgedClaimsDoNotFillDisks: annotations alone book no space, so a
// diskfit pod still fits on a disk that forged claims "fill". A class
// created later with the diskfit provisioner makes its claims count, and
// deleting it releases them and retries the pods that waited for space.
func TestForgedClaimsDoNotFillDisks(t *testing.T) {
	objs := append(forgedClaims(), makePVC("a", diskfitClass, 3*gi).PersistentVolumeClaim, node("n1"))
	env := newTestEnv(t, nil, objs, diskNode("n1", freeDisk("d0", 4*gi)))
	loc := diskfit.Location{Node: "n1", Disk: "d0"}
	if used := env.pl.ledger.Used(loc); used != 0 {
		t.Errorf("forged claims book %d bytes on n1/d0, want 0", used)
	}
	pod := makePod("p", "a")
	state := framework.NewCycleState()
	mustPreFilter(t, env, state, pod, nil)
	checkStatus(t, "Filter", env.pl.Filter(env.ctx, state, pod, nodeInfos("n1")[0]), wantStatus{fwk.Success, ""})

	// The class the first forged claim names is created for diskfit: the
	// claim is now a real diskfit claim the provisioner will serve.
	wffc := storagev1.VolumeBindingWaitForFirstConsumer
	late := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "no-such-class"}, Provisioner: diskfit.DriverName, VolumeBindingMode: &wffc}
	if _, err := env.client.StorageV1().StorageClasses().Create(env.ctx, late, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the claim of the new diskfit class in the ledger", func() bool { return env.pl.ledger.Used(loc) == 4*gi })
	state = framework.NewCycleState()
	mustPreFilter(t, env, state, pod, nil)
	checkStatus(t, "Filter once the class exists", env.pl.Filter(env.ctx, state, pod, nodeInfos("n1")[0]),
		wantStatus{fwk.UnschedulableAndUnresolvable, "largest free disk d0 has 0, pod needs 3Gi"})

	if err := env.client.StorageV1().StorageClasses().Delete(env.ctx, late.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the claim out of the ledger once its class is gone", func() bool { return env.pl.ledger.Used(loc) == 0 })
	waitFor(t, "the waiting pod to be activated", func() bool {
		env.activator.mu.Lock()
		defer env.activator.mu.Unlock()
		return slices.Contains(env.activator.activated, "ns/p")
	})
}
