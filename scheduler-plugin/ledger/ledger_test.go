package ledger

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
	"github.com/diskfit/diskfit/scheduler-plugin/packing"
)

const gi = int64(1) << 30

// testClass is the StorageClass of the test claims, provisioned by the
// diskfit driver; newLedger knows it.
const testClass = "diskfit"

func storageClass(name, provisioner string) *storagev1.StorageClass {
	return &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: provisioner}
}

// newLedger is an empty ledger that knows testClass.
func newLedger() *Ledger {
	l := New()
	l.SetStorageClass(storageClass(testClass, diskfit.DriverName))
	return l
}

func diskNode(node string, disks ...v1alpha1.DiskStatus) *v1alpha1.DiskNode {
	return &v1alpha1.DiskNode{
		ObjectMeta: metav1.ObjectMeta{Name: node},
		Status:     v1alpha1.DiskNodeStatus{Disks: disks, ObservedTime: metav1.Now()},
	}
}

func diskStatus(name string, capacity, free int64) v1alpha1.DiskStatus {
	return v1alpha1.DiskStatus{Name: name, Backend: v1alpha1.BackendFile, CapacityBytes: capacity, FreeBytes: free, Healthy: true}
}

func pv(name, node, disk string, size int64, claimUID types.UID) *v1.PersistentVolume {
	p := &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1.PersistentVolumeSpec{
			Capacity: v1.ResourceList{v1.ResourceStorage: *resource.NewQuantity(size, resource.BinarySI)},
			PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{
				Driver:           diskfit.DriverName,
				VolumeHandle:     name,
				VolumeAttributes: map[string]string{diskfit.VolumeContextDiskKey: disk},
			}},
			NodeAffinity: &v1.VolumeNodeAffinity{Required: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
				MatchExpressions: []v1.NodeSelectorRequirement{{Key: diskfit.TopologyKey, Operator: v1.NodeSelectorOpIn, Values: []string{node}}},
			}}}},
		},
	}
	if claimUID != "" {
		p.Spec.ClaimRef = &v1.ObjectReference{Namespace: "ns", Name: "claim-" + string(claimUID), UID: claimUID}
	}
	return p
}

func pvc(uid types.UID, size int64, node, disk string) *v1.PersistentVolumeClaim {
	c := &v1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "claim-" + string(uid), UID: uid, Annotations: map[string]string{}},
		Spec: v1.PersistentVolumeClaimSpec{
			StorageClassName: ptr.To(testClass),
			Resources: v1.VolumeResourceRequirements{
				Requests: v1.ResourceList{v1.ResourceStorage: *resource.NewQuantity(size, resource.BinarySI)},
			},
		},
	}
	if node != "" {
		c.Annotations[diskfit.SelectedNodeAnnotation] = node
	}
	if disk != "" {
		c.Annotations[diskfit.SelectedDiskAnnotation] = disk
	}
	return c
}

func freeOf(t *testing.T, l *Ledger, node, disk string) int64 {
	t.Helper()
	disks, _ := l.Disks(node, nil)
	for _, d := range disks {
		if d.Name == disk {
			return d.Free
		}
	}
	t.Fatalf("node %s has no disk %s", node, disk)
	return 0
}

