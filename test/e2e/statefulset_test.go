package e2e

import (
	"context"
	"fmt"
	"slices"
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

// A StatefulSet with two claims per pod and more replicas than the disks
// can hold: exactly as many pods as fit get their volumes, the others stay
// Pending with DiskFit's per-disk reason and their claims get no node, and
// the driver refuses no claim (no ResourceExhausted). How many fit is
// counted here from each disk's capacity less its PVs, claim by claim: with claims of
// one size, a disk holds floor(free/size) of them and a node
// floor(slots/2) pods.
func TestStatefulSetLargerThanTheDisks(t *testing.T) {
	ns := newNamespace(t)
	class := newStorageClass(t, "")
	size, fit := equalClaimsThatFit(t, 2)
	replicas := fit + 2
	sts := statefulSet("big", diskfit.SchedulerName, class, int32(replicas), size, size)
	if _, err := kube.AppsV1().StatefulSets(ns).Create(ctxFor(t, time.Minute), sts, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pods := map[string][]string{}
	for i := range replicas {
		pods[fmt.Sprintf("big-%d", i)] = []string{fmt.Sprintf("data0-big-%d", i), fmt.Sprintf("data1-big-%d", i)}
	}
	bound, refused := settle(t, ns, pods, 5*time.Minute)
	t.Logf("claims of %d MiB: %d pods fit, %d bound, %d refused", size/mi, fit, len(bound), len(refused))
	if len(bound) != fit || len(refused) != replicas-fit {
		t.Errorf("%d pods got volumes and %d were refused; the disks hold %d such pods", len(bound), len(refused), fit)
	}
	for _, name := range bound {
		waitPodRunning(t, ns, name, 2*time.Minute)
	}
	checkSchedulerKeptItsPromise(t, ns)
}

// equalClaimsThatFit picks a claim size for pods of perPod equal claims
// such that every schedulable disk's free space is clear of a multiple of
// it by at least 64 MiB (so that file system metadata cannot tip a count),
// and between 2 and 12 such pods fit on the cluster; it returns the size
// and how many pods fit.
func equalClaimsThatFit(t *testing.T, perPod int) (size int64, fit int) {
	t.Helper()
	ctx := ctxFor(t, time.Minute)
	nodes, err := kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	schedulable := map[string]bool{}
	for _, n := range nodes.Items {
		ok := !n.Spec.Unschedulable
		for _, taint := range n.Spec.Taints {
			ok = ok && taint.Effect != v1.TaintEffectNoSchedule && taint.Effect != v1.TaintEffectNoExecute
		}
		schedulable[n.Name] = ok
	}
	dns, err := diskfitAPI.DiskfitV1alpha1().DiskNodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Free is capacity less the PVs on the disk: both stay right while the
	// status lags behind volumes deleted a moment ago (its freeBytes does
	// not).
	used := pvBytesPerDisk(t)
	free := map[string][]int64{}
	var all []int64
	for _, dn := range dns.Items {
		if !schedulable[dn.Name] || dn.Spec.Unschedulable {
			continue
		}
		out := map[string]bool{}
		for _, d := range dn.Spec.Disks {
			out[d.Name] = d.Unschedulable
		}
		for _, d := range dn.Status.Disks {
			if d.Healthy && !out[d.Name] {
				f := d.CapacityBytes - used[placement{node: dn.Name, disk: d.Name}]
				free[dn.Name] = append(free[dn.Name], f)
				all = append(all, f)
			}
		}
	}
	slices.Sort(all)
	const margin = 64 * mi
	for _, f := range all {
		for _, part := range []float64{0.6, 0.45, 0.7, 0.35, 0.8} {
			size = int64(float64(f)*part) / mi * mi
			if size < 64*mi {
				continue
			}
			fit = 0
			clear := true
			for _, disks := range free {
				slots := 0
				for _, f := range disks {
					slots += int(f / size)
					clear = clear && (f%size >= margin || f < size)
				}
				fit += slots / perPod
			}
			if clear && fit >= 2 && fit <= 12 {
				return size, fit
			}
		}
	}
	t.Skipf("no claim size gives 2 to 12 pods of %d claims on these disks (free bytes %v)", perPod, free)
	return 0, 0
}
