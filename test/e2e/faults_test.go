package e2e

import (
	"context"
	"maps"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
)

// The scheduler is killed (SIGKILL) after it has written claims' node and
// disk and before their volumes exist (the node's external-provisioner is
// paused, so that window is certain), then twice more while pods race for
// the rest of the space, so some kills land between a Reserve and its PVC
// write. Each time the local cluster restarts it, as a Deployment would.
// The restarted scheduler rebuilds its ledger from API objects (the
// annotated claims count against their disks), so no disk is overbooked,
// every pod that fits is placed and the rest wait with a per-disk reason.
func TestSchedulerRestartsNeverOverbook(t *testing.T) {
	needLocal(t)
	const deviceClass, node, size = "nvme", "node-a", 300 * mi
	fit := claimsThatFit(t, deviceClass, size)
	ns := newNamespace(t)
	class := newStorageClass(t, deviceClass)
	waitForCapacity(t, class, node)
	resume := pauseProvisioner(t, node)
	pods := createPods(t, ns, class, "early", fit/2, size)
	waitPlaced(t, ns, fit/2)

	killScheduler(t)
	maps.Copy(pods, createPods(t, ns, class, "late", fit, size))
	for range 2 {
		time.Sleep(1500 * time.Millisecond)
		killScheduler(t)
	}
	resume()

	bound, refused := settle(t, ns, pods, 4*time.Minute)
	t.Logf("%d pods for room of %d across 3 scheduler kills: %d bound, %d refused", len(pods), fit, len(bound), len(refused))
	checkFull(t, deviceClass, size, len(refused))
	checkSchedulerKeptItsPromise(t, ns)
}

// waitPlaced waits until n claims of the namespace have a node and a disk.
func waitPlaced(t *testing.T, ns string, n int) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctxFor(t, 2*time.Minute), 500*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		pvcs, err := kube.CoreV1().PersistentVolumeClaims(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		placed := 0
		for _, pvc := range pvcs.Items {
			if pvc.Annotations[diskfit.SelectedDiskAnnotation] != "" && pvc.Annotations[diskfit.SelectedNodeAnnotation] != "" {
				placed++
			}
		}
		return placed >= n, nil
	})
	if err != nil {
		t.Fatalf("%d claims not placed: %v", n, err)
	}
}