func TestLedgerFree(t *testing.T) {
	tests := []struct {
		name     string
		apply    func(l *Ledger)
		wantFree map[string]int64 // disk on n1 -> free
	}{
		{
			name:     "reported free when nothing else is known",
			apply:    func(l *Ledger) {},
			wantFree: map[string]int64{"d0": 8 * gi, "d1": 10 * gi},
		},
		{
			name: "PVs reduce free below capacity even when the report lags",
			apply: func(l *Ledger) {
				l.SetPV(pv("pv1", "n1", "d1", 4*gi, "u1"))
				l.SetPV(pv("pv2", "n1", "d1", 3*gi, ""))
			},
			wantFree: map[string]int64{"d0": 8 * gi, "d1": 3 * gi},
		},
		{
			name: "reported free wins when it is lower",
			apply: func(l *Ledger) {
				l.SetPV(pv("pv1", "n1", "d0", gi, "u1"))
			},
			// capacity 10 - 1 = 9 > reported 8.
			wantFree: map[string]int64{"d0": 8 * gi, "d1": 10 * gi},
		},
		{
			name: "PVs of other drivers and other nodes are ignored",
			apply: func(l *Ledger) {
				other := pv("pv1", "n1", "d1", 4*gi, "u1")
				other.Spec.CSI.Driver = "other.example.com"
				l.SetPV(other)
				l.SetPV(pv("pv2", "n2", "d1", 4*gi, "u2"))
			},
			wantFree: map[string]int64{"d0": 8 * gi, "d1": 10 * gi},
		},
		{
			name: "unbound PVC annotated with node and disk counts",
			apply: func(l *Ledger) {
				l.SetPVC(pvc("u1", 6*gi, "n1", "d1"))
			},
			wantFree: map[string]int64{"d0": 8 * gi, "d1": 4 * gi},
		},
		{
			name: "PVC whose selected-node was removed no longer counts",
			apply: func(l *Ledger) {
				l.SetPVC(pvc("u1", 6*gi, "n1", "d1"))
				l.SetPVC(pvc("u1", 6*gi, "", "d1"))
			},
			wantFree: map[string]int64{"d0": 8 * gi, "d1": 10 * gi},
		},
		{
			// The report already shows the 6Gi volume (capacity = free +
			// volumes) but its PV does not exist yet: the claim still
			// counts as pending, and must not be taken off the reported
			// free a second time.
			name: "volume in the report before its PV is counted once",
			apply: func(l *Ledger) {
				dn := diskNode("n1", diskStatus("d0", 10*gi, 8*gi), diskStatus("d1", 10*gi, 4*gi))
				dn.ResourceVersion = "200"
				l.SetDiskNode(dn)
				l.SetPVC(pvc("u1", 6*gi, "n1", "d1"))
			},
			wantFree: map[string]int64{"d0": 8 * gi, "d1": 4 * gi},
		},
		{
			name: "PVC and its PV are counted once",
			apply: func(l *Ledger) {
				l.SetPVC(pvc("u1", 6*gi, "n1", "d1"))
				l.SetPV(pv("pv1", "n1", "d1", 6*gi, "u1"))
			},
			wantFree: map[string]int64{"d0": 8 * gi, "d1": 4 * gi},
		},
		{
			name: "bound PVC counts through its PV only",
			apply: func(l *Ledger) {
				c := pvc("u1", 6*gi, "n1", "d1")
				c.Spec.VolumeName = "pv1"
				l.SetPVC(c)
			},
			wantFree: map[string]int64{"d0": 8 * gi, "d1": 10 * gi},
		},
		{
			name: "deleted PV releases its space",
			apply: func(l *Ledger) {
				l.SetPV(pv("pv1", "n1", "d1", 4*gi, "u1"))
				l.DeletePV("pv1")
			},
			wantFree: map[string]int64{"d0": 8 * gi, "d1": 10 * gi},
		},
		{
			name: "deleted PVC releases its space",
			apply: func(l *Ledger) {
				c := pvc("u1", 6*gi, "n1", "d1")
				l.SetPVC(c)
				l.DeletePVC(c)
			},
			wantFree: map[string]int64{"d0": 8 * gi, "d1": 10 * gi},
		},
		{
			name: "PVs recorded before the DiskNode are kept",
			apply: func(l *Ledger) {
				l.DeleteDiskNode("n1")
				l.SetPV(pv("pv1", "n1", "d1", 4*gi, "u1"))
				dn := diskNode("n1", diskStatus("d0", 10*gi, 8*gi), diskStatus("d1", 10*gi, 10*gi))
				dn.ResourceVersion = "200"
				l.SetDiskNode(dn)
			},
			wantFree: map[string]int64{"d0": 8 * gi, "d1": 6 * gi},
		},
		{
			name: "an older DiskNode does not overwrite a newer one",
			apply: func(l *Ledger) {
				old := diskNode("n1", diskStatus("d0", 10*gi, gi), diskStatus("d1", 10*gi, gi))
				old.ResourceVersion = "50"
				l.SetDiskNode(old)
			},
			wantFree: map[string]int64{"d0": 8 * gi, "d1": 10 * gi},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := newLedger()
			dn := diskNode("n1", diskStatus("d0", 10*gi, 8*gi), diskStatus("d1", 10*gi, 10*gi))
			dn.ResourceVersion = "100"
			l.SetDiskNode(dn)
			tc.apply(l)
			for disk, want := range tc.wantFree {
				if got := freeOf(t, l, "n1", disk); got != want {
					t.Errorf("free(%s) = %d Gi, want %d Gi", disk, got/gi, want/gi)
				}
			}
		})
	}
}

