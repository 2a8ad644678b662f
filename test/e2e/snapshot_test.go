package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"

	"github.com/diskfit/diskfit/apis/diskfit"
)

var (
	volumeSnapshots        = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshots"}
	volumeSnapshotContents = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshotcontents"}
)

// A snapshot of a running pod's volume, restored into a new claim, holds
// what the pod had written and synced; so does a clone of the claim. The
// whole chain is real: snapshot-controller (distributed mode) labels the
// content with the volume's node, that node's csi-snapshotter calls
// CreateSnapshot, DiskFit places both copies on the source's node and disk
// (reflink copies cannot be made anywhere else), and the node's
// external-provisioner creates them from the snapshot and the volume.
// Writing to a copy leaves the original alone, and deleting the snapshot
// deletes its content.
func TestSnapshotRestoreAndCloneHoldTheData(t *testing.T) {
	ns := newNamespace(t)
	// Reflink needs XFS: the nvme disks, on the local cluster and on kind
	// (manifests/overlays/kind). The smallest volumes (a restore is at
	// least its snapshot's size): the origin, its snapshot (booked in full,
	// it may need all of it once the origin is rewritten) and both copies
	// must fit on one disk.
	class := newStorageClass(t, "nvme")
	size := int64(diskfit.MinFilesystemVolumeBytes)
	newPVC(t, ns, "origin", class, size)
	createPod(t, ns, podSpec("origin", diskfit.SchedulerName, "origin"))
	origin := waitPVCsBound(t, ns, []string{"origin"}, 2*time.Minute)["origin"]
	originPod := waitPodRunning(t, ns, "origin", 2*time.Minute)
	originAt := placementOf(t, origin.Spec.VolumeName)

	content := []byte(fmt.Sprintf("written by pod %s before the snapshot\n", originPod.UID))
	if localDir != "" {
		writeSynced(t, filepath.Join(hostVolumePath(originPod, origin.Spec.VolumeName), "proof"), content)
	}

	dyn, err := dynamic.NewForConfig(restConfig)
	if err != nil {
		t.Fatal(err)
	}
	snap := &unstructured.Unstructured{Object: map[string]interface{}{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
		"metadata": map[string]interface{}{"name": "snap"},
		"spec": map[string]interface{}{
			"volumeSnapshotClassName": "diskfit",
			"source":                  map[string]interface{}{"persistentVolumeClaimName": "origin"},
		},
	}}
	if _, err := dyn.Resource(volumeSnapshots).Namespace(ns).Create(ctxFor(t, time.Minute), snap, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var contentName string
	err = wait.PollUntilContextTimeout(ctxFor(t, 3*time.Minute), 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		got, err := dyn.Resource(volumeSnapshots).Namespace(ns).Get(ctx, "snap", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		ready, _, _ := unstructured.NestedBool(got.Object, "status", "readyToUse")
		contentName, _, _ = unstructured.NestedString(got.Object, "status", "boundVolumeSnapshotContentName")
		return ready, nil
	})
	if err != nil {
		t.Fatalf("snapshot never became ready: %v; events:\n%s", err, events(t, ns, "snap"))
	}

	restored := claim("restored", class, size)
	restored.Spec.DataSourceRef = &v1.TypedObjectReference{APIGroup: ptr.To("snapshot.storage.k8s.io"), Kind: "VolumeSnapshot", Name: "snap"}
	cloned := claim("cloned", class, size)
	cloned.Spec.DataSourceRef = &v1.TypedObjectReference{Kind: "PersistentVolumeClaim", Name: "origin"}
	for _, c := range []*v1.PersistentVolumeClaim{restored, cloned} {
		if _, err := kube.CoreV1().PersistentVolumeClaims(ns).Create(ctxFor(t, time.Minute), c, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	createPod(t, ns, podSpec("copies", diskfit.SchedulerName, "restored", "cloned"))
	copies := waitPVCsBound(t, ns, []string{"restored", "cloned"}, 2*time.Minute)
	copiesPod := waitPodRunning(t, ns, "copies", 2*time.Minute)
	for name, pvc := range copies {
		if at := placementOf(t, pvc.Spec.VolumeName); at != originAt {
			t.Errorf("claim %s is on %s/%s, its source on %s/%s", name, at.node, at.disk, originAt.node, originAt.disk)
		}
		if got := pvc.Annotations[diskfit.SelectedDiskAnnotation]; got != originAt.disk {
			t.Errorf("claim %s was given disk %q by the scheduler, its source is on %s", name, got, originAt.disk)
		}
	}

	if localDir != "" {
		for name, pvc := range copies {
			path := filepath.Join(hostVolumePath(copiesPod, pvc.Spec.VolumeName), "proof")
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("reading the %s copy: %v", name, err)
			}
			if !bytes.Equal(got, content) {
				t.Fatalf("the %s copy holds %q, the origin had %q", name, got, content)
			}
		}
		writeSynced(t, filepath.Join(hostVolumePath(copiesPod, copies["restored"].Spec.VolumeName), "proof"), []byte("changed in the copy\n"))
		got, err := os.ReadFile(filepath.Join(hostVolumePath(originPod, origin.Spec.VolumeName), "proof"))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, content) {
			t.Fatalf("writing to the restored copy changed the origin to %q", got)
		}
	}

	// An admin shares the snapshot with another team the documented way:
	// a pre-provisioned VolumeSnapshotContent with the same handle (here in
	// the same namespace; deletionPolicy Retain, labelled for the node's
	// csi-snapshotter as snapshot-controller labels its own).
	shared := shareSnapshot(t, dyn, ns, contentName, "shared")

	if err := dyn.Resource(volumeSnapshots).Namespace(ns).Delete(ctxFor(t, time.Minute), "snap", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctxFor(t, 2*time.Minute), 500*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := dyn.Resource(volumeSnapshotContents).Get(ctx, contentName, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("VolumeSnapshotContent %s outlived its snapshot: %v", contentName, err)
	}

	// Its first owner deleted the snapshot: the shared one still holds
	// the data (before, DeleteSnapshot deleted it under the other content).
	again := claim("from-shared", class, size)
	again.Spec.DataSourceRef = &v1.TypedObjectReference{APIGroup: ptr.To("snapshot.storage.k8s.io"), Kind: "VolumeSnapshot", Name: shared}
	if _, err := kube.CoreV1().PersistentVolumeClaims(ns).Create(ctxFor(t, time.Minute), again, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	createPod(t, ns, podSpec("from-shared", diskfit.SchedulerName, "from-shared"))
	fromShared := waitPVCsBound(t, ns, []string{"from-shared"}, 2*time.Minute)["from-shared"]
	fromSharedPod := waitPodRunning(t, ns, "from-shared", 2*time.Minute)
	if localDir != "" {
		got, err := os.ReadFile(filepath.Join(hostVolumePath(fromSharedPod, fromShared.Spec.VolumeName), "proof"))
		if err != nil || !bytes.Equal(got, content) {
			t.Fatalf("the restore of the shared snapshot holds %q (err %v), the origin had %q", got, err, content)
		}
	}
}

// shareSnapshot makes a VolumeSnapshot name in ns, pre-provisioned from the
// snapshot handle of VolumeSnapshotContent from (deletionPolicy Retain),
// waits until it is ready and returns its name. Its content is deleted
// with the test.
func shareSnapshot(t *testing.T, dyn dynamic.Interface, ns, from, name string) string {
	t.Helper()
	ctx := ctxFor(t, 3*time.Minute)
	orig, err := dyn.Resource(volumeSnapshotContents).Get(ctx, from, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	handle, _, _ := unstructured.NestedString(orig.Object, "status", "snapshotHandle")
	contentName := name + "-" + ns
	content := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
		"metadata": map[string]any{"name": contentName, "labels": orig.GetLabels()},
		"spec": map[string]any{
			"driver":            diskfit.DriverName,
			"deletionPolicy":    "Retain",
			"source":            map[string]any{"snapshotHandle": handle},
			"volumeSnapshotRef": map[string]any{"namespace": ns, "name": name},
		},
	}}
	if _, err := dyn.Resource(volumeSnapshotContents).Create(ctx, content, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = dyn.Resource(volumeSnapshotContents).Delete(context.Background(), contentName, metav1.DeleteOptions{})
	})
	snap := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
		"metadata": map[string]any{"name": name},
		"spec":     map[string]any{"source": map[string]any{"volumeSnapshotContentName": contentName}},
	}}
	if _, err := dyn.Resource(volumeSnapshots).Namespace(ns).Create(ctx, snap, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		got, err := dyn.Resource(volumeSnapshots).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		ready, _, _ := unstructured.NestedBool(got.Object, "status", "readyToUse")
		return ready, nil
	})
	if err != nil {
		t.Fatalf("shared snapshot %s never became ready: %v; events:\n%s", name, err, events(t, ns, name))
	}
	return name
}

// placementOf returns the node and disk of a diskfit PV.
func placementOf(t *testing.T, pvName string) placement {
	t.Helper()
	pv, err := kube.CoreV1().PersistentVolumes().Get(ctxFor(t, time.Minute), pvName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	at, err := pvPlacement(pv)
	if err != nil {
		t.Fatal(err)
	}
	return at
}

// writeSynced writes a file and fsyncs it, as an application does before
// it relies on the data: snapshots are crash-consistent copies of the disk.
func writeSynced(t *testing.T, path string, content []byte) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(content); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}
