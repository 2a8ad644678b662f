package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
)

// Retain means retain. A claim of a StorageClass with reclaim policy
// Retain is written through its pod, then the pod, the claim and (as an
// admin does before re-creating it for a new claim) the Released PV are
// deleted. The volume outlives several orphan sweeps of its driver (every
// 10 s on the local cluster) with its data, and its DiskNode lists it. A
// PV re-created by hand for a new claim mounts the old data. Deleted again,
// `diskfit reclaim` removes it through Kubernetes' own reclaim path.
func TestRetainedVolumeKeepsItsData(t *testing.T) {
	needLocal(t)
	ns := newNamespace(t)
	class := newStorageClassWithPolicy(t, "", v1.PersistentVolumeReclaimRetain)
	newPVC(t, ns, "data", class, diskfit.MinFilesystemVolumeBytes)
	createPod(t, ns, podSpec("writer", diskfit.SchedulerName, "data"))
	bound := waitPVCsBound(t, ns, []string{"data"}, 2*time.Minute)["data"]
	writer := waitPodRunning(t, ns, "writer", 2*time.Minute)
	content := []byte(fmt.Sprintf("written by pod %s, to be kept\n", writer.UID))
	writeSynced(t, filepath.Join(hostVolumePath(writer, bound.Spec.VolumeName), "proof"), content)
	pv, err := kube.CoreV1().PersistentVolumes().Get(ctxFor(t, time.Minute), bound.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	at := placementOf(t, pv.Name)
	handle := pv.Spec.CSI.VolumeHandle
	_, key, _ := strings.Cut(handle, ":")
	dataFile := filepath.Join(hostDiskPath(at.node, at.disk), "diskfit", "volumes", key+".img")

	deletePodAndWait(t, ns, "writer")
	if err := kube.CoreV1().PersistentVolumeClaims(ns).Delete(ctxFor(t, time.Minute), "data", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPVPhase(t, pv.Name, v1.VolumeReleased)
	deletePVAndWait(t, pv.Name)

	// The driver finds the volume without a PV and keeps it.
	listed := waitWithoutPV(t, at.node, handle, true)
	if listed.NeverHadPV || listed.SizeBytes != pv.Spec.Capacity.Storage().Value() || listed.Claim != ns+"/data" {
		t.Errorf("DiskNode %s lists the retained volume as %+v", at.node, listed)
	}
	// Three more sweeps.
	time.Sleep(35 * time.Second)
	if _, err := os.Stat(dataFile); err != nil {
		t.Fatalf("the retained volume's data file is gone after several sweeps: %v", err)
	}
	waitWithoutPV(t, at.node, handle, true)

	// An admin re-creates the PV for a new claim, which mounts the data.
	again := claimVolumeOf(t, pv, ns, "again", class)
	createPod(t, ns, podSpec("reader", diskfit.SchedulerName, "again"))
	waitPVCsBound(t, ns, []string{"again"}, 2*time.Minute)
	reader := waitPodRunning(t, ns, "reader", 2*time.Minute)
	got, err := os.ReadFile(filepath.Join(hostVolumePath(reader, again.Name), "proof"))
	if err != nil {
		t.Fatalf("reading the retained data through the re-created PV: %v", err)
	}
	if !bytes.Equal(got, content) {
		t.Fatalf("the re-created PV holds %q, the pod wrote %q", got, content)
	}
	waitWithoutPV(t, at.node, handle, false)

	// Done with it: the claim and the PV go again, and reclaim deletes the
	// volume.
	deletePodAndWait(t, ns, "reader")
	if err := kube.CoreV1().PersistentVolumeClaims(ns).Delete(ctxFor(t, time.Minute), "again", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPVPhase(t, again.Name, v1.VolumeReleased)
	deletePVAndWait(t, again.Name)
	waitWithoutPV(t, at.node, handle, true)
	reclaim := exec.Command(filepath.Join(localBin, "diskfit"), "--kubeconfig", kubeconfigFile, "reclaim", at.node, handle)
	if out, err := reclaim.CombinedOutput(); err != nil {
		t.Fatalf("diskfit reclaim: %v\n%s", err, out)
	}
	if _, err := os.Stat(dataFile); !os.IsNotExist(err) {
		t.Errorf("the reclaimed volume's data file is still there: %v", err)
	}
	waitWithoutPV(t, at.node, handle, false)
}

// Moving a volume to another claim keeps its data even when the first
// PV's reclaim policy was left at Delete. An admin gives a volume a second
// PV, pre-bound to a new claim, and deletes the first claim: its PV is
// Released and external-provisioner calls DeleteVolume, which the driver
// refuses while the second PV refers to the volume, calling the deletion
// off (the first PV becomes Retain; its warning says so). The new claim's
// pod reads what the first pod wrote, also once the first PV is deleted.
func TestDeletingOneOfTwoPVsKeepsTheData(t *testing.T) {
	needLocal(t)
	ns := newNamespace(t)
	class := newStorageClass(t, "")
	newPVC(t, ns, "data", class, diskfit.MinFilesystemVolumeBytes)
	createPod(t, ns, podSpec("writer", diskfit.SchedulerName, "data"))
	bound := waitPVCsBound(t, ns, []string{"data"}, 2*time.Minute)["data"]
	writer := waitPodRunning(t, ns, "writer", 2*time.Minute)
	content := []byte(fmt.Sprintf("written by pod %s, moved to another claim\n", writer.UID))
	writeSynced(t, filepath.Join(hostVolumePath(writer, bound.Spec.VolumeName), "proof"), content)
	first, err := kube.CoreV1().PersistentVolumes().Get(ctxFor(t, time.Minute), bound.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	// The second PV, for claim "moved"; the first keeps reclaim policy
	// Delete.
	moved := claimVolumeOf(t, first, ns, "moved", class)
	waitPVCsBound(t, ns, []string{"moved"}, 2*time.Minute)

	deletePodAndWait(t, ns, "writer")
	if err := kube.CoreV1().PersistentVolumeClaims(ns).Delete(ctxFor(t, time.Minute), "data", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	var warning string
	err = wait.PollUntilContextTimeout(ctxFor(t, 2*time.Minute), time.Second, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		pv, err := kube.CoreV1().PersistentVolumes().Get(ctx, first.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, fmt.Errorf("PV %s was deleted, and its volume with it, while PV %s refers to it", first.Name, moved.Name)
		}
		events, err := kube.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{
			FieldSelector: "involvedObject.kind=PersistentVolume,involvedObject.name=" + first.Name,
		})
		if err != nil || pv.Status.Phase != v1.VolumeReleased {
			return false, nil
		}
		for _, e := range events.Items {
			if e.Type == v1.EventTypeWarning && strings.Contains(e.Message, moved.Name+" also refers to it") && strings.Contains(e.Message, "called off") {
				warning = e.Message
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("deleting claim data while PV %s refers to its volume: %v", moved.Name, err)
	}
	t.Logf("PV %s: %s", first.Name, warning)

	createPod(t, ns, podSpec("reader", diskfit.SchedulerName, "moved"))
	reader := waitPodRunning(t, ns, "reader", 2*time.Minute)
	got, err := os.ReadFile(filepath.Join(hostVolumePath(reader, moved.Name), "proof"))
	if err != nil {
		t.Fatalf("reading the data through the second PV: %v", err)
	}
	if !bytes.Equal(got, content) {
		t.Fatalf("the second PV holds %q, the first pod wrote %q", got, content)
	}

	// The deletion is called off for good: the first PV is Retain, and
	// deleting it leaves the data to the second.
	if strings.Contains(warning, "PersistentVolume "+first.Name+",") {
		t.Errorf("the refusal names the PV being deleted as one that keeps the volume: %s", warning)
	}
	waitPVPolicy(t, first.Name, v1.PersistentVolumeReclaimRetain)
	deletePVAndWait(t, first.Name)
	if _, err := os.ReadFile(filepath.Join(hostVolumePath(reader, moved.Name), "proof")); err != nil {
		t.Errorf("the data is gone once the first PV was taken back: %v", err)
	}
}

// claimVolumeOf does what an admin does to give the volume of pv to a new
// claim: a copy of pv named <pv>-<name>, pre-bound to claim ns/name, which
// it creates bound to that PV.
func claimVolumeOf(t *testing.T, pv *v1.PersistentVolume, ns, name, class string) *v1.PersistentVolume {
	t.Helper()
	cp := pv.DeepCopy()
	cp.ObjectMeta = metav1.ObjectMeta{Name: pv.Name + "-" + name}
	cp.Status = v1.PersistentVolumeStatus{}
	cp.Spec.ClaimRef = &v1.ObjectReference{Namespace: ns, Name: name}
	if _, err := kube.CoreV1().PersistentVolumes().Create(ctxFor(t, time.Minute), cp, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c := claim(name, class, pv.Spec.Capacity.Storage().Value())
	c.Spec.VolumeName = cp.Name
	if _, err := kube.CoreV1().PersistentVolumeClaims(ns).Create(ctxFor(t, time.Minute), c, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return cp
}

// newStorageClassWithPolicy is newStorageClass with a reclaim policy.
func newStorageClassWithPolicy(t *testing.T, deviceClass string, policy v1.PersistentVolumeReclaimPolicy) string {
	t.Helper()
	name := newStorageClass(t, deviceClass)
	sc, err := kube.StorageV1().StorageClasses().Get(ctxFor(t, time.Minute), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The reclaim policy of a StorageClass cannot be changed: make a copy.
	cp := &storagev1.StorageClass{
		ObjectMeta:           metav1.ObjectMeta{GenerateName: "diskfit-"},
		Provisioner:          sc.Provisioner,
		Parameters:           sc.Parameters,
		VolumeBindingMode:    sc.VolumeBindingMode,
		AllowVolumeExpansion: sc.AllowVolumeExpansion,
		ReclaimPolicy:        ptr.To(policy),
	}
	created, err := kube.StorageV1().StorageClasses().Create(ctxFor(t, time.Minute), cp, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = kube.StorageV1().StorageClasses().Delete(context.Background(), created.Name, metav1.DeleteOptions{})
	})
	return created.Name
}

// deletePodAndWait deletes a pod and waits until it is gone, so that the
// kubelet has unmounted its volumes.
func deletePodAndWait(t *testing.T, ns, name string) {
	t.Helper()
	if err := kube.CoreV1().Pods(ns).Delete(ctxFor(t, time.Minute), name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(ctxFor(t, 2*time.Minute), 500*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("pod %s/%s is not gone: %v", ns, name, err)
	}
}

func waitPVPhase(t *testing.T, name string, phase v1.PersistentVolumePhase) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctxFor(t, 2*time.Minute), 500*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		pv, err := kube.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
		return err == nil && pv.Status.Phase == phase, nil
	})
	if err != nil {
		t.Fatalf("PV %s never became %s: %v", name, phase, err)
	}
}

// waitPVPolicy waits until PV name has reclaim policy policy.
func waitPVPolicy(t *testing.T, name string, policy v1.PersistentVolumeReclaimPolicy) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctxFor(t, 2*time.Minute), 500*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		pv, err := kube.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
		return err == nil && pv.Spec.PersistentVolumeReclaimPolicy == policy, nil
	})
	if err != nil {
		t.Fatalf("PV %s never got reclaim policy %s: %v", name, policy, err)
	}
}

func deletePVAndWait(t *testing.T, name string) {
	t.Helper()
	if err := kube.CoreV1().PersistentVolumes().Delete(ctxFor(t, time.Minute), name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(ctxFor(t, 2*time.Minute), 500*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := kube.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("PV %s is not gone: %v", name, err)
	}
}

// waitWithoutPV waits until node's DiskNode lists (or, with want false, no
// longer lists) the volume among those without a PV, and returns its entry.
func waitWithoutPV(t *testing.T, node, handle string, want bool) v1alpha1.VolumeWithoutPV {
	t.Helper()
	var found v1alpha1.VolumeWithoutPV
	err := wait.PollUntilContextTimeout(ctxFor(t, 2*time.Minute), time.Second, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		dn, err := diskfitAPI.DiskfitV1alpha1().DiskNodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, d := range dn.Status.Disks {
			for _, v := range d.WithoutPV {
				if v.VolumeHandle == handle {
					found = v
					return want, nil
				}
			}
		}
		return !want, nil
	})
	if err != nil {
		t.Fatalf("DiskNode %s: listing %s without a PV is not %v: %v", node, handle, want, err)
	}
	return found
}
