package e2e

import (
	"context"
	"math"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/diskfit/diskfit/apis/diskfit"
)

// expandTo raises a claim's request.
func expandTo(t *testing.T, ns, name string, size int64) {
	t.Helper()
	ctx := ctxFor(t, time.Minute)
	pvc, err := kube.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pvc.Spec.Resources.Requests[v1.ResourceStorage] = *resource.NewQuantity(size, resource.BinarySI)
	if _, err := kube.CoreV1().PersistentVolumeClaims(ns).Update(ctx, pvc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// runningPodWithClaim creates a claim and a diskfit-scheduled pod using
// it, both named name, and waits until the pod runs.
func runningPodWithClaim(t *testing.T, ns, name string, size int64) (*v1.PersistentVolumeClaim, *v1.Pod) {
	t.Helper()
	newPVC(t, ns, name, newStorageClass(t, ""), size)
	createPod(t, ns, podSpec(name, diskfit.SchedulerName, name))
	pvc := waitPVCsBound(t, ns, []string{name}, 2*time.Minute)[name]
	return pvc, waitPodRunning(t, ns, name, 2*time.Minute)
}

// Expanding a claim of a running pod grows the volume on its disk and the
// filesystem the pod sees (external-resizer updates the PV; the kubelet on
// the volume's node calls NodeExpandVolume).
func TestExpandGrowsTheFilesystem(t *testing.T) {
	ns := newNamespace(t)
	pvc, pod := runningPodWithClaim(t, ns, "grow", 512*mi)

	expandTo(t, ns, "grow", 1*gi)
	err := wait.PollUntilContextTimeout(ctxFor(t, 3*time.Minute), time.Second, 150*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := kube.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "grow", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return got.Status.Capacity.Storage().Value() >= gi, nil
	})
	if err != nil {
		t.Fatalf("claim capacity never reached 1Gi: %v; events:\n%s", err, events(t, ns, "grow"))
	}
	if localDir == "" {
		t.Skip("the claim grew; checking the size of the pod's filesystem needs the local cluster, whose kubelet directories are on this host")
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(hostVolumePath(pod, pvc.Spec.VolumeName), &st); err != nil {
		t.Fatal(err)
	}
	if size := int64(st.Blocks) * st.Frsize; size < 900*mi {
		t.Errorf("the pod's filesystem is %d bytes after expanding to 1Gi", size)
	}
}

// Growing a volume beyond what its disk holds fails with ResourceExhausted
// and leaves the volume and its pod as they were; and it books nothing:
// external-resizer writes the request into the PV at once, and the DiskFit
// scheduler books PVs on their disks, but only the growth the disk has
// room for. On the local cluster a pod whose claims need the disk's real
// free space is placed there after the refusal. Before, the PV's 64Gi kept
// every other claim off that disk for as long as the claim asked.
func TestExpandBeyondTheDiskFailsCleanly(t *testing.T) {
	ns := newNamespace(t)
	newPVC(t, ns, "big", newStorageClass(t, ""), 512*mi)
	pod := podSpec("big", diskfit.SchedulerName, "big")
	if localDir != "" {
		// A disk of node-c, whose three disks another pod will need.
		pod.Spec.NodeSelector = map[string]string{v1.LabelHostname: "node-c"}
	}
	createPod(t, ns, pod)
	pvc := waitPVCsBound(t, ns, []string{"big"}, 2*time.Minute)["big"]
	pod = waitPodRunning(t, ns, "big", 2*time.Minute)

	expandTo(t, ns, "big", 64*gi)
	// The kubelet reports the failed NodeExpandVolume on the claim.
	var reason string
	err := wait.PollUntilContextTimeout(ctxFor(t, 3*time.Minute), time.Second, 150*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := kube.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "big", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range got.Status.Conditions {
			if c.Type == v1.PersistentVolumeClaimNodeResizeError && strings.Contains(c.Message, "ResourceExhausted") {
				reason = c.Message
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no NodeResizeError with ResourceExhausted on the claim: %v; events:\n%s", err, events(t, ns, "big"))
	}
	t.Logf("expansion refused: %s", reason)
	got, err := kube.CoreV1().PersistentVolumeClaims(ns).Get(context.Background(), "big", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c := got.Status.Capacity.Storage().Value(); c != 512*mi {
		t.Errorf("claim capacity %d after a failed expansion, want %d", c, 512*mi)
	}
	if running := waitPodRunning(t, ns, "big", time.Minute); running.UID != pod.UID {
		t.Errorf("pod was replaced")
	}
	if localDir == "" {
		t.Skip("the expansion was refused; placing a pod on the same disk after it needs the local cluster's node-c")
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(hostVolumePath(pod, pvc.Spec.VolumeName), &st); err != nil {
		t.Fatalf("volume no longer mounted: %v", err)
	}

	// One claim per disk of node-c, each larger than half of any disk's
	// free space (no disk takes two) and no larger than the least: the
	// pod fits only with the disk of big, as it really is.
	dn, err := diskfitAPI.DiskfitV1alpha1().DiskNodes().Get(ctxFor(t, time.Minute), "node-c", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	least, most := int64(math.MaxInt64), int64(0)
	for _, d := range dn.Status.Disks {
		least, most = min(least, d.FreeBytes), max(most, d.FreeBytes)
	}
	size := (least - 32*mi) / mi * mi
	if size*2 <= most || size < 256*mi {
		t.Skipf("node-c's disks have %d to %d bytes free: no claim size needs every one of them", least, most)
	}
	var claims []string
	class := newStorageClass(t, "")
	for i := range dn.Status.Disks {
		name := "after-" + strconv.Itoa(i)
		newPVC(t, ns, name, class, size)
		claims = append(claims, name)
	}
	after := podSpec("after", diskfit.SchedulerName, claims...)
	after.Spec.NodeSelector = map[string]string{v1.LabelHostname: "node-c"}
	createPod(t, ns, after)
	waitPVCsBound(t, ns, claims, 2*time.Minute)
	waitPodRunning(t, ns, "after", 2*time.Minute)
}
