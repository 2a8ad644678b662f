package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/diskfit/diskfit/apis/diskfit"
)

// The disk choice must reach the PVC in the very update that sets
// selected-node (DESIGN.md, "The write that must not conflict"): every PVC
// version that names a node also names a disk, the PV lands on that disk,
// the claim has a DiskSelected event naming it, and the API server refuses
// no PVC update with a conflict.
func TestDiskAndNodeArriveInOneWrite(t *testing.T) {
	ns := newNamespace(t)
	class := newStorageClass(t, "")
	conflictsBefore := pvcUpdateConflicts(t)

	w, err := kube.CoreV1().PersistentVolumeClaims(ns).Watch(ctxFor(t, 3*time.Minute), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var (
		mu       sync.Mutex
		versions []*v1.PersistentVolumeClaim
	)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for ev := range w.ResultChan() {
			if pvc, ok := ev.Object.(*v1.PersistentVolumeClaim); ok && ev.Type != watch.Deleted {
				mu.Lock()
				versions = append(versions, pvc)
				mu.Unlock()
			}
		}
	}()

	const pods = 6
	var claims []string
	for i := range pods {
		a, b := fmt.Sprintf("p%d-a", i), fmt.Sprintf("p%d-b", i)
		newPVC(t, ns, a, class, 400*mi)
		newPVC(t, ns, b, class, 300*mi)
		claims = append(claims, a, b)
		createPod(t, ns, podSpec(fmt.Sprintf("p%d", i), diskfit.SchedulerName, a, b))
	}
	bound := waitPVCsBound(t, ns, claims, 2*time.Minute)
	w.Stop()
	<-watched

	mu.Lock()
	defer mu.Unlock()
	for _, pvc := range versions {
		node, disk := pvc.Annotations[diskfit.SelectedNodeAnnotation], pvc.Annotations[diskfit.SelectedDiskAnnotation]
		if node != "" && disk == "" {
			t.Errorf("PVC %s version %s has selected-node %s but no disk", pvc.Name, pvc.ResourceVersion, node)
		}
	}
	for name, pvc := range bound {
		pv, err := kube.CoreV1().PersistentVolumes().Get(context.Background(), pvc.Spec.VolumeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p, err := pvPlacement(pv)
		if err != nil {
			t.Fatal(err)
		}
		want := placement{pvc.Annotations[diskfit.SelectedNodeAnnotation], pvc.Annotations[diskfit.SelectedDiskAnnotation]}
		if p != want {
			t.Errorf("PVC %s annotated for %+v, volume created on %+v", name, want, p)
		}
		// The scheduler says so on the claim.
		waitForEvent(t, ns, name, "DiskSelected", "disk "+p.disk+" on node "+p.node)
	}
	for i := range pods {
		pod := waitPodScheduled(t, ns, fmt.Sprintf("p%d", i), time.Minute)
		for _, c := range []string{fmt.Sprintf("p%d-a", i), fmt.Sprintf("p%d-b", i)} {
			if got := bound[c].Annotations[diskfit.SelectedNodeAnnotation]; got != pod.Spec.NodeName {
				t.Errorf("pod %s on node %s, its claim %s selected node %s", pod.Name, pod.Spec.NodeName, c, got)
			}
		}
	}
	if conflicts := pvcUpdateConflicts(t) - conflictsBefore; conflicts != 0 {
		t.Errorf("%d PVC updates were refused with a conflict, want 0", conflicts)
	}
	checkSchedulerKeptItsPromise(t, ns)
}

// A pod whose claim fits no single disk stays Pending and says why, per disk.
func TestPodThatFitsNowhereStaysPending(t *testing.T) {
	ns := newNamespace(t)
	class := newStorageClass(t, "")
	newPVC(t, ns, "huge", class, 64*gi)
	createPod(t, ns, podSpec("huge", diskfit.SchedulerName, "huge"))
	msg := waitForUnschedulable(t, ns, "huge", "largest free disk", "pod needs 64Gi on one disk")
	t.Logf("FailedScheduling: %s", msg)
	pod, err := kube.CoreV1().Pods(ns).Get(context.Background(), "huge", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Spec.NodeName != "" {
		t.Fatalf("pod scheduled to %s", pod.Spec.NodeName)
	}
	pvc, err := kube.CoreV1().PersistentVolumeClaims(ns).Get(context.Background(), "huge", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := pvc.Annotations[diskfit.SelectedNodeAnnotation]; ok {
		t.Fatalf("claim got a node: %v", pvc.Annotations)
	}
}