// The API server disappears for the diskfit components and sidecars (their
// connections go through the local cluster's proxy, which cuts them) while
// a pod with a claim is created. Nothing can happen meanwhile; once the
// API server is back, the same processes (none restarted) pick up where
// they were: the pod is scheduled and runs, its claim is bound, and the
// driver's DiskNode reports resume.
func TestComponentsRecoverFromAPIServerOutage(t *testing.T) {
	needLocal(t)
	const node = "node-a"
	cluster, err := strconv.Atoi(filepath.Base(localDir))
	if err != nil {
		t.Fatalf("local cluster pid from %s: %v", localDir, err)
	}
	schedulerArg := "--config=" + filepath.Join(localDir, "scheduler-config.yaml")
	driverArg := "--node-id=" + node
	pids := map[string]int{
		"diskfit-scheduler": findProcess(t, "diskfit-scheduler", schedulerArg),
		"diskfit-csi":       findProcess(t, "diskfit-csi", driverArg),
	}
	ns := newNamespace(t)
	class := newStorageClass(t, "nvme")
	waitForCapacity(t, class, node)

	if err := syscall.Kill(cluster, syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	outageEnded := false
	endOutage := func() {
		if !outageEnded {
			outageEnded = true
			_ = syscall.Kill(cluster, syscall.SIGUSR2)
		}
	}
	t.Cleanup(endOutage)
	time.Sleep(2 * time.Second)
	before := observed(t, node)
	newPVC(t, ns, "during", class, 300*mi)
	createPod(t, ns, podSpec("during", diskfit.SchedulerName, "during"))
	// Longer than the driver's DiskNode resync (5s) and the scheduler's
	// retries: the outage is real if nothing moved.
	time.Sleep(20 * time.Second)
	if pod, err := kube.CoreV1().Pods(ns).Get(ctxFor(t, time.Minute), "during", metav1.GetOptions{}); err != nil || pod.Spec.NodeName != "" {
		t.Fatalf("the pod was scheduled during the outage (%v): the components were not cut off", err)
	}
	if after := observed(t, node); !after.Equal(&before) {
		t.Fatalf("DiskNode %s was updated during the outage (%s -> %s)", node, before, after)
	}
	endOutage()

	waitPVCsBound(t, ns, []string{"during"}, 3*time.Minute)
	waitPodRunning(t, ns, "during", 2*time.Minute)
	err = wait.PollUntilContextTimeout(ctxFor(t, time.Minute), time.Second, 30*time.Second, true, func(context.Context) (bool, error) {
		after := observed(t, node)
		return after.After(before.Time), nil
	})
	if err != nil {
		t.Errorf("DiskNode %s reports did not resume after the outage", node)
	}
	for name, pid := range pids {
		arg := schedulerArg
		if name == "diskfit-csi" {
			arg = driverArg
		}
		if now := findProcess(t, name, arg); now != pid {
			t.Errorf("%s was restarted (pid %d, now %d); it should have recovered on its own", name, pid, now)
		}
	}
}

// observed returns when the node's driver last reported its disks.
func observed(t *testing.T, node string) metav1.Time {
	t.Helper()
	dn, err := diskfitAPI.DiskfitV1alpha1().DiskNodes().Get(ctxFor(t, time.Minute), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return dn.Status.ObservedTime
}

// A node is deleted for good (its Node object removed, as an operator or a
// cloud's node controller does) while a StatefulSet pod runs there with a
// claim that opted in with diskfit.io/release-on-node-deletion.
// diskfit-controller releases the claim once the Node has stayed gone for
// its grace time (30 s on the local cluster); once the pod is gone
// (the pod garbage collector's job in a real cluster, done by the test
// here), the StatefulSet recreates the claim and the pod, which run on a
// live node. On a cluster of its own: the deleted node does not come back.
//
// A disk of that node was taken out of service before: its DiskNode, the
// cordon in its spec, outlives the Node, and when a Node of that name
// registers again (created by the test here, as a kubelet registering
// anew does) the cordon still holds.
func TestStatefulSetMovesOffADeletedNode(t *testing.T) {
	needLocal(t)
	second := startSecondCluster(t)
	client := second.client(t)
	ctx := ctxFor(t, 9*time.Minute)
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "move"}, Provisioner: diskfit.DriverName,
		VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer)}
	if _, err := client.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sts := statefulSet("move", diskfit.SchedulerName, "move", 1, 300*mi)
	sts.Spec.VolumeClaimTemplates[0].Annotations = map[string]string{diskfit.ReleaseOnNodeDeletionAnnotation: "true"}
	if _, err := client.AppsV1().StatefulSets("default").Create(ctx, sts, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	const claimName = "data0-move-0"
	first := waitRunning(t, client, "move-0", "")
	firstClaim, err := client.CoreV1().PersistentVolumeClaims("default").Get(ctx, claimName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	df := second.diskfit(t)
	dn, err := df.DiskfitV1alpha1().DiskNodes().Get(ctx, first.Spec.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cordoned := dn.Status.Disks[0].Name
	dn.Spec.Disks = append(dn.Spec.Disks, v1alpha1.DiskSpec{Name: cordoned, Unschedulable: true, Reason: "SMART errors"})
	if _, err := df.DiskfitV1alpha1().DiskNodes().Update(ctx, dn, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	lostNode, err := client.CoreV1().Nodes().Get(ctx, first.Spec.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := client.CoreV1().Nodes().Delete(ctx, first.Spec.NodeName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, time.Second, 4*time.Minute, true, func(ctx context.Context) (bool, error) {
		pvc, err := client.CoreV1().PersistentVolumeClaims("default").Get(ctx, claimName, metav1.GetOptions{})
		return apierrors.IsNotFound(err) || (err == nil && (pvc.DeletionTimestamp != nil || pvc.UID != firstClaim.UID)), nil
	})
	if err != nil {
		t.Fatalf("the claim on deleted node %s was not released: %v", first.Spec.NodeName, err)
	}
	if err := client.CoreV1().Pods("default").Delete(ctx, "move-0", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}

	moved := waitRunning(t, client, "move-0", first.UID)
	if moved.Spec.NodeName == first.Spec.NodeName {
		t.Fatalf("the pod came back on deleted node %s", first.Spec.NodeName)
	}
	claim, err := client.CoreV1().PersistentVolumeClaims("default").Get(ctx, claimName, metav1.GetOptions{})
	if err != nil || claim.UID == firstClaim.UID || claim.Status.Phase != v1.ClaimBound {
		t.Fatalf("want a new bound claim %s, got %v (err %v)", claimName, claim, err)
	}
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := client.CoreV1().PersistentVolumes().Get(ctx, firstClaim.Spec.VolumeName, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Errorf("the PV %s of the deleted node was not removed: %v", firstClaim.Spec.VolumeName, err)
	}
	t.Logf("pod moved from deleted node %s to %s with a new claim", first.Spec.NodeName, moved.Spec.NodeName)

	// The Node has been gone longer than the grace time by now.
	wantCordon := func(when string) {
		t.Helper()
		dn, err := df.DiskfitV1alpha1().DiskNodes().Get(ctx, first.Spec.NodeName, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("%s: the DiskNode of %s, which takes disk %s out of service, is gone: %v", when, first.Spec.NodeName, cordoned, err)
		}
		if out, _ := dn.Spec.DiskUnschedulable(cordoned); !out {
			t.Fatalf("%s: the cordon of disk %s/%s is lost: spec %+v", when, first.Spec.NodeName, cordoned, dn.Spec)
		}
	}
	wantCordon("the Node deleted")
	again := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: lostNode.Name, Labels: lostNode.Labels}}
	if _, err := client.CoreV1().Nodes().Create(ctx, again, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The node's driver cannot report here: its token was bound to the
	// deleted Node's UID (a real DaemonSet pod gets a new one). The
	// DiskNode, cordon and all, must stay with the Node back: neither the
	// garbage collector nor diskfit-controller may take it.
	err = wait.PollUntilContextTimeout(ctx, time.Second, 15*time.Second, true, func(ctx context.Context) (bool, error) {
		dn, err := df.DiskfitV1alpha1().DiskNodes().Get(ctx, first.Spec.NodeName, metav1.GetOptions{})
		if err != nil {
			// Only its absence ends the wait: a request cut by the
			// wait's own deadline says nothing.
			return apierrors.IsNotFound(err), nil
		}
		out, _ := dn.Spec.DiskUnschedulable(cordoned)
		return !out, nil
	})
	if !wait.Interrupted(err) {
		t.Fatalf("with the Node registered again, the DiskNode or its cordon went: %v", err)
	}
	wantCordon("the Node registered again")
}

// waitRunning waits until the default namespace's pod is Running, and is
// not the pod with UID old.
func waitRunning(t *testing.T, client kubernetes.Interface, name string, old types.UID) *v1.Pod {
	t.Helper()
	var pod *v1.Pod
	err := wait.PollUntilContextTimeout(ctxFor(t, 3*time.Minute), 500*time.Millisecond, 150*time.Second, true, func(ctx context.Context) (bool, error) {
		p, err := client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		pod = p
		return p.UID != old && p.Status.Phase == v1.PodRunning, nil
	})
	if err != nil {
		t.Fatalf("pod %s not running: %v; last seen %+v", name, err, pod)
	}
	return pod
}
