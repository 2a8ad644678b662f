package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/diskfit/diskfit/apis/diskfit"
)

// settle waits until each of the pods either has all its claims bound or has
// been refused by the scheduler with a per-disk reason, and returns the
// bound and refused pod names.
func settle(t *testing.T, ns string, pods map[string][]string, timeout time.Duration) (bound, refused []string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctxFor(t, timeout+time.Second), time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		pvcs, err := kube.CoreV1().PersistentVolumeClaims(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		phase := map[string]*v1.PersistentVolumeClaim{}
		for i := range pvcs.Items {
			phase[pvcs.Items[i].Name] = &pvcs.Items[i]
		}
		// The scheduler keeps its latest reason in the pod's PodScheduled
		// condition; events may be aggregated or dropped under load.
		podList, err := kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		refusedPods := map[string]bool{}
		for _, pod := range podList.Items {
			for _, c := range pod.Status.Conditions {
				if pod.Spec.NodeName == "" && c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse &&
					(strings.Contains(c.Message, "largest free disk") || strings.Contains(c.Message, "do not fit")) {
					refusedPods[pod.Name] = true
				}
			}
		}
		bound, refused = nil, nil
	pods:
		for pod, claims := range pods {
			allBound, noneSelected := true, true
			for _, c := range claims {
				pvc := phase[c]
				if pvc == nil {
					continue pods
				}
				allBound = allBound && pvc.Status.Phase == v1.ClaimBound
				noneSelected = noneSelected && pvc.Annotations[diskfit.SelectedNodeAnnotation] == ""
			}
			switch {
			case allBound:
				bound = append(bound, pod)
			case noneSelected && refusedPods[pod]:
				refused = append(refused, pod)
			}
		}
		return len(bound)+len(refused) == len(pods), nil
	})
	if err != nil {
		settled := map[string]bool{}
		for _, p := range append(append([]string{}, bound...), refused...) {
			settled[p] = true
		}
		var b strings.Builder
		for pod, claims := range pods {
			if settled[pod] {
				continue
			}
			p, _ := kube.CoreV1().Pods(ns).Get(context.Background(), pod, metav1.GetOptions{})
			fmt.Fprintf(&b, "  pod %s node %q conditions %+v\n", pod, p.Spec.NodeName, p.Status.Conditions)
			for _, c := range claims {
				pvc, _ := kube.CoreV1().PersistentVolumeClaims(ns).Get(context.Background(), c, metav1.GetOptions{})
				fmt.Fprintf(&b, "    claim %s phase %s annotations %v\n", c, pvc.Status.Phase, pvc.Annotations)
			}
		}
		t.Fatalf("pods not settled after %s: %d bound, %d refused of %d: %v\n%s", timeout, len(bound), len(refused), len(pods), err, b.String())
	}
	return bound, refused
}

// createPods creates n pods named prefix-NN, each with one claim of size.
func createPods(t *testing.T, ns, class, prefix string, n int, size int64) map[string][]string {
	t.Helper()
	pods := map[string][]string{}
	for i := range n {
		name := fmt.Sprintf("%s-%02d", prefix, i)
		newPVC(t, ns, name, class, size)
		createPod(t, ns, podSpec(name, diskfit.SchedulerName, name))
		pods[name] = []string{name}
	}
	return pods
}

// Deleting claims frees their space, and pods waiting for space get it.
func TestDeletingClaimsFreesSpace(t *testing.T) {
	const deviceClass, size = "nvme", 300 * mi
	fit := claimsThatFit(t, deviceClass, size)
	ns := newNamespace(t)
	class := newStorageClass(t, deviceClass)
	pods := createPods(t, ns, class, "f", fit+2, size)
	bound, refused := settle(t, ns, pods, 2*time.Minute)
	if len(refused) == 0 {
		t.Fatalf("all %d pods fit; the test needs the disks full", len(bound))
	}
	t.Logf("%d pods bound, %d waiting for space", len(bound), len(refused))

	ctx := ctxFor(t, time.Minute)
	for _, name := range bound[:len(refused)] {
		if err := kube.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
			t.Fatal(err)
		}
		if err := kube.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var waiting []string
	for _, name := range refused {
		waiting = append(waiting, pods[name]...)
	}
	waitPVCsBound(t, ns, waiting, 2*time.Minute)
	checkSchedulerKeptItsPromise(t, ns)
}