func TestLedgerReserve(t *testing.T) {
	twoDisks := func() *Ledger {
		l := newLedger()
		// Empty disks: the driver publishes capacity as free space plus
		// its volumes' space, so with no volumes the two are equal.
		l.SetDiskNode(diskNode("n1", diskStatus("d0", 4*gi, 4*gi), diskStatus("d1", 4*gi, 4*gi)))
		return l
	}
	claim := func(key string, size int64) packing.Claim {
		return packing.Claim{Key: key, Name: "ns/" + key, Size: size}
	}

	t.Run("reservation holds space and a second pod cannot take it", func(t *testing.T) {
		l := twoDisks()
		disks, err := l.Reserve("pod1", "n1", []packing.Claim{claim("u1", 3*gi), claim("u2", 3*gi)}, packing.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if disks[0] == disks[1] {
			t.Fatalf("both 3Gi claims on %s", disks[0])
		}
		_, err = l.Reserve("pod2", "n1", []packing.Claim{claim("u3", 2*gi)}, packing.Options{})
		var noFit *ErrDoesNotFit
		if !errors.As(err, &noFit) {
			t.Fatalf("second reservation: got %v, want ErrDoesNotFit", err)
		}
		if l.Reservations() != 1 {
			t.Errorf("Reservations() = %d, want 1", l.Reservations())
		}
	})

	t.Run("Unreserve releases and is idempotent", func(t *testing.T) {
		l := twoDisks()
		if _, err := l.Reserve("pod1", "n1", []packing.Claim{claim("u1", 3*gi)}, packing.Options{}); err != nil {
			t.Fatal(err)
		}
		l.Unreserve("pod1")
		l.Unreserve("pod1")
		if got := freeOf(t, l, "n1", "d0") + freeOf(t, l, "n1", "d1"); got != 8*gi {
			t.Errorf("free after Unreserve = %d Gi, want 8 Gi", got/gi)
		}
		if l.Reservations() != 0 {
			t.Errorf("Reservations() = %d, want 0", l.Reservations())
		}
	})

	t.Run("annotated PVC replaces the reservation without double counting", func(t *testing.T) {
		l := twoDisks()
		disks, err := l.Reserve("pod1", "n1", []packing.Claim{claim("u1", 3*gi)}, packing.Options{})
		if err != nil {
			t.Fatal(err)
		}
		l.SetPVC(pvc("u1", 3*gi, "n1", disks[0]))
		if l.Reservations() != 0 {
			t.Errorf("reservation kept after the PVC showed it")
		}
		if got := l.Used(diskfit.Location{Node: "n1", Disk: disks[0]}); got != 3*gi {
			t.Errorf("used = %d Gi, want 3 Gi", got/gi)
		}
		// A late Unreserve must not release the PVC's space.
		l.Unreserve("pod1")
		if got := l.Used(diskfit.Location{Node: "n1", Disk: disks[0]}); got != 3*gi {
			t.Errorf("used after late Unreserve = %d Gi, want 3 Gi", got/gi)
		}
	})

	t.Run("ReservedDisk reports the pod's own reservation on that node only", func(t *testing.T) {
		l := twoDisks()
		disks, err := l.Reserve("pod1", "n1", []packing.Claim{claim("u1", 3*gi)}, packing.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if got, ok := l.ReservedDisk("pod1", "n1", "u1"); !ok || got != disks[0] {
			t.Errorf("ReservedDisk = %q, %v; want %q", got, ok, disks[0])
		}
		if _, ok := l.ReservedDisk("pod2", "n1", "u1"); ok {
			t.Error("another pod sees the reservation")
		}
		if _, ok := l.ReservedDisk("pod1", "n2", "u1"); ok {
			t.Error("reservation reported for another node")
		}
	})

	t.Run("Reservation reports the free space each claim found on its disk", func(t *testing.T) {
		l := twoDisks()
		// d0 already holds 1Gi of another pod.
		if _, err := l.Reserve("pod0", "n1", []packing.Claim{claim("u0", gi)}, packing.Options{}); err != nil {
			t.Fatal(err)
		}
		// MostAllocated best fit: 2Gi and then 1Gi both fill the fuller disk.
		disks, err := l.Reserve("pod1", "n1", []packing.Claim{claim("u1", 2*gi), claim("u2", gi)}, packing.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if disks[0] != disks[1] {
			t.Fatalf("claims on %v, want both on one disk", disks)
		}
		for _, want := range []struct {
			key  string
			free int64
		}{{"u1", 3 * gi}, {"u2", gi}} {
			got, ok := l.Reservation("pod1", "n1", want.key)
			if !ok || got.Disk != disks[0] || got.FreeBefore != want.free {
				t.Errorf("Reservation(%s) = %+v, %v; want disk %s with %d Gi free before", want.key, got, ok, disks[0], want.free/gi)
			}
		}
	})

	t.Run("a second Reserve of the same pod replaces the first", func(t *testing.T) {
		l := twoDisks()
		if _, err := l.Reserve("pod1", "n1", []packing.Claim{claim("u1", 4*gi)}, packing.Options{}); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Reserve("pod1", "n1", []packing.Claim{claim("u1", 4*gi), claim("u2", 4*gi)}, packing.Options{}); err != nil {
			t.Fatalf("re-reserve: %v", err)
		}
	})

	t.Run("stale observed time is reported", func(t *testing.T) {
		l := newLedger()
		dn := diskNode("n1", diskStatus("d0", 10*gi, 4*gi))
		dn.Status.ObservedTime = metav1.NewTime(time.Unix(1000, 0))
		l.SetDiskNode(dn)
		_, info := l.Disks("n1", nil)
		if !info.HasDiskNode || !info.Observed.Equal(time.Unix(1000, 0)) {
			t.Errorf("NodeInfo = %+v", info)
		}
		_, info = l.Disks("n2", nil)
		if info.HasDiskNode {
			t.Error("unknown node reported with a DiskNode")
		}
	})
}

// TestLedgerDisksNoAlloc guards the Filter hot path.
func TestLedgerDisksNoAlloc(t *testing.T) {
	l := newLedger()
	l.SetDiskNode(diskNode("n1", diskStatus("d0", 10*gi, 4*gi), diskStatus("d1", 10*gi, 4*gi)))
	var buf [packing.MaxInlineDisks]packing.Disk
	allocs := testing.AllocsPerRun(100, func() {
		_, _ = l.Disks("n1", buf[:0])
	})
	if allocs != 0 {
		t.Errorf("Disks allocates %v times per call", allocs)
	}
}

// TestLedgerConcurrentReserve races 50 pods for a node with room for 10 of
// them, with informer updates arriving at the same time: no disk may ever
// hold more than it has.
func TestLedgerConcurrentReserve(t *testing.T) {
	l := newLedger()
	l.SetDiskNode(diskNode("n1", diskStatus("d0", 5*gi, 5*gi), diskStatus("d1", 5*gi, 5*gi)))
	const pods = 50
	var wg sync.WaitGroup
	won := make(chan string, pods)
	for i := 0; i < pods; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pod := types.UID(fmt.Sprintf("pod%d", i))
			claim := packing.Claim{Key: fmt.Sprintf("pvc%d", i), Size: gi}
			disks, err := l.Reserve(pod, "n1", []packing.Claim{claim}, packing.Options{})
			if err != nil {
				return
			}
			// Half of the winners' PVCs become visible while others race.
			if i%2 == 0 {
				l.SetPVC(pvc(types.UID(claim.Key), gi, "n1", disks[0]))
			}
			won <- disks[0]
		}()
	}
	wg.Wait()
	close(won)
	perDisk := map[string]int{}
	for d := range won {
		perDisk[d]++
	}
	if perDisk["d0"] != 5 || perDisk["d1"] != 5 {
		t.Errorf("placements per disk %v, want exactly 5 on each", perDisk)
	}
	for _, d := range []string{"d0", "d1"} {
		if used := l.Used(diskfit.Location{Node: "n1", Disk: d}); used != 5*gi {
			t.Errorf("%s used %d Gi, want 5", d, used/gi)
		}
		if free := freeOf(t, l, "n1", d); free != 0 {
			t.Errorf("%s free %d, want 0", d, free)
		}
	}
}

// A disk name that no DiskNode can hold places nothing: the claim is
// placed again (and its annotation overwritten) instead of being counted
// against a disk that does not exist (found by FuzzPVCLocation).
func TestLocationsNeedWellFormedDisk(t *testing.T) {
	for _, disk := range []string{"", "../x", "NVMe0", "a..b", "a/b", "nvme0\x00"} {
		if loc, ok := diskfit.PVCLocation(pvc("u", gi, "node-a", disk)); ok {
			t.Errorf("PVCLocation with disk %q = %+v, want not placed", disk, loc)
		}
		if loc, ok := diskfit.PVLocation(pv("pv", "node-a", disk, gi, "u")); ok {
			t.Errorf("PVLocation with disk %q = %+v, want none", disk, loc)
		}
	}
	if loc, ok := diskfit.PVCLocation(pvc("u", gi, "node-a", "nvme0")); !ok || loc != (diskfit.Location{Node: "node-a", Disk: "nvme0"}) {
		t.Errorf("PVCLocation = %+v, %v, want node-a/nvme0", loc, ok)
	}
	if loc, ok := diskfit.PVLocation(pv("pv", "node-a", "ssd.1", gi, "u")); !ok || loc != (diskfit.Location{Node: "node-a", Disk: "ssd.1"}) {
		t.Errorf("PVLocation = %+v, %v, want node-a/ssd.1", loc, ok)
	}
}

// Requests too large for int64 used to be booked as a few MiB: 1e100's
// Value is 0, and 8Ei rounded up wrapped around (FuzzPVCLocation).
func TestClaimSizeBeyondInt64(t *testing.T) {
	tests := []struct {
		name    string
		request resource.Quantity
		want    int64
	}{
		{name: "10Gi", request: resource.MustParse("10Gi"), want: 10 * gi},
		{name: "max int64", request: *resource.NewQuantity(math.MaxInt64, resource.BinarySI), want: math.MaxInt64},
		{name: "8Ei", request: resource.MustParse("8Ei"), want: math.MaxInt64},
		{name: "1e100", request: resource.MustParse("1e100"), want: math.MaxInt64},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := pvc("u", 0, "", "")
			c.Spec.Resources.Requests[v1.ResourceStorage] = tt.request
			if got := ClaimSize(c); got != tt.want {
				t.Fatalf("ClaimSize(%s) = %d, want %d", tt.name, got, tt.want)
			}
		})
	}
}

