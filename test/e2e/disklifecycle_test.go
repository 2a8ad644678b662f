package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/csi-driver/lifecycle"
)

// A disk fails under a running StatefulSet replica whose StorageClass asks
// for release on disk loss (diskfit.io/on-disk-loss: release). The disk
// is made to vanish from under the driver, as a pulled or dead device does:
// its filesystem is detached from the disk's path. Its DiskNode says so,
// the claim and its pod are told (Warning events), and once the disk has
// been unhealthy for the controller's grace time the claim is released:
// the StatefulSet recreates claim and pod, and the new volume is on
// another disk. The old volume's PV is kept with reclaim policy Retain;
// when the disk comes back its data file is still there, fully allocated,
// until an admin sets the PV's policy to Delete, which deletes it.
func TestStatefulSetMovesOffAFailedDisk(t *testing.T) {
	needLocal(t)
	ctx := ctxFor(t, 8*time.Minute)
	sts := statefulSet("lostdisk", diskfit.SchedulerName, releasingClass(t), 1, 300*mi)
	if _, err := kube.AppsV1().StatefulSets("default").Create(ctx, sts, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = kube.AppsV1().StatefulSets("default").Delete(context.Background(), "lostdisk", metav1.DeleteOptions{})
	})
	const claimName = "data0-lostdisk-0"
	first := waitRunning(t, kube, "lostdisk-0", "")
	firstClaim, err := kube.CoreV1().PersistentVolumeClaims("default").Get(ctx, claimName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = kube.CoreV1().PersistentVolumeClaims("default").Delete(context.Background(), claimName, metav1.DeleteOptions{})
	})
	pvName := firstClaim.Spec.VolumeName
	at := placementOf(t, pvName)
	pv, err := kube.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, key, _ := strings.Cut(pv.Spec.CSI.VolumeHandle, ":")
	dataFile := filepath.Join(hostDiskPath(at.node, at.disk), "diskfit", "volumes", key+".img")

	restore := failDisk(t, at.node, at.disk)
	t.Cleanup(restore)
	waitEvent(t, "default", claimName, firstClaim.UID, lifecycle.ReasonDiskFailed, time.Minute)
	waitEvent(t, "default", "lostdisk-0", first.UID, lifecycle.ReasonDiskFailed, time.Minute)

	err = wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		pvc, err := kube.CoreV1().PersistentVolumeClaims("default").Get(ctx, claimName, metav1.GetOptions{})
		return apierrors.IsNotFound(err) || (err == nil && pvc.UID != firstClaim.UID), nil
	})
	if err != nil {
		t.Fatalf("the claim on failed disk %s/%s was not released: %v", at.node, at.disk, err)
	}
	moved := waitRunning(t, kube, "lostdisk-0", first.UID)
	newClaim, err := kube.CoreV1().PersistentVolumeClaims("default").Get(ctx, claimName, metav1.GetOptions{})
	if err != nil || newClaim.Status.Phase != v1.ClaimBound {
		t.Fatalf("want a new bound claim %s, got %v (err %v)", claimName, newClaim, err)
	}
	if now := placementOf(t, newClaim.Spec.VolumeName); now == at {
		t.Fatalf("the new volume is on the failed disk %s/%s", at.node, at.disk)
	} else {
		t.Logf("replica moved from failed disk %s/%s to %s/%s (pod on %s)", at.node, at.disk, now.node, now.disk, moved.Spec.NodeName)
	}

	kept, err := kube.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the released volume's PV: %v, want it kept", err)
	}
	if kept.Spec.PersistentVolumeReclaimPolicy != v1.PersistentVolumeReclaimRetain {
		t.Errorf("the released volume's PV has reclaim policy %s, want Retain", kept.Spec.PersistentVolumeReclaimPolicy)
	}
	waitEvent(t, "", pvName, kept.UID, lifecycle.ReasonReleased, time.Minute)

	// The disk comes back: the data is still there.
	restore()
	var st syscall.Stat_t
	if err := syscall.Stat(dataFile, &st); err != nil {
		t.Fatalf("the released volume's data file after the disk came back: %v", err)
	}
	if st.Blocks*512 < st.Size {
		t.Errorf("the released volume's data file has %d of %d bytes allocated", st.Blocks*512, st.Size)
	}
	// The admin lets it go.
	patch := []byte(`{"spec":{"persistentVolumeReclaimPolicy":"Delete"}}`)
	if _, err := kube.CoreV1().PersistentVolumes().Patch(ctx, pvName, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := kube.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
		_, statErr := os.Stat(dataFile)
		return apierrors.IsNotFound(err) && os.IsNotExist(statErr), nil
	})
	if err != nil {
		t.Errorf("with reclaim policy Delete, the released PV and its data file were not deleted: %v", err)
	}
}

