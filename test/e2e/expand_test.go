package e2e

import (
	"context"
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

// Growing a volume beyond what its disk holds is refused before anything
// records the new size: ControllerExpandVolume answers OutOfRange naming
// the disk's free space, external-resizer marks the claim's resize
// infeasible (the user may lower the request again), and the PV keeps its
// size, which is what the DiskFit scheduler books on the disk. Before, the
// resizer wrote the request into the PV at once and the node's
// NodeExpandVolume refused it: the PV said 64Gi for as long as the claim
// asked, and every other claim was kept off a disk that was nearly empty.
// The volume and its pod stay as they were.
func TestExpandBeyondTheDiskFailsCleanly(t *testing.T) {
	ns := newNamespace(t)
	pvc, pod := runningPodWithClaim(t, ns, "big", 512*mi)

	expandTo(t, ns, "big", 64*gi)
	var reason string
	err := wait.PollUntilContextTimeout(ctxFor(t, 3*time.Minute), time.Second, 150*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := kube.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "big", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if got.Status.AllocatedResourceStatuses[v1.ResourceStorage] != v1.PersistentVolumeClaimControllerResizeInfeasible {
			return false, nil
		}
		for _, c := range got.Status.Conditions {
			if c.Type == v1.PersistentVolumeClaimControllerResizeError && strings.Contains(c.Message, "OutOfRange") {
				reason = c.Message
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("the claim's resize not refused as infeasible (OutOfRange): %v; events:\n%s", err, events(t, ns, "big"))
	}
	t.Logf("expansion refused: %s", reason)
	if !strings.Contains(reason, "free") {
		t.Errorf("the refusal does not say how much the disk has free: %s", reason)
	}
	pv, err := kube.CoreV1().PersistentVolumes().Get(context.Background(), pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c := pv.Spec.Capacity.Storage().Value(); c != 512*mi {
		t.Errorf("PV capacity %d after the refused expansion, want %d: the scheduler books it on the disk", c, 512*mi)
	}
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
	if localDir != "" {
		var st syscall.Statfs_t
		if err := syscall.Statfs(hostVolumePath(pod, pvc.Spec.VolumeName), &st); err != nil {
			t.Fatalf("volume no longer mounted: %v", err)
		}
	}
}