// boundPVC is claim uid bound to PV name, with the size its volume has
// (status.capacity) and the size it asks for.
func boundPVC(uid types.UID, pvName string, has, asks int64) *v1.PersistentVolumeClaim {
	c := pvc(uid, asks, "", "")
	c.Spec.VolumeName = pvName
	c.Status.Phase = v1.ClaimBound
	c.Status.Capacity = v1.ResourceList{v1.ResourceStorage: *resource.NewQuantity(has, resource.BinarySI)}
	return c
}

// A growth the node may grant is booked whatever the ledger's order: the
// kubelet retries NodeExpandVolume whenever it may, and the node grants it
// as soon as the disk has room. And a volume the node has grown already
// (its claim's status.capacity not updated yet, which for an ext4 that
// cannot grow online lasts until the pod restarts) is counted at its new
// size, so a claim pending on the disk is not forgotten.
func TestExpansionTheNodeMayGrantIsBooked(t *testing.T) {
	l := newLedger()
	// 10Gi: a and b hold 1Gi each, 8Gi is free; a asks +4Gi, b +7Gi.
	l.SetDiskNode(diskNode("n1", diskStatus("d0", 10*gi, 8*gi)))
	l.SetPVC(boundPVC("a", "pv-a", gi, 5*gi))
	l.SetPV(pv("pv-a", "n1", "d0", 5*gi, "a"))
	l.SetPVC(boundPVC("b", "pv-b", gi, 8*gi))
	l.SetPV(pv("pv-b", "n1", "d0", 8*gi, "b"))
	if got := freeOf(t, l, "n1", "d0"); got > gi {
		t.Errorf("free %d with growths of 4Gi and 7Gi the node may grant, want at most %d", got, gi)
	}

	l = newLedger()
	// c grew from 1Gi to 8Gi on the node: 2Gi is free. q, 2Gi, is
	// scheduled there and not made yet.
	l.SetDiskNode(diskNode("n1", diskStatus("d0", 10*gi, 2*gi)))
	l.SetPVC(boundPVC("c", "pv-c", gi, 8*gi))
	l.SetPV(pv("pv-c", "n1", "d0", 8*gi, "c"))
	l.SetPVC(pvc("q", 2*gi, "n1", "d0"))
	if got := freeOf(t, l, "n1", "d0"); got != 0 {
		t.Errorf("free %d with a grown volume and a 2Gi claim pending, want 0", got)
	}
}