// failDisk detaches a local node's disk filesystem from the disk's path
// (lazily: attached volumes keep it alive), as a device that died or was
// pulled leaves it; the returned function mounts it back, once.
func failDisk(t *testing.T, node, disk string) (restore func()) {
	t.Helper()
	path := hostDiskPath(node, disk)
	out, err := exec.Command("findmnt", "-n", "-o", "SOURCE", "--mountpoint", path).Output()
	if err != nil {
		t.Fatalf("finding the device of %s: %v", path, err)
	}
	dev := strings.TrimSpace(string(out))
	if err := syscall.Unmount(path, syscall.MNT_DETACH); err != nil {
		t.Fatalf("detaching %s: %v", path, err)
	}
	done := false
	return func() {
		if done {
			return
		}
		done = true
		if out, err := exec.Command("mount", dev, path).CombinedOutput(); err != nil {
			t.Errorf("mounting %s back on %s: %v: %s", dev, path, err, out)
		}
	}
}

// waitEvent waits for an event with reason about the object of that name
// and UID.
func waitEvent(t *testing.T, ns, name string, uid types.UID, reason string, timeout time.Duration) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctxFor(t, timeout+time.Second), time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		list, err := kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			return false, nil
		}
		for _, e := range list.Items {
			if e.InvolvedObject.UID == uid && e.Reason == reason {
				t.Logf("event on %s: %s: %s", name, e.Reason, e.Message)
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Errorf("no %s event on %s: %v", reason, name, err)
	}
}

// releasingClass returns a new StorageClass whose claims ask to be
// released when their disk is lost.
func releasingClass(t *testing.T) string {
	t.Helper()
	ctx := ctxFor(t, time.Minute)
	class := newStorageClass(t, "")
	sc, err := kube.StorageV1().StorageClasses().Get(ctx, class, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// StorageClass parameters cannot change: a copy that opts in.
	sc.ObjectMeta = metav1.ObjectMeta{Name: class + "-release"}
	sc.Parameters = map[string]string{diskfit.OnDiskLossAnnotation: diskfit.OnDiskLossRelease}
	if _, err := kube.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = kube.StorageV1().StorageClasses().Delete(context.Background(), sc.Name, metav1.DeleteOptions{})
	})
	return sc.Name
}

// waitBudget waits until the disruption controller has computed the
// status of PodDisruptionBudget name as it is now, allowing allowed
// disruptions.
func waitBudget(t *testing.T, name string, allowed int32) {
	t.Helper()
	var pdb *policyv1.PodDisruptionBudget
	err := wait.PollUntilContextTimeout(ctxFor(t, time.Minute), 200*time.Millisecond, 50*time.Second, true, func(ctx context.Context) (bool, error) {
		var err error
		pdb, err = kube.PolicyV1().PodDisruptionBudgets("default").Get(ctx, name, metav1.GetOptions{})
		return err == nil && pdb.Status.ObservedGeneration == pdb.Generation && pdb.Status.DisruptionsAllowed == allowed, nil
	})
	if err != nil {
		t.Fatalf("PodDisruptionBudget %s does not allow %d disruptions: %v; last seen %+v", name, allowed, err, pdb)
	}
}

// diskfitCLI runs the diskfit command against the suite's cluster.
func diskfitCLI(args ...string) *exec.Cmd {
	return exec.Command(filepath.Join(localBin, "diskfit"), append([]string{"--kubeconfig", kubeconfigFile}, args...)...)
}

