package cli

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	kubefake "k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	dffake "github.com/diskfit/diskfit/apis/client/clientset/versioned/fake"
	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/csi-driver/lifecycle/lifecycletest"
)

// drainPVC is a claim in shop bound to pv, with the UID diskfitPV's claim
// reference expects.
func drainPVC(name, class, pv, onDiskLoss string) *corev1.PersistentVolumeClaim {
	var ann map[string]string
	if onDiskLoss != "" {
		ann = map[string]string{diskfit.OnDiskLossAnnotation: onDiskLoss}
	}
	pvc := bound(makePVC(name, class, "1Gi", ann), pv)
	pvc.UID = types.UID(name + "-uid")
	return pvc
}

// legacyClass moves pvc's class to the legacy annotation, which the
// provisioner reads first.
func legacyClass(pvc *corev1.PersistentVolumeClaim) *corev1.PersistentVolumeClaim {
	pvc.Annotations = map[string]string{diskfit.BetaStorageClassAnnotation: *pvc.Spec.StorageClassName}
	pvc.Spec.StorageClassName = nil
	return pvc
}

// replicaPod is a running pod of StatefulSet web on node-a using claim.
func replicaPod(name, claim string) *corev1.Pod {
	p := makePod(name).withClaim("data", claim).onNode("node-a").Pod
	yes := true
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "StatefulSet", Name: "web", UID: "web-uid", Controller: &yes}}
	return p
}

// drainCluster is node-a with, on nvme0, two replicas of StatefulSet web
// whose class asks for release (the second's named in the legacy
// annotation), a claim of that class that says keep, and
// a claim of a plain class that asks for release, used by a pod no
// controller owns; on nvme1 one more claim that asks for release.
func drainCluster() *Clients { return drainClusterHolding(0) }

// drainClusterHolding is drainCluster where a deleted claim stays, being
// deleted, for hold (lifecycletest.ProtectClaimsFor).
func drainClusterHolding(hold time.Duration) *Clients {
	releaseClass := diskfitClass("diskfit-release", "")
	releaseClass.Parameters = map[string]string{diskfit.OnDiskLossAnnotation: diskfit.OnDiskLossRelease}
	kube := []runtime.Object{
		diskfitClass("diskfit", ""), releaseClass,
		diskfitPV("pv-w0", "node-a", "nvme0", gi, "data-web-0"), drainPVC("data-web-0", "diskfit-release", "pv-w0", ""),
		diskfitPV("pv-w1", "node-a", "nvme0", gi, "data-web-1"), legacyClass(drainPVC("data-web-1", "diskfit-release", "pv-w1", "")),
		diskfitPV("pv-s", "node-a", "nvme0", gi, "scratch"), drainPVC("scratch", "diskfit-release", "pv-s", diskfit.OnDiskLossKeep),
		diskfitPV("pv-t", "node-a", "nvme0", gi, "tool-data"), drainPVC("tool-data", "diskfit", "pv-t", diskfit.OnDiskLossRelease),
		diskfitPV("pv-o", "node-a", "nvme1", gi, "other"), drainPVC("other", "diskfit-release", "pv-o", ""),
		// A PV kept from an earlier release: its claim is gone.
		diskfitPV("pv-old", "node-a", "nvme0", gi, "gone"),
		replicaPod("web-0", "data-web-0"), replicaPod("web-1", "data-web-1"),
		makePod("tool").withClaim("data", "tool-data").onNode("node-a").Pod,
	}
	dn := diskNode("node-a", time.Second, disk("nvme0", "nvme", 8*gi, 4*gi, 5), disk("nvme1", "nvme", 4*gi, 3*gi, 1))
	client := kubefake.NewClientset(kube...)
	lifecycletest.ProtectClaimsFor(client, hold)
	return &Clients{Kube: client, DiskFit: dffake.NewSimpleClientset(dn)}
}

const drainClaimsTable = `CLAIM            DISK   PV     PODS   OWNER            ON DISK LOSS
shop/data-web-0  nvme0  pv-w0  web-0  StatefulSet web  release
shop/data-web-1  nvme0  pv-w1  web-1  StatefulSet web  release
shop/scratch     nvme0  pv-s   -      -                keep
shop/tool-data   nvme0  pv-t   tool   -                release
`

