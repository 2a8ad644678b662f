package ledger

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/scheduler-plugin/packing"
)

// forged is a claim as a tenant can write it in their own namespace:
// selected-node and selected-disk set by hand on n1's d1, a request as large
// as the disk or larger, and class the StorageClass it names ("" for none).
func forged(uid types.UID, class string, request resource.Quantity) *v1.PersistentVolumeClaim {
	c := pvc(uid, 0, "n1", "d1")
	c.Spec.Resources.Requests[v1.ResourceStorage] = request
	c.Spec.StorageClassName = nil
	if class != "" {
		c.Spec.StorageClassName = ptr.To(class)
	}
	return c
}

// knownClasses is a ledger (TestLedgerFree's disks) that knows testClass
// and "standard", a class of another provisioner.
func knownClasses() *Ledger {
	l := newTestLedger()
	l.SetStorageClass(storageClass("standard", "rancher.io/local-path"))
	return l
}

// A claim books space only when its StorageClass exists and is provisioned
// by the diskfit driver: annotations alone, which anyone who may create a
// PVC can write, book nothing.
func TestForgedClaimsBookNothing(t *testing.T) {
	diskSize := *resource.NewQuantity(10*gi, resource.BinarySI)
	tests := []struct {
		name     string
		claim    *v1.PersistentVolumeClaim
		wantFree int64
	}{
		{name: "class that does not exist", claim: forged("f1", "no-such-class", diskSize), wantFree: 10 * gi},
		{name: "class of another provisioner", claim: forged("f2", "standard", diskSize), wantFree: 10 * gi},
		{name: "no class", claim: forged("f3", "", diskSize), wantFree: 10 * gi},
		{name: "empty class", claim: func() *v1.PersistentVolumeClaim {
			c := forged("f4", "", diskSize)
			c.Spec.StorageClassName = ptr.To("")
			return c
		}(), wantFree: 10 * gi},
		{name: "8Ei with a class that does not exist", claim: forged("f5", "no-such-class", resource.MustParse("8Ei")), wantFree: 10 * gi},
		{name: "legacy annotation naming another provisioner's class", claim: func() *v1.PersistentVolumeClaim {
			c := forged("f6", "", diskSize)
			c.Annotations[v1.BetaStorageClassAnnotation] = "standard"
			return c
		}(), wantFree: 10 * gi},
		{name: "genuine diskfit claim", claim: forged("g1", testClass, *resource.NewQuantity(6*gi, resource.BinarySI)), wantFree: 4 * gi},
		{name: "genuine diskfit claim named by the legacy annotation", claim: func() *v1.PersistentVolumeClaim {
			c := forged("g2", "", *resource.NewQuantity(6*gi, resource.BinarySI))
			c.Annotations[v1.BetaStorageClassAnnotation] = testClass
			return c
		}(), wantFree: 4 * gi},
		{name: "genuine 8Ei diskfit claim fills the disk", claim: forged("g3", testClass, resource.MustParse("8Ei")), wantFree: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := knownClasses()
			l.SetPVC(tc.claim)
			if got := freeOf(t, l, "n1", "d1"); got != tc.wantFree {
				t.Errorf("free(d1) = %d, want %d", got, tc.wantFree)
			}
			if got := freeOf(t, l, "n1", "d0"); got != 8*gi {
				t.Errorf("free(d0) = %d, want 8Gi (untouched)", got)
			}
			l.DeletePVC(tc.claim)
			if got := freeOf(t, l, "n1", "d1"); got != 10*gi {
				t.Errorf("free(d1) after the claim is deleted = %d, want 10Gi", got)
			}
		})
	}
}