// An admin drains a healthy disk under a running StatefulSet replica:
// `diskfit drain NODE/DISK --release` takes the disk out of service,
// releases the replica's claim (it asked for it through its class) and
// waits until the replica runs again, on another disk. The old volume's PV
// is kept with Retain. `diskfit uncordon` puts the disk back in service.
//
// The replica's PodDisruptionBudget has its say, through the API server's
// evictions and the disruption controller: while it allows no disruption,
// drain changes nothing of the replica (before, it deleted claim and pod
// regardless); once it allows one, drain evicts the pod.
func TestDrainMovesAReplicaOffADisk(t *testing.T) {
	needLocal(t)
	ctx := ctxFor(t, 6*time.Minute)
	sts := statefulSet("drained", diskfit.SchedulerName, releasingClass(t), 1, 300*mi)
	if _, err := kube.AppsV1().StatefulSets("default").Create(ctx, sts, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	const claimName = "data0-drained-0"
	t.Cleanup(func() {
		_ = kube.AppsV1().StatefulSets("default").Delete(context.Background(), "drained", metav1.DeleteOptions{})
		_ = kube.CoreV1().PersistentVolumeClaims("default").Delete(context.Background(), claimName, metav1.DeleteOptions{})
	})
	first := waitRunning(t, kube, "drained-0", "")
	firstClaim, err := kube.CoreV1().PersistentVolumeClaims("default").Get(ctx, claimName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pvName := firstClaim.Spec.VolumeName
	at := placementOf(t, pvName)
	target := at.node + "/" + at.disk
	t.Cleanup(func() {
		_ = diskfitCLI("uncordon", target).Run()
		patch := []byte(`{"spec":{"persistentVolumeReclaimPolicy":"Delete"}}`)
		_, _ = kube.CoreV1().PersistentVolumes().Patch(context.Background(), pvName, types.MergePatchType, patch, metav1.PatchOptions{})
	})

	budget := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "drained"},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MinAvailable: ptr.To(intstr.FromInt32(1)),
			Selector:     sts.Spec.Selector,
		},
	}
	if _, err := kube.PolicyV1().PodDisruptionBudgets("default").Create(ctx, budget, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = kube.PolicyV1().PodDisruptionBudgets("default").Delete(context.Background(), "drained", metav1.DeleteOptions{})
	})
	waitBudget(t, "drained", 0)
	out, err := diskfitCLI("drain", target, "--release", "--timeout", "5s", "--reason", "e2e").CombinedOutput()
	t.Logf("diskfit drain %s --release, the budget allowing no disruption:\n%s", target, out)
	if err == nil || !strings.Contains(string(out), "The disruption budget drained needs 1 healthy pods and has 1 currently") {
		t.Errorf("diskfit drain returned %v, want it to stop, saying that budget drained allows no disruption", err)
	}
	if pod, err := kube.CoreV1().Pods("default").Get(ctx, "drained-0", metav1.GetOptions{}); err != nil || pod.UID != first.UID || pod.DeletionTimestamp != nil {
		t.Errorf("pod drained-0, which its budget protects: %v (err %v), want it untouched", pod, err)
	}
	if pvc, err := kube.CoreV1().PersistentVolumeClaims("default").Get(ctx, claimName, metav1.GetOptions{}); err != nil || pvc.UID != firstClaim.UID || pvc.DeletionTimestamp != nil {
		t.Errorf("claim %s, whose pod its budget protects: %v (err %v), want it untouched", claimName, pvc, err)
	}
	if pv, err := kube.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{}); err != nil || pv.Spec.PersistentVolumeReclaimPolicy != v1.PersistentVolumeReclaimDelete {
		t.Errorf("PV %s, whose pod its budget protects: %v (err %v), want reclaim policy Delete still", pvName, pv, err)
	}
	patch := []byte(`{"spec":{"minAvailable":null,"maxUnavailable":1}}`)
	if _, err := kube.PolicyV1().PodDisruptionBudgets("default").Patch(ctx, "drained", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	waitBudget(t, "drained", 1)

	out, err = diskfitCLI("drain", target, "--release", "--timeout", "3m", "--reason", "e2e").CombinedOutput()
	t.Logf("diskfit drain %s --release:\n%s", target, out)
	if err != nil {
		t.Fatalf("diskfit drain: %v", err)
	}
	moved := waitRunning(t, kube, "drained-0", first.UID)
	newClaim, err := kube.CoreV1().PersistentVolumeClaims("default").Get(ctx, claimName, metav1.GetOptions{})
	if err != nil || newClaim.UID == firstClaim.UID || newClaim.Status.Phase != v1.ClaimBound {
		t.Fatalf("want a new bound claim %s, got %v (err %v)", claimName, newClaim, err)
	}
	if now := placementOf(t, newClaim.Spec.VolumeName); now == at {
		t.Fatalf("the new volume is on the drained disk %s", target)
	} else {
		t.Logf("replica moved from %s to %s/%s (pod on %s)", target, now.node, now.disk, moved.Spec.NodeName)
	}
	kept, err := kube.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
	if err != nil || kept.Spec.PersistentVolumeReclaimPolicy != v1.PersistentVolumeReclaimRetain {
		t.Errorf("the drained volume's PV: %v (err %v), want it kept with Retain", kept, err)
	}
	dn, err := diskfitAPI.DiskfitV1alpha1().DiskNodes().Get(ctx, at.node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if out, reason := dn.Spec.DiskUnschedulable(at.disk); !out || reason != "e2e" {
		t.Errorf("DiskNode %s spec after drain: %+v, want disk %s unschedulable for e2e", at.node, dn.Spec, at.disk)
	}
	if out, err := diskfitCLI("uncordon", target).CombinedOutput(); err != nil {
		t.Fatalf("diskfit uncordon: %v\n%s", err, out)
	}
	dn, err = diskfitAPI.DiskfitV1alpha1().DiskNodes().Get(ctx, at.node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if out, _ := dn.Spec.DiskUnschedulable(at.disk); out {
		t.Errorf("disk %s still unschedulable after uncordon: %+v", target, dn.Spec)
	}
}
