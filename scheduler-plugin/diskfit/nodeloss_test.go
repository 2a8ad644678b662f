package diskfit

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/diskfit/diskfit/apis/diskfit"
)

// TestReleaseVolumesOfDeletedNodes checks that a deleted Node, once it has
// stayed gone for the dwell time, has exactly the claims on it that opted
// in released: the PVC and its PV are deleted (the PV's provisioner
// finalizer removed first, its provisioner died with the node), while
// claims that did not opt in and claims on live nodes stay.
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
	env := newTestEnv(t, nil, objs, diskNode("alive", freeDisk("d0", 10*gi)))
	ctx := context.Background()
	lead(t, env)
	env.releasePass()
	env.clock.Step(nodeGoneDwell)
	env.releasePass()
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
	env.releasePass()
	for _, a := range env.client.Actions() {
		if a.GetVerb() == "delete" || a.GetVerb() == "patch" {
			t.Errorf("second pass did %s %s", a.GetVerb(), a.GetResource().Resource)
		}
	}
}

// lostClaim is an opted-in claim bound to a volume on node "gone", which
// neither the informers nor the API server have.
func lostClaim() []runtime.Object {
	pvc := makePVC("lost", diskfitClass, gi).annotate(diskfit.ReleaseOnNodeDeletionAnnotation, "true").PersistentVolumeClaim
	pvc.Spec.VolumeName = "pv-lost"
	return []runtime.Object{node("alive"), pvc, boundPV("pv-lost", "lost", "gone", "d0", gi)}
}

// lead runs a scheduling cycle through the plugin, which only the elected
// leader does.
func lead(t *testing.T, env *testEnv) {
	t.Helper()
	if _, status := env.pl.PreFilter(env.ctx, framework.NewCycleState(), makePod("first"), nil); !status.IsSuccess() && !status.IsSkip() {
		t.Fatalf("PreFilter: %v", status)
	}
}

// releasePass runs one pass of the release loop, as its ticker does.
func (env *testEnv) releasePass() { env.pl.releaseLostVolumes(env.ctx, env.client) }

// wantKept fails the test unless claim "lost" and its PV still exist.
func wantKept(t *testing.T, env *testEnv, when string) {
	t.Helper()
	if _, err := env.client.CoreV1().PersistentVolumeClaims("ns").Get(env.ctx, "lost", metav1.GetOptions{}); err != nil {
		t.Fatalf("%s: claim lost: %v, want it kept", when, err)
	}
	if _, err := env.client.CoreV1().PersistentVolumes().Get(env.ctx, "pv-lost", metav1.GetOptions{}); err != nil {
		t.Fatalf("%s: PV pv-lost: %v, want it kept", when, err)
	}
}

// wantReleased fails the test unless claim "lost" and its PV are deleted.
func wantReleased(t *testing.T, env *testEnv, when string) {
	t.Helper()
	if _, err := env.client.CoreV1().PersistentVolumeClaims("ns").Get(env.ctx, "lost", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("%s: claim lost: %v, want it deleted", when, err)
	}
	if _, err := env.client.CoreV1().PersistentVolumes().Get(env.ctx, "pv-lost", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("%s: PV pv-lost: %v, want it deleted", when, err)
	}
}

// TestNodeMissingOnlyFromTheCacheKeepsItsClaims: the scheduler's Node
// cache misses a Node the API server has (a relist in progress, a missed
// watch event). However long that lasts, nothing is released; the plugin
// asks the API server with quorum reads (no resourceVersion).
func TestNodeMissingOnlyFromTheCacheKeepsItsClaims(t *testing.T) {
	env := newTestEnv(t, nil, lostClaim())
	var mu sync.Mutex
	var gets []metav1.GetOptions
	env.client.PrependReactor("get", "nodes", func(a clienttesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		gets = append(gets, a.(clienttesting.GetActionImpl).GetOptions)
		return true, node("gone"), nil
	})
	lead(t, env)
	for range 3 {
		env.releasePass()
		env.clock.Step(nodeGoneDwell)
	}
	env.releasePass()
	wantKept(t, env, "node in the API server, not in the cache")
	mu.Lock()
	defer mu.Unlock()
	if len(gets) == 0 {
		t.Error("the plugin never read the Node from the API server")
	}
	for _, o := range gets {
		if o.ResourceVersion != "" {
			t.Errorf("Node read with resourceVersion %q, want a quorum read", o.ResourceVersion)
		}
	}
}

