package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/diskfit/diskfit/apis/diskfit"
)

// A storage-heavy StatefulSet with two claim templates of different sizes
// spreads over nodes with uneven disks: every pod runs (the kubelet staged
// and published both volumes), every claim is bound on the disk its
// annotation names, no disk holds more than its capacity.
func TestStorageHeavyStatefulSet(t *testing.T) {
	ns := newNamespace(t)
	class := newStorageClass(t, "")
	const replicas = 6
	sts := statefulSet("db", diskfit.SchedulerName, class, replicas, 1*gi, 400*mi)
	if _, err := kube.AppsV1().StatefulSets(ns).Create(ctxFor(t, time.Minute), sts, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var claims []string
	for i := range replicas {
		claims = append(claims, fmt.Sprintf("data0-db-%d", i), fmt.Sprintf("data1-db-%d", i))
	}
	bound := waitPVCsBound(t, ns, claims, 3*time.Minute)
	for i := range replicas {
		pod := waitPodRunning(t, ns, fmt.Sprintf("db-%d", i), 2*time.Minute)
		for _, c := range []string{fmt.Sprintf("data0-db-%d", i), fmt.Sprintf("data1-db-%d", i)} {
			pvc := bound[c]
			pv, err := kube.CoreV1().PersistentVolumes().Get(context.Background(), pvc.Spec.VolumeName, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			p, err := pvPlacement(pv)
			if err != nil {
				t.Fatal(err)
			}
			if p.node != pod.Spec.NodeName || p.disk != pvc.Annotations[diskfit.SelectedDiskAnnotation] {
				t.Errorf("claim %s: volume on %+v, pod on %s, annotation disk %q", c, p, pod.Spec.NodeName, pvc.Annotations[diskfit.SelectedDiskAnnotation])
			}
		}
	}
	checkSchedulerKeptItsPromise(t, ns)
	t.Logf("bytes per disk: %v", pvBytesPerDisk(t))
}

// Pods of the default scheduler still get volumes: without the annotation
// the driver picks the disk itself.
func TestDefaultSchedulerPodsGetVolumes(t *testing.T) {
	ns := newNamespace(t)
	class := newStorageClass(t, "")
	newPVC(t, ns, "plain", class, 500*mi)
	createPod(t, ns, podSpec("plain", defaultScheduler, "plain"))
	pvc := waitPVCsBound(t, ns, []string{"plain"}, 2*time.Minute)["plain"]
	if disk, ok := pvc.Annotations[diskfit.SelectedDiskAnnotation]; ok {
		t.Errorf("default scheduler's claim carries a disk annotation %q", disk)
	}
	pv, err := kube.CoreV1().PersistentVolumes().Get(context.Background(), pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := pvPlacement(pv)
	if err != nil {
		t.Fatal(err)
	}
	pod := waitPodScheduled(t, ns, "plain", time.Minute)
	if p.node != pod.Spec.NodeName {
		t.Errorf("volume on node %s, pod on %s", p.node, pod.Spec.NodeName)
	}
	if pv.Spec.VolumeMode != nil && *pv.Spec.VolumeMode != v1.PersistentVolumeFilesystem {
		t.Errorf("volume mode %v", *pv.Spec.VolumeMode)
	}
}