// TestDrainLists drains without --release: the disk is cordoned (with
// --dry-run not even that) and its claims listed, nothing else is written.
func TestDrainLists(t *testing.T) {
	advice := `
4 claim(s) stay on disk node-a/nvme0; no new volume is placed there.
To move them off:
  - diskfit drain node-a/nvme0 --release releases those marked release: each claim is deleted and its pod evicted, one replica
    at a time, so that its StatefulSet recreates them on another disk; the old PV is kept (reclaim policy Retain).
  - mark a claim first (kubectl annotate pvc -n NAMESPACE NAME diskfit.io/on-disk-loss=release, or the parameter on its StorageClass)
    and run diskfit drain node-a/nvme0 --release;
  - or move the data yourself: copy it to a new claim, then delete the old claim and its pod.
`
	tests := []struct {
		name       string
		args       []string
		wantOut    string
		wantWrites []string
	}{
		{
			name: "cordons and lists",
			args: []string{"drain", "node-a/nvme0", "--reason", "SMART errors"},
			wantOut: "disk node-a/nvme0 cordoned: no new volume is placed on it; the volumes on it stay (reason: SMART errors)\n\n" +
				"Claims on disk node-a/nvme0:\n" + drainClaimsTable + advice,
			wantWrites: []string{"update disknodes node-a"},
		},
		{
			name:    "dry run",
			args:    []string{"drain", "node-a/nvme0", "--dry-run"},
			wantOut: "Would cordon disk node-a/nvme0 (dry run: nothing is changed).\n\nClaims on disk node-a/nvme0:\n" + drainClaimsTable + advice,
		},
		{
			name: "whole node, dry run",
			args: []string{"drain", "node-a", "--dry-run"},
			wantOut: "Would cordon node node-a (dry run: nothing is changed).\n\nClaims on node node-a:\n" + drainClaimsTable +
				"shop/other       nvme1  pv-o   -      -                release\n" +
				strings.NewReplacer("4 claim(s)", "5 claim(s)", "disk node-a/nvme0", "node node-a", "node-a/nvme0", "node-a").Replace(advice),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := drainCluster()
			out, _, err := runWith(c, "", tc.args...)
			checkResult(t, out, err, tc.wantOut, "")
			if diff := cmp.Diff(tc.wantWrites, writes(c)); diff != "" {
				t.Errorf("writes (-want +got):\n%s", diff)
			}
		})
	}
}

// TestDrainReleaseDryRun says what --release would do and changes nothing.
func TestDrainReleaseDryRun(t *testing.T) {
	c := drainCluster()
	out, _, err := runWith(c, "", "drain", "node-a/nvme0", "--release", "--dry-run", "--timeout", "5m")
	want := "Would cordon disk node-a/nvme0 (dry run: nothing is changed).\n\nClaims on disk node-a/nvme0:\n" + drainClaimsTable + `
Would release claim shop/data-web-0: set PV pv-w0 to reclaim policy Retain, delete the claim and evict pod web-0.
  Then wait up to 5m0s for StatefulSet web to run shop/web-0 again with a new bound claim.
Would release claim shop/data-web-1: set PV pv-w1 to reclaim policy Retain, delete the claim and evict pod web-1.
  Then wait up to 5m0s for StatefulSet web to run shop/web-1 again with a new bound claim.
Would release claim shop/tool-data: set PV pv-t to reclaim policy Retain, delete the claim and evict pod tool.
  No StatefulSet owns shop/tool: no wait.
Staying (not opted in, diskfit.io/on-disk-loss is not release): shop/scratch
`
	checkResult(t, out, err, want, "")
	if w := writes(c); len(w) != 0 {
		t.Errorf("a dry run wrote: %v", w)
	}
}

// statefulSet does for the pods given what the StatefulSet controller
// does: when one is gone, it creates its claims that are gone and the
// pod, with new UIDs; for a pod that is Pending it creates its claims
// that are gone. A new pod is Pending on no node; a Pending pod whose
// claims are all new is Running on another node on the next look, its
// claims Bound, unless stuck: then they stay Pending (no disk has room,
// say).
func statefulSet(ctx context.Context, t *testing.T, client kubernetes.Interface, stuck bool, pods ...*corev1.Pod) {
	// newClaims creates p's claims that are gone and says whether all of
	// them are new ones.
	newClaims := func(p *corev1.Pod) bool {
		allNew := true
		for _, v := range p.Spec.Volumes {
			name := v.PersistentVolumeClaim.ClaimName
			got, err := client.CoreV1().PersistentVolumeClaims(p.Namespace).Get(ctx, name, metav1.GetOptions{})
			if err == nil {
				allNew = allNew && got.UID == types.UID(name+"-new")
				continue
			}
			if !apierrors.IsNotFound(err) {
				t.Error(err)
				return false
			}
			pvc := drainPVC(name, "diskfit-release", "pv-new-"+name, "")
			pvc.UID = types.UID(name + "-new")
			if stuck {
				pvc.Spec.VolumeName, pvc.Status.Phase = "", corev1.ClaimPending
			}
			if _, err := client.CoreV1().PersistentVolumeClaims(p.Namespace).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
				t.Error(err)
			}
		}
		return allNew
	}
	look := func() {
		for _, p := range pods {
			got, err := client.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
			if err == nil {
				if got.Status.Phase == corev1.PodPending && newClaims(got) && !stuck {
					// Scheduled where its new claims' volumes are.
					got.Spec.NodeName, got.Status.Phase = "node-b", corev1.PodRunning
					got.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
					if _, err := client.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, got, metav1.UpdateOptions{}); err != nil {
						t.Error(err)
					}
				}
				continue
			}
			if !apierrors.IsNotFound(err) {
				t.Error(err)
				return
			}
			newClaims(p)
			np := p.DeepCopy()
			// Pending on no node: it is scheduled once its claims are bound.
			np.UID, np.ResourceVersion, np.Spec.NodeName, np.Status.Phase = types.UID(p.Name+"-new"), "", "", corev1.PodPending
			if _, err := client.CoreV1().Pods(p.Namespace).Create(ctx, np, metav1.CreateOptions{}); err != nil {
				t.Error(err)
			}
		}
	}
	go func() {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				look()
			}
		}
	}()
}

