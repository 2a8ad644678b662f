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

	"github.com/diskfit/diskfit/csi-driver/apis/diskfit"
)

// nodesWithClass returns the nodes with healthy disks of deviceClass and
// what those disks can still take: capacity minus the diskfit PVs on them.
// (The reported free space may lag a few seconds behind volumes just deleted.)
func nodesWithClass(t *testing.T, deviceClass string) map[string][]int64 {
	t.Helper()
	list, err := diskfitAPI.DiskfitV1alpha1().DiskNodes().List(ctxFor(t, time.Minute), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	used := checkNoDiskOverbooked(t)
	free := map[string][]int64{}
	for _, dn := range list.Items {
		for _, d := range dn.Status.Disks {
			if d.Usable(deviceClass) {
				free[dn.Name] = append(free[dn.Name], d.CapacityBytes-used[placement{dn.Name, d.Name}])
			}
		}
	}
	return free
}

// Fifty pods created at once compete for the last space of one node's disks:
// the ledger must let exactly as many through as the disks hold, never
// overbook a disk, and leave the rest Pending with a per-disk reason.
func TestRaceForLastSpaceNeverOverbooks(t *testing.T) {
	const deviceClass = "nvme"
	free := nodesWithClass(t, deviceClass)
	if len(free) != 1 {
		t.Fatalf("want exactly one node with %s disks, have %v", deviceClass, free)
	}
	const size = 300 * mi
	fit := 0
	for _, disks := range free {
		for _, f := range disks {
			fit += int(f / size)
		}
	}
	const pods = 50
	if fit >= pods*2/3 {
		t.Fatalf("the %s disks hold about %d claims of %d bytes; the race needs far fewer than %d", deviceClass, fit, size, pods)
	}
	ns := newNamespace(t)
	class := newStorageClass(t, deviceClass)
	conflictsBefore := pvcUpdateConflicts(t)
	for i := range pods {
		name := fmt.Sprintf("r%02d", i)
		newPVC(t, ns, name, class, size)
		createPod(t, ns, podSpec(name, diskfit.SchedulerName, name))
	}

	// Settled: every pod is either scheduled with its claim bound, or has
	// been refused by the scheduler with a per-disk reason.
	var bound, refused int
	err := wait.PollUntilContextTimeout(ctxFor(t, 4*time.Minute), time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		pvcs, err := kube.CoreV1().PersistentVolumeClaims(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		evs, err := kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "reason=FailedScheduling"})
		if err != nil {
			return false, err
		}
		refusedPods := map[string]bool{}
		for _, e := range evs.Items {
			if strings.Contains(e.Message, "largest free disk") {
				refusedPods[e.InvolvedObject.Name] = true
			}
		}
		bound, refused = 0, 0
		for _, pvc := range pvcs.Items {
			switch {
			case pvc.Status.Phase == v1.ClaimBound:
				bound++
			case refusedPods[pvc.Name] && pvc.Annotations[diskfit.SelectedNodeAnnotation] == "":
				refused++
			}
		}
		return bound+refused == pods, nil
	})
	t.Logf("%d pods for room of %d: %d bound, %d refused", pods, fit, bound, refused)
	if err != nil {
		t.Fatalf("not settled: %d bound, %d refused of %d: %v", bound, refused, pods, err)
	}
	// Exactly as many as the disks hold: no disk is overbooked, and no disk
	// has room left for one more (the refused pods could not have fit).
	// Wait for a fresh DiskNode report first: XFS frees the blocks of files
	// deleted by earlier tests in the background, so the room counted before
	// the test may have been a little low.
	time.Sleep(6 * time.Second)
	used := checkNoDiskOverbooked(t)
	for node, disks := range nodesWithClass(t, deviceClass) {
		for i, room := range disks {
			if room >= size {
				t.Errorf("node %s disk #%d still has room for a claim (%d bytes) but %d pods were refused; PVs: %v", node, i, room, refused, used)
			}
		}
	}
	if conflicts := pvcUpdateConflicts(t) - conflictsBefore; conflicts != 0 {
		t.Errorf("%d PVC updates were refused with a conflict, want 0", conflicts)
	}
}
