package ledger

import (
	"math"
	"math/big"
	"math/rand/v2"
	"testing"

	"github.com/diskfit/diskfit/apis/diskfit"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
)

// newTestLedger is the ledger of TestLedgerFree, knowing testClass: node n1 with d0 (10Gi,
// 8Gi free) and d1 (10Gi, empty).
func newTestLedger() *Ledger {
	l := newLedger()
	dn := diskNode("n1", diskStatus("d0", 10*gi, 8*gi), diskStatus("d1", 10*gi, 10*gi))
	dn.ResourceVersion = "100"
	l.SetDiskNode(dn)
	return l
}

// Byte counts come from API objects, which allow requests up to (and, for
// ClaimSize, past) the int64 range: per-disk totals must never wrap around
// into a negative "used" that makes a full disk look empty, and removing a
// claim must undo exactly what adding it did.
func TestLedgerTotalsDoNotWrap(t *testing.T) {
	const half = math.MaxInt64/2 + 1
	huge := func(uid string, q resource.Quantity) *v1.PersistentVolumeClaim {
		c := pvc(types.UID(uid), 0, "n1", "d1")
		c.Spec.Resources.Requests[v1.ResourceStorage] = q
		return c
	}
	tests := []struct {
		name   string
		claims []*v1.PersistentVolumeClaim
	}{
		{name: "two claims of MaxInt64/2+1", claims: []*v1.PersistentVolumeClaim{
			huge("u1", *resource.NewQuantity(half, resource.BinarySI)),
			huge("u2", *resource.NewQuantity(half, resource.BinarySI)),
		}},
		{name: "two 8Ei claims", claims: []*v1.PersistentVolumeClaim{
			huge("u1", resource.MustParse("8Ei")),
			huge("u2", resource.MustParse("8Ei")),
		}},
		{name: "five 4Ei claims", claims: []*v1.PersistentVolumeClaim{
			huge("u1", resource.MustParse("4Ei")), huge("u2", resource.MustParse("4Ei")),
			huge("u3", resource.MustParse("4Ei")), huge("u4", resource.MustParse("4Ei")),
			huge("u5", resource.MustParse("4Ei")),
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := newTestLedger()
			loc := diskfit.Location{Node: "n1", Disk: "d1"}
			for _, c := range tc.claims {
				l.SetPVC(c)
				if used := l.Used(loc); used < 0 {
					t.Fatalf("used = %d after %s, want never negative", used, c.Name)
				}
				if free := freeOf(t, l, "n1", "d1"); free != 0 {
					t.Fatalf("free = %d after %s, want 0", free, c.Name)
				}
			}
			if used := l.Used(loc); used != math.MaxInt64 {
				t.Errorf("used = %d, want MaxInt64 (saturated)", used)
			}
			// Taking claims away again, one at a time: the disk stays
			// full while any of them is left, and is empty after the last.
			for i, c := range tc.claims {
				l.DeletePVC(c)
				free := freeOf(t, l, "n1", "d1")
				if i < len(tc.claims)-1 && free != 0 {
					t.Fatalf("free = %d with %d huge claims left, want 0", free, len(tc.claims)-1-i)
				}
				if i == len(tc.claims)-1 && free != 10*gi {
					t.Fatalf("free = %d Gi after the last claim is gone, want 10 Gi", free/gi)
				}
			}
			if used := l.Used(loc); used != 0 {
				t.Errorf("used = %d after every claim is gone, want 0", used)
			}
		})
	}

	t.Run("huge PV on top of a huge claim", func(t *testing.T) {
		l := newTestLedger()
		l.SetPVC(huge("u1", resource.MustParse("8Ei")))
		l.SetPV(pv("pv2", "n1", "d1", math.MaxInt64, "u2"))
		if free := freeOf(t, l, "n1", "d1"); free != 0 {
			t.Fatalf("free = %d, want 0", free)
		}
		l.DeletePV("pv2")
		if free := freeOf(t, l, "n1", "d1"); free != 0 {
			t.Fatalf("free = %d with an 8Ei claim left, want 0", free)
		}
	})

	t.Run("a PV capacity beyond int64 books the whole range", func(t *testing.T) {
		l := newTestLedger()
		p := pv("pv1", "n1", "d1", 0, "u1")
		p.Spec.Capacity[v1.ResourceStorage] = resource.MustParse("1e100")
		l.SetPV(p)
		if free := freeOf(t, l, "n1", "d1"); free != 0 {
			t.Fatalf("free = %d, want 0", free)
		}
	})

	t.Run("a DiskNode reporting absurd numbers gives no negative free", func(t *testing.T) {
		l := newTestLedger()
		dn := diskNode("n1", diskStatus("d0", math.MinInt64, -gi), diskStatus("d1", math.MaxInt64, math.MaxInt64))
		dn.ResourceVersion = "200"
		l.SetDiskNode(dn)
		l.SetPVC(pvc("u1", gi, "n1", "d0"))
		l.SetPVC(pvc("u2", gi, "n1", "d1"))
		if free := freeOf(t, l, "n1", "d0"); free != 0 {
			t.Errorf("free(d0) = %d, want 0", free)
		}
		if free := freeOf(t, l, "n1", "d1"); free != math.MaxInt64-gi {
			t.Errorf("free(d1) = %d, want MaxInt64-1Gi", free)
		}
	})
}

// TestTotalIsExact adds and takes away random byte counts, many of them at
// the ends of the int64 range, and compares the ledger's per-disk total
// with an arbitrary-precision sum.
func TestTotalIsExact(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	values := []int64{0, 1, gi, math.MaxInt64, math.MaxInt64 - 1, math.MaxInt64/2 + 1}
	for round := 0; round < 200; round++ {
		var got total
		want := new(big.Int)
		var added []int64
		for step := 0; step < 50; step++ {
			if len(added) > 0 && r.IntN(3) == 0 {
				i := r.IntN(len(added))
				v := added[i]
				added = append(added[:i], added[i+1:]...)
				got.add(-v)
				want.Sub(want, big.NewInt(v))
			} else {
				v := values[r.IntN(len(values))]
				if r.IntN(4) == 0 {
					v = r.Int64()
				}
				added = append(added, v)
				got.add(v)
				want.Add(want, big.NewInt(v))
			}
			wantValue := int64(math.MaxInt64)
			if want.IsInt64() {
				wantValue = want.Int64()
			}
			if got.value() != wantValue {
				t.Fatalf("round %d step %d: value %d, want %s (clamped %d)", round, step, got.value(), want, wantValue)
			}
			if got.zero() != (want.Sign() == 0) {
				t.Fatalf("round %d step %d: zero() = %v for %s", round, step, got.zero(), want)
			}
		}
	}
	var neg total
	neg.add(-5)
	if neg.value() != -5 {
		t.Errorf("value of -5 = %d", neg.value())
	}
	neg.add(math.MinInt64 + 5)
	neg.add(-1)
	if neg.value() != math.MinInt64 {
		t.Errorf("value below MinInt64 = %d, want MinInt64", neg.value())
	}
}
