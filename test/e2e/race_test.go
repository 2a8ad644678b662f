package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/diskfit/diskfit/apis/diskfit"
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
	used := pvBytesPerDisk(t)
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

// claimsThatFit is how many claims of size the disks of deviceClass hold.
func claimsThatFit(t *testing.T, deviceClass string, size int64) int {
	t.Helper()
	fit := 0
	for _, disks := range nodesWithClass(t, deviceClass) {
		for _, room := range disks {
			fit += int(room / size)
		}
	}
	return fit
}

// checkFull asserts that no disk of deviceClass is overbooked and that none
// has room left for one more claim of size: the refused pods could not have
// fit. It waits for a fresh DiskNode report first: XFS frees the blocks of
// files deleted by earlier tests in the background, so the room counted
// before a test may have been a little low.
func checkFull(t *testing.T, deviceClass string, size int64, refused int) {
	t.Helper()
	time.Sleep(6 * time.Second)
	used := pvBytesPerDisk(t)
	for node, disks := range nodesWithClass(t, deviceClass) {
		for i, room := range disks {
			if room >= size {
				t.Errorf("node %s disk #%d still has room for a claim (%d bytes) but %d pods were refused; PVs: %v", node, i, room, refused, used)
			}
		}
	}
}

// Fifty pods created at once compete for the last space of one node's disks:
// the ledger must let exactly as many through as the disks hold, never
// overbook a disk, and leave the rest Pending with a per-disk reason.
func TestRaceForLastSpaceNeverOverbooks(t *testing.T) {
	const deviceClass = "nvme"
	free := nodesWithClass(t, deviceClass)
	if len(free) != 1 {
		t.Skipf("needs exactly one node with %s disks, as the local cluster has; this cluster has %d", deviceClass, len(free))
	}
	const size = 300 * mi
	fit := claimsThatFit(t, deviceClass, size)
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

	podClaims := map[string][]string{}
	for i := range pods {
		name := fmt.Sprintf("r%02d", i)
		podClaims[name] = []string{name}
	}
	boundPods, refusedPods := settle(t, ns, podClaims, 3*time.Minute)
	bound, refused := len(boundPods), len(refusedPods)
	t.Logf("%d pods for room of %d: %d bound, %d refused", pods, fit, bound, refused)
	// Exactly as many as the disks hold.
	checkFull(t, deviceClass, size, refused)
	checkSchedulerKeptItsPromise(t, ns)
	if conflicts := pvcUpdateConflicts(t) - conflictsBefore; conflicts != 0 {
		t.Errorf("%d PVC updates were refused with a conflict, want 0", conflicts)
	}
}

// The ledger is beaten: the scheduler places claims on disks, then, before
// the volumes are made, space on those disks is taken behind its back (the
// node's external-provisioner is paused meanwhile, so the window is not left
// to chance). The claims that no longer fit go back to the scheduler, and in
// the end every pod that can fit is placed, the rest wait with a per-disk
// reason, and no disk is overbooked.
func TestRaceWithSpaceTakenBehindTheSchedulersBack(t *testing.T) {
	needLocal(t)
	const deviceClass, node, size = "nvme", "node-a", 300 * mi
	ns := newNamespace(t)
	class := newStorageClass(t, deviceClass)
	// VolumeBinding needs the class's CSIStorageCapacity, which the paused
	// provisioner could not publish.
	waitForCapacity(t, class, node)
	resume := pauseProvisioner(t, node)
	pods := createPods(t, ns, class, "b", 24, size)

	// Wait until the scheduler has given a disk to as many claims as it can.
	var placed int
	err := wait.PollUntilContextTimeout(ctxFor(t, time.Minute), time.Second, 50*time.Second, true, func(ctx context.Context) (bool, error) {
		pvcs, err := kube.CoreV1().PersistentVolumeClaims(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		n := 0
		for _, pvc := range pvcs.Items {
			if pvc.Annotations[diskfit.SelectedDiskAnnotation] != "" && pvc.Annotations[diskfit.SelectedNodeAnnotation] != "" {
				n++
			}
		}
		stable := n == placed && n > 0
		placed = n
		return stable, nil
	})
	if err != nil {
		t.Fatalf("claims not placed: %v", err)
	}
	t.Logf("scheduler placed %d claims; taking 3 claims' worth of space on each disk", placed)
	for _, disk := range []string{"nvme0", "nvme1"} {
		takeSpace(t, node, disk, 3*size)
	}
	resume()

	bound, refused := settle(t, ns, pods, 3*time.Minute)
	t.Logf("%d pods bound, %d refused", len(bound), len(refused))
	exhausted := 0
	evs, err := kube.CoreV1().Events(ns).List(ctxFor(t, time.Minute), metav1.ListOptions{FieldSelector: "reason=ProvisioningFailed"})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs.Items {
		if strings.Contains(e.Message, "ResourceExhausted") {
			exhausted += int(max(e.Count, 1))
		}
	}
	// Usually the driver refuses the claims whose space was taken and the
	// provisioner sends them back; the scheduler may also notice first, from
	// a fresh DiskNode report, and place them again itself. Either way the
	// end state below must hold. (TestNonlinearDisksFoolOnlyTheDefaultScheduler
	// always goes through ResourceExhausted.)
	t.Logf("%d ResourceExhausted answers sent pods back to the scheduler", exhausted)
	if len(refused) == 0 {
		t.Fatalf("every pod fit; the test needs more pods than room")
	}
	time.Sleep(6 * time.Second) // a fresh DiskNode report
	// ResourceExhausted is expected here: the space went behind the
	// scheduler's back. Its reservations must still all be gone.
	checkNoReservationHeld(t)
	used := pvBytesPerDisk(t)
	for n, disks := range nodesWithClass(t, deviceClass) {
		for i, room := range disks {
			if room >= size {
				t.Errorf("node %s disk #%d has room for another claim (%d bytes) while %d pods wait; PVs: %v", n, i, room, len(refused), used)
			}
		}
	}
}