// StorageClasses and claims arrive from independent informers, in any
// order, and a class may be created, deleted or replaced (its provisioner
// cannot change in place, but a client can delete and create it again)
// while claims naming it exist: the ledger re-evaluates those claims.
func TestClaimsFollowTheirStorageClass(t *testing.T) {
	size := *resource.NewQuantity(6*gi, resource.BinarySI)
	loc := diskfit.Location{Node: "n1", Disk: "d1"}

	t.Run("class created later with the diskfit provisioner: the claim starts counting", func(t *testing.T) {
		l := knownClasses()
		l.SetPVC(forged("u1", "late", size))
		if got := freeOf(t, l, "n1", "d1"); got != 10*gi {
			t.Fatalf("free before the class exists = %d, want 10Gi", got)
		}
		l.SetStorageClass(storageClass("late", diskfit.DriverName))
		if got := freeOf(t, l, "n1", "d1"); got != 4*gi {
			t.Fatalf("free once the class exists = %d, want 4Gi", got)
		}
		if released := l.DeleteStorageClass("late"); !released {
			t.Error("DeleteStorageClass released nothing, want the claim's 6Gi")
		}
		if got := freeOf(t, l, "n1", "d1"); got != 10*gi {
			t.Fatalf("free once the class is deleted = %d, want 10Gi", got)
		}
	})

	t.Run("class created later with another provisioner: the claim never counts", func(t *testing.T) {
		l := knownClasses()
		l.SetPVC(forged("u1", "late", size))
		l.SetStorageClass(storageClass("late", "other.example.com"))
		if got := freeOf(t, l, "n1", "d1"); got != 10*gi {
			t.Fatalf("free = %d, want 10Gi", got)
		}
	})

	t.Run("class replaced by one of another provisioner: the claim stops counting", func(t *testing.T) {
		l := knownClasses()
		l.SetStorageClass(storageClass("late", diskfit.DriverName))
		l.SetPVC(forged("u1", "late", size))
		if got := l.Used(loc); got != 6*gi {
			t.Fatalf("used = %d, want 6Gi", got)
		}
		if released := l.SetStorageClass(storageClass("late", "other.example.com")); !released {
			t.Error("SetStorageClass released nothing, want the claim's 6Gi")
		}
		if got := l.Used(loc); got != 0 {
			t.Fatalf("used = %d once the class is another provisioner's, want 0", got)
		}
		l.SetStorageClass(storageClass("late", diskfit.DriverName))
		if got := l.Used(loc); got != 6*gi {
			t.Fatalf("used = %d once the class is diskfit's again, want 6Gi", got)
		}
	})

	t.Run("claim deleted while its class is missing leaves nothing behind", func(t *testing.T) {
		l := knownClasses()
		c := forged("u1", "late", size)
		l.SetPVC(c)
		l.DeletePVC(c)
		l.SetStorageClass(storageClass("late", diskfit.DriverName))
		if got := l.Used(loc); got != 0 {
			t.Fatalf("used = %d, want 0", got)
		}
	})

	t.Run("claim that changes class is counted by its new class", func(t *testing.T) {
		l := knownClasses()
		c := forged("u1", "no-such-class", size)
		l.SetPVC(c)
		c = forged("u1", testClass, size)
		l.SetPVC(c)
		if got := l.Used(loc); got != 6*gi {
			t.Fatalf("used = %d, want 6Gi", got)
		}
		l.DeleteStorageClass("no-such-class")
		if got := l.Used(loc); got != 6*gi {
			t.Fatalf("used = %d after its old class went away, want 6Gi", got)
		}
	})

	t.Run("a reservation is held until the claim counts", func(t *testing.T) {
		l := knownClasses()
		claim := packing.Claim{Key: "u1", Name: "ns/claim-u1", Size: 6 * gi}
		disks, err := l.Reserve("pod1", "n1", []packing.Claim{claim}, packing.Options{})
		if err != nil {
			t.Fatal(err)
		}
		c := forged("u1", "late", size)
		c.Annotations[diskfit.SelectedDiskAnnotation] = disks[0]
		l.SetPVC(c)
		if l.Reservations() != 1 {
			t.Fatalf("reservation dropped for a claim the ledger does not count")
		}
		if got := l.Used(diskfit.Location{Node: "n1", Disk: disks[0]}); got != 6*gi {
			t.Fatalf("used = %d, want 6Gi (the reservation)", got)
		}
		l.SetStorageClass(storageClass("late", diskfit.DriverName))
		if l.Reservations() != 0 {
			t.Errorf("reservation kept once the claim counts")
		}
		if got := l.Used(diskfit.Location{Node: "n1", Disk: disks[0]}); got != 6*gi {
			t.Fatalf("used = %d, want 6Gi (the claim, once)", got)
		}
	})
}