// TestDrainRelease releases the claims that asked for it in order, one
// replica at a time: the second replica's claim is touched only after the
// first replica's pod runs again with a new bound claim; the pod without
// a controller is released without waiting; the claim that says keep and
// the other disk's claim are not touched.
func TestDrainRelease(t *testing.T) {
	c := drainCluster()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	statefulSet(ctx, t, c.Kube, false, replicaPod("web-0", "data-web-0"), replicaPod("web-1", "data-web-1"))

	out, _, err := runWith(c, "", "drain", "node-a/nvme0", "--release")
	cancel()
	want := "disk node-a/nvme0 cordoned: no new volume is placed on it; the volumes on it stay\n\nClaims on disk node-a/nvme0:\n" + drainClaimsTable + `
Released claim shop/data-web-0: PV pv-w0 kept (reclaim policy Retain), claim deleted, pod web-0 evicted.
  Waiting up to 10m0s for StatefulSet web to run shop/web-0 again with a new bound claim...
  shop/web-0 is running again.
Released claim shop/data-web-1: PV pv-w1 kept (reclaim policy Retain), claim deleted, pod web-1 evicted.
  Waiting up to 10m0s for StatefulSet web to run shop/web-1 again with a new bound claim...
  shop/web-1 is running again.
Released claim shop/tool-data: PV pv-t kept (reclaim policy Retain), claim deleted, pod tool evicted.
  No StatefulSet owns shop/tool: not waiting.

Kept with their data (reclaim policy Retain):
  PV pv-w0 on node-a/nvme0, was claim shop/data-web-0
  PV pv-w1 on node-a/nvme0, was claim shop/data-web-1
  PV pv-t on node-a/nvme0, was claim shop/tool-data
Once a PV's data is not needed, let Kubernetes delete it and its volume:
  kubectl patch pv NAME -p '{"spec":{"persistentVolumeReclaimPolicy":"Delete"}}'
Staying (not opted in, diskfit.io/on-disk-loss is not release): shop/scratch
The disks stay cordoned; diskfit uncordon node-a/nvme0 puts them back into service.
`
	checkResult(t, out, err, want, "")
	wantWrites := []string{
		"patch persistentvolumes pv-w0", "delete persistentvolumeclaims data-web-0", "create pods/eviction web-0",
		"create persistentvolumeclaims data-web-0", "create pods web-0", "update pods/status web-0",
		"patch persistentvolumes pv-w1", "delete persistentvolumeclaims data-web-1", "create pods/eviction web-1",
		"create persistentvolumeclaims data-web-1", "create pods web-1", "update pods/status web-1",
		"patch persistentvolumes pv-t", "delete persistentvolumeclaims tool-data", "create pods/eviction tool",
		"update disknodes node-a",
	}
	if diff := cmp.Diff(wantWrites, writes(c)); diff != "" {
		t.Errorf("writes (-want +got):\n%s", diff)
	}
	for _, pv := range []string{"pv-w0", "pv-w1", "pv-t"} {
		if got := reclaimPolicy(t, c, pv); got != corev1.PersistentVolumeReclaimRetain {
			t.Errorf("PV %s has reclaim policy %q, want Retain", pv, got)
		}
	}
}