// TestClaimsReleasedOnceNodeStaysGone: a Node gone from the API server too
// has its claims released only once it has stayed gone for the dwell time,
// counted from the first pass that saw it gone, and after reading it from
// the API server once more.
func TestClaimsReleasedOnceNodeStaysGone(t *testing.T) {
	env := newTestEnv(t, nil, lostClaim())
	lead(t, env)
	env.releasePass()
	env.clock.Step(nodeGoneDwell - time.Second)
	env.releasePass()
	wantKept(t, env, "gone for less than the dwell time")

	env.client.ClearActions()
	env.clock.Step(time.Second)
	env.releasePass()
	wantReleased(t, env, "gone for the dwell time")
	read := false
	for _, a := range env.client.Actions() {
		switch {
		case a.GetVerb() == "get" && a.GetResource().Resource == "nodes":
			read = true
		case a.GetVerb() == "delete" && !read:
			t.Errorf("deleted %s before reading the Node again", a.GetResource().Resource)
		}
	}
}

// TestNodeBackDuringDwellResetsClock: a Node that comes back while its
// claims wait keeps them, and when it is gone again the dwell time counts
// from then.
func TestNodeBackDuringDwellResetsClock(t *testing.T) {
	for _, tc := range []struct {
		name string
		// cache says whether the informers see the Node come back too, or
		// only the API server has it (the cache lags).
		cache bool
	}{
		{name: "in the API server and the cache", cache: true},
		{name: "in the API server only"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := newTestEnv(t, nil, lostClaim())
			var inAPI atomic.Bool
			env.client.PrependReactor("get", "nodes", func(a clienttesting.Action) (bool, runtime.Object, error) {
				if !tc.cache && inAPI.Load() && a.(clienttesting.GetAction).GetName() == "gone" {
					return true, node("gone"), nil
				}
				return false, nil, nil
			})
			inCache := func(want bool) {
				waitFor(t, "the Node cache", func() bool {
					_, err := env.pl.nodeLister.Get("gone")
					return (err == nil) == want
				})
			}
			comeBack := func() {
				if !tc.cache {
					inAPI.Store(true)
					return
				}
				if _, err := env.client.CoreV1().Nodes().Create(env.ctx, node("gone"), metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
				inCache(true)
			}
			leave := func() {
				if !tc.cache {
					inAPI.Store(false)
					return
				}
				if err := env.client.CoreV1().Nodes().Delete(env.ctx, "gone", metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
				inCache(false)
			}

			lead(t, env)
			env.releasePass()
			env.clock.Step(nodeGoneDwell / 2)
			comeBack()
			env.releasePass()
			wantKept(t, env, "node back")
			leave()
			env.releasePass()
			env.clock.Step(nodeGoneDwell / 2)
			env.releasePass()
			wantKept(t, env, "a dwell time after the Node first went, half of one after it went again")
			env.clock.Step(nodeGoneDwell / 2)
			env.releasePass()
			wantReleased(t, env, "a dwell time after the Node went again")
		})
	}
}

// TestStandbyReplicaReleasesNothing: a scheduler replica that runs no
// scheduling cycles (a standby: only the elected leader runs them) neither
// reads the Node nor touches the claims, however long it is gone. Once it
// leads, its own dwell time starts.
func TestStandbyReplicaReleasesNothing(t *testing.T) {
	env := newTestEnv(t, nil, lostClaim())
	for range 3 {
		env.releasePass()
		env.clock.Step(nodeGoneDwell)
	}
	env.releasePass()
	wantKept(t, env, "on a standby")
	for _, a := range env.client.Actions() {
		if (a.GetVerb() == "get" && a.GetResource().Resource == "nodes") || a.GetVerb() == "delete" || a.GetVerb() == "patch" {
			t.Errorf("a standby did %s %s", a.GetVerb(), a.GetResource().Resource)
		}
	}

	lead(t, env)
	env.releasePass()
	wantKept(t, env, "on becoming the leader")
	env.clock.Step(nodeGoneDwell)
	env.releasePass()
	wantReleased(t, env, "a dwell time after becoming the leader")
}