// An expansion is in the PV before the node grows the volume
// (external-resizer writes the request there; the kubelet's
// NodeExpandVolume grows it and then the claim's status.capacity). The
// growth is booked only while the disk has room for it: an expansion the
// disk cannot hold (a typo, or a tenant's 8Ei) would otherwise keep every
// other claim off a nearly empty disk for as long as the claim asks.
// Growths the disk could grant are booked, in any order of events.
func TestExpansionBooksOnlyWhatFits(t *testing.T) {
	const huge = int64(math.MaxInt64)
	for _, order := range []string{"claims first", "PVs first"} {
		t.Run(order, func(t *testing.T) {
			l := newLedger()
			l.SetDiskNode(diskNode("n1", diskStatus("d0", 10*gi, 7*gi)))
			objs := []func(){
				func() { l.SetPVC(boundPVC("a", "pv-a", gi, huge)) },
				func() { l.SetPVC(boundPVC("b", "pv-b", gi, 3*gi)) },
				func() { l.SetPVC(boundPVC("c", "pv-c", gi, 6*gi)) },
			}
			pvs := []func(){
				func() { l.SetPV(pv("pv-a", "n1", "d0", huge, "a")) },
				func() { l.SetPV(pv("pv-b", "n1", "d0", 3*gi, "b")) },
				func() { l.SetPV(pv("pv-c", "n1", "d0", 6*gi, "c")) },
			}
			if order == "PVs first" {
				objs, pvs = pvs, objs
			}
			for _, f := range append(objs, pvs...) {
				f()
			}
			// 3Gi held by the three volumes, 7Gi free: b's 2Gi and c's
			// 5Gi growths may be granted, a's never.
			if got := freeOf(t, l, "n1", "d0"); got != 0 {
				t.Errorf("free %d, want 0: the two growths that fit are booked", got)
			}
			// c's owner lowers the request back; the resizer writes it
			// into the PV.
			l.SetPV(pv("pv-c", "n1", "d0", gi, "c"))
			if got := freeOf(t, l, "n1", "d0"); got != 5*gi {
				t.Errorf("free %d, want %d: an 8Ei expansion books nothing", got, 5*gi)
			}
			// The node grows b; the kubelet records its new size.
			l.SetPVC(boundPVC("b", "pv-b", 3*gi, 3*gi))
			l.SetDiskNode(diskNode("n1", diskStatus("d0", 10*gi, 5*gi)))
			if got := freeOf(t, l, "n1", "d0"); got != 5*gi {
				t.Errorf("free %d after b grew, want %d", got, 5*gi)
			}
		})
	}
}