// TestDrainWaitsForAReplicaNotOnTheNode: web-0 was evicted before the
// drain (kubectl drain of the node, a PDB letting one go), and its new pod
// is Pending, on no node, its volume on the drained disk. It is a replica
// down all the same: drain releases its claim (its StatefulSet gives the
// Pending pod a new one) and waits for it to run before it takes web-1
// down, or two replicas would be down at once.
//
// On a real cluster the deleted claim stays a moment, being deleted, until
// the pvc-protection controller lets it go: the Pending pod stays all the
// same, as drain says, and is not deleted.
func TestDrainWaitsForAReplicaNotOnTheNode(t *testing.T) {
	for _, hold := range []time.Duration{0, 20 * time.Millisecond} {
		t.Run(hold.String(), func(t *testing.T) { testDrainWaitsForAReplicaNotOnTheNode(t, hold) })
	}
}

func testDrainWaitsForAReplicaNotOnTheNode(t *testing.T, hold time.Duration) {
	c := drainClusterHolding(hold)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := c.Kube.CoreV1().Pods("shop").Delete(ctx, "web-0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	pending := replicaPod("web-0", "data-web-0")
	pending.UID, pending.Spec.NodeName, pending.Status.Phase = "web-0-pending", "", corev1.PodPending
	if _, err := c.Kube.CoreV1().Pods("shop").Create(ctx, pending, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Kube.(*kubefake.Clientset).ClearActions()
	statefulSet(ctx, t, c.Kube, false, pending, replicaPod("web-1", "data-web-1"))

	out, _, err := runWith(c, "", "drain", "node-a/nvme0", "--release", "--timeout", "5s")
	cancel()
	if err != nil {
		t.Fatalf("drain: %v\n%s", err, out)
	}
	w := writes(c)
	back, down := slices.Index(w, "update pods/status web-0"), slices.Index(w, "create pods/eviction web-1")
	if down < 0 || back < 0 || down < back {
		t.Errorf("web-1 was taken down before web-0 ran again: writes %q", w)
	}
	if slices.Contains(w, "create pods/eviction web-0") {
		t.Errorf("drain deleted pod web-0, Pending on no node, which it says stays: writes %q", w)
	}
	if !strings.Contains(out, "Released claim shop/data-web-0: PV pv-w0 kept (reclaim policy Retain), claim deleted. "+
		"Pod web-0, on no node yet, stays: its StatefulSet gives it a new claim.\n") || !strings.Contains(out, "shop/web-0 is running again.") {
		t.Errorf("drain did not say what it did with web-0 and wait for it:\n%s", out)
	}
}

// TestDrainTakesNoReplicaDownWhileAnotherIsDown: web-2, a third replica
// of StatefulSet web on another node, is not Ready (crash-looping, or
// Pending after a reschedule), or its pod is gone and not made again yet.
// Releasing web-0 or web-1 now would take a second replica down at once,
// which a quorum system (three replicas, two needed) does not survive:
// drain waits for web-2 and, as it stays down, releases nothing and says
// why. Before, it released web-0 at once. The same holds for a drain run
// again after one was interrupted while waiting for its replica to come
// back.
func TestDrainTakesNoReplicaDownWhileAnotherIsDown(t *testing.T) {
	for _, tc := range []struct {
		name string
		down func(*corev1.Pod)
		want string
	}{
		{"not ready", func(p *corev1.Pod) { p.Status.Conditions[0].Status = corev1.ConditionFalse }, "pod web-2 is not Ready"},
		{"pending", func(p *corev1.Pod) { p.Spec.NodeName, p.Status.Phase, p.Status.Conditions = "", corev1.PodPending, nil }, "pod web-2 is Pending"},
		{"gone", nil, "StatefulSet web has 2 of its 3 pods"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := drainCluster()
			ctx := context.Background()
			replicas := int32(3)
			sts := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop", UID: "web-uid"}, Spec: appsv1.StatefulSetSpec{Replicas: &replicas}}
			if _, err := c.Kube.AppsV1().StatefulSets("shop").Create(ctx, sts, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			if tc.down != nil {
				web2 := replicaPod("web-2", "data-web-2")
				web2.Spec.NodeName = "node-b"
				tc.down(web2)
				if _, err := c.Kube.CoreV1().Pods("shop").Create(ctx, web2, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			c.Kube.(*kubefake.Clientset).ClearActions()
			out, _, err := runWith(c, "", "drain", "node-a/nvme0", "--release", "--timeout", "300ms")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("drain with replica web-2 down: %v, want an error saying %q\n%s", err, tc.want, out)
			}
			for _, w := range writes(c) {
				if strings.HasPrefix(w, "delete") {
					t.Errorf("drain took a replica down while web-2 was down: writes %q", writes(c))
					break
				}
			}
		})
	}
}

// TestDrainWaitsForTheOthersAlsoForAReplicaWithoutItsPod: replica web-2's
// pod is gone for a moment (deleted, not made again yet), its claim on
// node-a/nvme1, while web-1 is not Ready. Releasing web-2's claim now
// would leave web-1's the only data of three that may still come back
// besides web-0's: drain finds web-2's StatefulSet from the claim's name
// (template data, set web, ordinal 2 of 3) and waits for the others as
// for any replica. Before, a claim without pods was released at once.
func TestDrainWaitsForTheOthersAlsoForAReplicaWithoutItsPod(t *testing.T) {
	c := drainCluster()
	ctx := context.Background()
	replicas := int32(3)
	sts := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop", UID: "web-uid"}, Spec: appsv1.StatefulSetSpec{
		Replicas: &replicas, VolumeClaimTemplates: []corev1.PersistentVolumeClaim{{ObjectMeta: metav1.ObjectMeta{Name: "data"}}}}}
	if _, err := c.Kube.AppsV1().StatefulSets("shop").Create(ctx, sts, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, obj := range []runtime.Object{diskfitPV("pv-w2", "node-a", "nvme1", gi, "data-web-2"), drainPVC("data-web-2", "diskfit-release", "pv-w2", "")} {
		if err := c.Kube.(*kubefake.Clientset).Tracker().Add(obj); err != nil {
			t.Fatal(err)
		}
	}
	web1, err := c.Kube.CoreV1().Pods("shop").Get(ctx, "web-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	web1.Status.Conditions[0].Status = corev1.ConditionFalse
	if _, err := c.Kube.CoreV1().Pods("shop").UpdateStatus(ctx, web1, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Kube.(*kubefake.Clientset).ClearActions()
	out, _, err := runWith(c, "", "drain", "node-a/nvme1", "--release", "--timeout", "300ms")
	if err == nil || !strings.Contains(err.Error(), "pod web-1 is not Ready") {
		t.Errorf("drain of web-2's claim, its pod gone, with web-1 not Ready: %v, want an error naming web-1\n%s", err, out)
	}
	if w := writes(c); slices.Contains(w, "delete persistentvolumeclaims data-web-2") {
		t.Errorf("drain released web-2's claim while web-1 was down: writes %q", w)
	}
}

// TestDrainFinishesAReleaseLeftHalfDone: a drain was interrupted (Ctrl-C,
// a lost connection, no right to delete pods) after it deleted claim
// data-web-0 and before it deleted pod web-0. The claim stays, being
// deleted, as long as the pod uses its volume. It is still on the disk:
// drain and status list it, and drain --release finishes its release (the
// pod is deleted, the PV stays Retain). Before, both left it out as on
// its way out, and said "No claims on disk" of a disk a pod was using.
func TestDrainFinishesAReleaseLeftHalfDone(t *testing.T) {
	c := drainCluster()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	beingDeleted(t, c, "data-web-0")
	out, _, err := runWith(c, "", "drain", "node-a/nvme0")
	if err != nil || !strings.Contains(out, "shop/data-web-0  nvme0  pv-w0  web-0  StatefulSet web  release, being deleted\n") {
		t.Errorf("drain does not list claim data-web-0, being deleted while pod web-0 uses it: %v\n%s", err, out)
	}
	out, _, err = runWith(c, "", "status", "node-a")
	if err != nil || !strings.Contains(out, "node-a/nvme0: shop/data-web-0 (release, being deleted)") {
		t.Errorf("status does not list claim data-web-0, being deleted while pod web-0 uses it: %v\n%s", err, out)
	}
	c.Kube.(*kubefake.Clientset).ClearActions()
	statefulSet(ctx, t, c.Kube, false, replicaPod("web-0", "data-web-0"), replicaPod("web-1", "data-web-1"))
	out, _, err = runWith(c, "", "drain", "node-a/nvme0", "--release")
	cancel()
	if err != nil {
		t.Fatalf("drain: %v\n%s", err, out)
	}
	if w := writes(c); !slices.Contains(w, "create pods/eviction web-0") {
		t.Errorf("drain did not finish the release of claim data-web-0: pod web-0 not evicted; writes %q\n%s", w, out)
	}
	if got := reclaimPolicy(t, c, "pv-w0"); got != corev1.PersistentVolumeReclaimRetain {
		t.Errorf("PV pv-w0 has reclaim policy %q, want Retain", got)
	}
}

// TestDrainKeepsABarePodOnNoNode: the pod using claim tool-data, which no
// controller owns, is Pending on no node, and the deleted claim stays a
// moment, being deleted. Nothing would make that pod again: drain
// releases the claim, keeps the pod, and says so.
func TestDrainKeepsABarePodOnNoNode(t *testing.T) {
	c := drainClusterHolding(20 * time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tool, err := c.Kube.CoreV1().Pods("shop").Get(ctx, "tool", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tool.Spec.NodeName, tool.Status.Phase = "", corev1.PodPending
	if _, err := c.Kube.CoreV1().Pods("shop").Update(ctx, tool, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	statefulSet(ctx, t, c.Kube, false, replicaPod("web-0", "data-web-0"), replicaPod("web-1", "data-web-1"))

	out, _, err := runWith(c, "", "drain", "node-a/nvme0", "--release", "--timeout", "5s")
	cancel()
	if err != nil {
		t.Fatalf("drain: %v\n%s", err, out)
	}
	if _, err := c.Kube.CoreV1().Pods("shop").Get(context.Background(), "tool", metav1.GetOptions{}); err != nil {
		t.Errorf("pod tool, Pending on no node, owned by no controller: %v; want it kept", err)
	}
	if want := "Released claim shop/tool-data: PV pv-t kept (reclaim policy Retain), claim deleted. " +
		"Pod tool, on no node yet, stays, waiting for a claim of that name: no StatefulSet makes one.\n"; !strings.Contains(out, want) {
		t.Errorf("drain did not say what it did with pod tool; want %q in:\n%s", want, out)
	}
}

// TestDrainStopsWhenAReplicaDoesNotComeBack has the first replica's new
// pod stay Pending: drain stops at the timeout with an error naming it and
// touches nothing of the next replica or claim.
func TestDrainStopsWhenAReplicaDoesNotComeBack(t *testing.T) {
	c := drainCluster()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	statefulSet(ctx, t, c.Kube, true, replicaPod("web-0", "data-web-0"), replicaPod("web-1", "data-web-1"))

	out, _, err := runWith(c, "", "drain", "node-a/nvme0", "--release", "--timeout", "50ms")
	cancel()
	checkResult(t, "", err, "", "replica shop/web-0 of StatefulSet web is not back after 50ms: pod web-0 is Pending, claim data-web-0 is Pending; "+
		"not released: shop/web-1, shop/tool (run drain again once it runs)")
	if !strings.Contains(out, "Kept with their data (reclaim policy Retain):\n  PV pv-w0 on node-a/nvme0, was claim shop/data-web-0\nOnce") {
		t.Errorf("output does not list the PV kept:\n%s", out)
	}
	for _, w := range writes(c) {
		if strings.Contains(w, "web-1") || strings.Contains(w, "pv-t") || strings.Contains(w, "tool") {
			t.Errorf("drain wrote %q after the first replica did not come back", w)
		}
	}
	if got := reclaimPolicy(t, c, "pv-w1"); got == corev1.PersistentVolumeReclaimRetain {
		t.Error("PV pv-w1 of the next replica was set to Retain")
	}
	pvc, err := c.Kube.CoreV1().PersistentVolumeClaims("shop").Get(context.Background(), "data-web-1", metav1.GetOptions{})
	if err != nil || pvc.UID != "data-web-1-uid" {
		t.Errorf("claim data-web-1 of the next replica: %v, %v", pvc, err)
	}
}

// TestDrainReleasesOnlyWhatStillAsksForIt: while the first replica is
// released, the owner of the second replica's claim opts out (on-disk-loss
// keep). Drain listed the claim before; it must not release it, and stops
// saying why.
func TestDrainReleasesOnlyWhatStillAsksForIt(t *testing.T) {
	c := drainCluster()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	statefulSet(ctx, t, c.Kube, false, replicaPod("web-0", "data-web-0"), replicaPod("web-1", "data-web-1"))
	kube := c.Kube.(*kubefake.Clientset)
	kube.PrependReactor("create", "pods", func(a clienttesting.Action) (bool, runtime.Object, error) {
		ev, ok := a.(clienttesting.CreateAction).GetObject().(*policyv1.Eviction)
		if !ok || ev.Name != "web-0" || len(ev.DeleteOptions.DryRun) > 0 {
			return false, nil, nil
		}
		gvr := corev1.SchemeGroupVersion.WithResource("persistentvolumeclaims")
		obj, err := kube.Tracker().Get(gvr, "shop", "data-web-1")
		if err != nil {
			return true, nil, err
		}
		pvc := obj.(*corev1.PersistentVolumeClaim).DeepCopy()
		pvc.Annotations = map[string]string{diskfit.OnDiskLossAnnotation: diskfit.OnDiskLossKeep}
		return false, nil, kube.Tracker().Update(gvr, pvc, "shop")
	})

	_, _, err := runWith(c, "", "drain", "node-a/nvme0", "--release")
	cancel()
	if err == nil || !strings.Contains(err.Error(), "shop/data-web-1") || !strings.Contains(err.Error(), "changed") {
		t.Errorf("drain returned %v, want an error saying claim shop/data-web-1 changed", err)
	}
	pvc, gerr := c.Kube.CoreV1().PersistentVolumeClaims("shop").Get(context.Background(), "data-web-1", metav1.GetOptions{})
	if gerr != nil || pvc.UID != "data-web-1-uid" || pvc.DeletionTimestamp != nil {
		t.Errorf("claim data-web-1, which opted out, was released: %v, %v", pvc, gerr)
	}
	if got := reclaimPolicy(t, c, "pv-w1"); got == corev1.PersistentVolumeReclaimRetain {
		t.Error("PV pv-w1 of the claim that opted out was set to Retain")
	}
}

func reclaimPolicy(t *testing.T, c *Clients, pv string) corev1.PersistentVolumeReclaimPolicy {
	t.Helper()
	got, err := c.Kube.CoreV1().PersistentVolumes().Get(context.Background(), pv, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return got.Spec.PersistentVolumeReclaimPolicy
}

// TestDrainErrors checks the argument and the disk before anything is
// written.
func TestDrainErrors(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		wantErr string
	}{
		{[]string{"drain", "node-a/sda"}, "node node-a has no disk sda: its disks are nvme0, nvme1"},
		{[]string{"drain", "node-x"}, `reading DiskNode node-x: disknodes.diskfit.io "node-x" not found`},
		{[]string{"drain", "node-a", "--release", "--timeout", "0"}, "--timeout must be positive: drain waits for each replica before the next"},
	} {
		c := drainCluster()
		_, _, err := runWith(c, "", tc.args...)
		checkResult(t, "", err, "", tc.wantErr)
		if w := writes(c); len(w) != 0 {
			t.Errorf("%v wrote %v", tc.args, w)
		}
	}
}

// TestDrainKeepsWhatAPodDisruptionBudgetProtects: the PodDisruptionBudget
// of StatefulSet web allows no disruption now (two replicas needed, two
// healthy). drain --release waits for it up to --timeout and then releases
// nothing: no PV, claim or pod of web-0 touched, and it says which budget
// refused. Before, it deleted the claim and the pod regardless.
func TestDrainKeepsWhatAPodDisruptionBudgetProtects(t *testing.T) {
	c := drainCluster()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	statefulSet(ctx, t, c.Kube, false, replicaPod("web-0", "data-web-0"), replicaPod("web-1", "data-web-1"))
	lifecycletest.RefuseEvictions(c.Kube.(*kubefake.Clientset), func(p *corev1.Pod, _ bool) string {
		if strings.HasPrefix(p.Name, "web-") {
			return "The disruption budget web needs 2 healthy pods and has 2 currently"
		}
		return ""
	})

	out, _, err := runWith(c, "", "drain", "node-a/nvme0", "--release", "--timeout", "50ms")
	cancel()
	if err == nil || !strings.Contains(err.Error(), "shop/web-0 not released") ||
		!strings.Contains(err.Error(), "The disruption budget web needs 2 healthy pods and has 2 currently") {
		t.Errorf("drain returned %v, want an error saying the budget of web keeps shop/web-0\n%s", err, out)
	}
	if w := writes(c); !slices.Equal(w, []string{"update disknodes node-a"}) {
		t.Errorf("drain wrote %q, want only the cordon: the budget allows no disruption", w)
	}
	if got := reclaimPolicy(t, c, "pv-w0"); got == corev1.PersistentVolumeReclaimRetain {
		t.Error("PV pv-w0 was set to Retain")
	}
}

// TestDrainEvictsThroughThePodDisruptionBudget: the budget allowed web-0's
// eviction when drain asked (a dry run) but another drain took the
// disruption before drain's own eviction: drain keeps asking, up to
// --timeout, and evicts web-0 once the budget allows it again, never
// deleting a pod the budget protects.
func TestDrainEvictsThroughThePodDisruptionBudget(t *testing.T) {
	c := drainCluster()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	statefulSet(ctx, t, c.Kube, false, replicaPod("web-0", "data-web-0"), replicaPod("web-1", "data-web-1"))
	asked := 0
	lifecycletest.RefuseEvictions(c.Kube.(*kubefake.Clientset), func(p *corev1.Pod, _ bool) string {
		if p.Name != "web-0" {
			return ""
		}
		// The dry run, then two refusals, then the budget allows it.
		if asked++; asked == 2 || asked == 3 {
			return "The disruption budget web needs 2 healthy pods and has 1 currently"
		}
		return ""
	})

	out, _, err := runWith(c, "", "drain", "node-a/nvme0", "--release", "--timeout", "5s")
	cancel()
	if err != nil {
		t.Fatalf("drain: %v\n%s", err, out)
	}
	w := writes(c)
	if slices.ContainsFunc(w, func(s string) bool { return strings.HasPrefix(s, "delete pods") }) {
		t.Errorf("drain deleted a pod rather than evicting it: writes %q", w)
	}
	if i := slices.Index(w, "create pods/eviction web-0"); i < 0 || i < slices.Index(w, "delete persistentvolumeclaims data-web-0") {
		t.Errorf("web-0 not evicted after its claim was deleted: writes %q", w)
	}
	if asked < 4 {
		t.Errorf("web-0's eviction asked %d times, want the dry run, two refusals and the eviction", asked)
	}
	if !strings.Contains(out, "shop/web-0 is running again.") {
		t.Errorf("drain did not wait for web-0:\n%s", out)
	}
}

// TestDrainEvictsTheReplicaLast: claim data-web-0 is used on node-a by
// web-0 and by a second pod, web-0-backup, and the budget over both allows
// one disruption. Each dry run passes (a dry run is not counted), but only
// one eviction can. Evicting web-0 first took the replica down, and the
// other pod, refused, kept the claim being deleted, so the new web-0 could
// never be scheduled: the replica stayed down for good. drain evicts the
// pods no StatefulSet makes again first, the replica's pod last: here the
// second eviction is refused while web-0 still runs, and drain says so.
func TestDrainEvictsTheReplicaLast(t *testing.T) {
	c := drainCluster()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	backup := makePod("web-0-backup").withClaim("data", "data-web-0").onNode("node-a").Pod
	if _, err := c.Kube.CoreV1().Pods("shop").Create(ctx, backup, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	statefulSet(ctx, t, c.Kube, false, replicaPod("web-0", "data-web-0"), replicaPod("web-1", "data-web-1"))
	allowed := 1
	lifecycletest.RefuseEvictions(c.Kube.(*kubefake.Clientset), func(p *corev1.Pod, dryRun bool) string {
		if !strings.HasPrefix(p.Name, "web-0") {
			return ""
		}
		if allowed == 0 {
			return "The disruption budget web needs 2 healthy pods and has 2 currently"
		}
		if !dryRun {
			allowed--
		}
		return ""
	})

	out, _, err := runWith(c, "", "drain", "node-a/nvme0", "--release", "--timeout", "50ms")
	cancel()
	t.Logf("drain: %v", err)
	if err == nil || !strings.Contains(err.Error(), "pod web-0-backup evicted, but pod web-0 was not") {
		t.Errorf("drain returned %v, want an error saying pod web-0 was not evicted\n%s", err, out)
	}
	pod, gerr := c.Kube.CoreV1().Pods("shop").Get(context.Background(), "web-0", metav1.GetOptions{})
	if gerr != nil || pod.UID != "web-0-uid" || pod.Spec.NodeName != "node-a" {
		t.Errorf("pod web-0: %v (err %v), want the replica still running on node-a", pod, gerr)
	}
	if w := writes(c); slices.Index(w, "create pods/eviction web-0") < slices.Index(w, "create pods/eviction web-0-backup") {
		t.Errorf("drain asked to evict web-0 before web-0-backup, taking the replica down: writes %q", w)
	}
}

// TestDrainSaysWhatAReleaseBegunBeforeLeaves: claim data-web-0 is being
// deleted since a release that did not finish, its pod running on, and
// the budget now refuses web-0's eviction. drain's error says the claim is
// being deleted, not that nothing of the replica changed.
func TestDrainSaysWhatAReleaseBegunBeforeLeaves(t *testing.T) {
	c := drainCluster()
	beingDeleted(t, c, "data-web-0")
	lifecycletest.RefuseEvictions(c.Kube.(*kubefake.Clientset), func(p *corev1.Pod, _ bool) string {
		return "The disruption budget web needs 2 healthy pods and has 2 currently"
	})
	_, _, err := runWith(c, "", "drain", "node-a/nvme0", "--release", "--timeout", "20ms")
	if err == nil || !strings.Contains(err.Error(), "shop/web-0 not released (claim shop/data-web-0 being deleted since a release begun before, its pods running on)") {
		t.Errorf("drain returned %v, want it to say that claim data-web-0 is being deleted", err)
	}
}

// beingDeleted marks claim name being deleted, held by the pvc-protection
// finalizer, as a release left half done leaves it.
func beingDeleted(t *testing.T, c *Clients, name string) {
	t.Helper()
	ctx := context.Background()
	pvc, err := c.Kube.CoreV1().PersistentVolumeClaims("shop").Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	now := metav1.Now()
	pvc.DeletionTimestamp, pvc.Finalizers = &now, []string{"kubernetes.io/pvc-protection"}
	if _, err := c.Kube.CoreV1().PersistentVolumeClaims("shop").Update(ctx, pvc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}