// The nonlinear case. A node's two disks have 1Gi free each. A pod with
// three 640Mi claims passes the default scheduler there (each claim is below
// the largest disk's free space, all together below the node's total) and
// then fails to provision; diskfit rejects the node for the same pod, says
// why per disk, and places it on a node that can hold it.
func TestNonlinearDisksFoolOnlyTheDefaultScheduler(t *testing.T) {
	needLocal(t)
	const node = "node-a"
	const leave = 1 * gi
	for _, disk := range []string{"nvme0", "nvme1"} {
		takeSpace(t, node, disk, hostFree(t, node, disk)-leave)
	}
	// Wait until both schedulers' inputs show it: the DiskNode and the
	// CSIStorageCapacity that external-provisioner publishes.
	ns := newNamespace(t)
	class := newStorageClass(t, "")
	err := wait.PollUntilContextTimeout(ctxFor(t, time.Minute), time.Second, 50*time.Second, true, func(ctx context.Context) (bool, error) {
		dn, err := diskfitAPI.DiskfitV1alpha1().DiskNodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, d := range dn.Status.Disks {
			if d.FreeBytes > leave+64*mi {
				return false, nil
			}
		}
		caps, err := kube.StorageV1().CSIStorageCapacities(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range caps.Items {
			if c.StorageClassName == class && c.NodeTopology != nil && c.NodeTopology.MatchLabels[diskfit.TopologyKey] == node &&
				c.MaximumVolumeSize != nil && c.MaximumVolumeSize.Value() <= leave+64*mi {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("disks of %s not reported nearly full: %v", node, err)
	}

	const size = 640 * mi
	podWithClaims := func(name, scheduler string, affinity *v1.NodeAffinity) *v1.Pod {
		var claims []string
		for i := range 3 {
			c := fmt.Sprintf("%s-%d", name, i)
			newPVC(t, ns, c, class, size)
			claims = append(claims, c)
		}
		pod := podSpec(name, scheduler, claims...)
		pod.Spec.Affinity = &v1.Affinity{NodeAffinity: affinity}
		return createPod(t, ns, pod)
	}
	onNodeA := []v1.NodeSelectorTerm{{MatchFields: []v1.NodeSelectorRequirement{{
		Key: "metadata.name", Operator: v1.NodeSelectorOpIn, Values: []string{node},
	}}}}
	required := &v1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &v1.NodeSelector{NodeSelectorTerms: onNodeA}}
	preferred := &v1.NodeAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []v1.PreferredSchedulingTerm{{
		Weight: 100, Preference: v1.NodeSelectorTerm{MatchFields: onNodeA[0].MatchFields},
	}}}

	// The default scheduler is fooled: it sends the claims to node-a and
	// the driver refuses one of them.
	podWithClaims("fooled", defaultScheduler, required)
	found := false
	err = wait.PollUntilContextTimeout(ctxFor(t, 2*time.Minute), time.Second, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		for i := range 3 {
			evs, err := kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + fmt.Sprintf("fooled-%d", i)})
			if err != nil {
				return false, err
			}
			for _, e := range evs.Items {
				if e.Reason == "ProvisioningFailed" && strings.Contains(e.Message, "ResourceExhausted") {
					found = true
				}
			}
		}
		return found, nil
	})
	if err != nil {
		t.Errorf("the default scheduler's pod never hit ResourceExhausted on %s: %v", node, err)
	}

	// diskfit rejects node-a for the same pod, per disk.
	podWithClaims("pinned", diskfit.SchedulerName, required)
	msg := waitForUnschedulable(t, ns, "pinned", "node "+node+":")
	t.Logf("diskfit on %s: %s", node, msg)

	// And places it on a node that holds it.
	placed := podWithClaims("placed", diskfit.SchedulerName, preferred)
	pod := waitPodRunning(t, ns, placed.Name, 2*time.Minute)
	if pod.Spec.NodeName == node {
		t.Errorf("diskfit placed the pod on %s, whose disks cannot hold its claims", node)
	}
	// The driver refused none of diskfit's claims.
	for i := range 3 {
		name := fmt.Sprintf("placed-%d", i)
		if strings.Contains(events(t, ns, name), "ResourceExhausted") {
			t.Errorf("the driver refused diskfit's claim %s with ResourceExhausted:\n%s", name, events(t, ns, name))
		}
	}
	checkNoReservationHeld(t)
}
