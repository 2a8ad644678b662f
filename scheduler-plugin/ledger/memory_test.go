package ledger

import (
	"fmt"
	"runtime"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
)

// BenchmarkLedgerMemory reports the heap the ledger itself holds for the
// cluster of the scheduler memory benchmark (docs/benchmarks.md, "Scheduler
// memory"): 5,000 nodes of 8 disks and 20,000 bound PVs with their PVCs.
// The API objects are made before the measurement and are not counted:
// in the scheduler they belong to the informers.
func BenchmarkLedgerMemory(b *testing.B) {
	const nodes, disks, volumes = 5000, 8, 20000
	dns := make([]*v1alpha1.DiskNode, nodes)
	for i := range dns {
		statuses := make([]v1alpha1.DiskStatus, disks)
		for d := range statuses {
			statuses[d] = diskStatus(fmt.Sprintf("disk-%d", d), 1<<40, 1<<40)
		}
		dns[i] = diskNode(fmt.Sprintf("node-%d", i), statuses...)
	}
	pvs := make([]*v1.PersistentVolume, volumes)
	for i := range pvs {
		uid := types.UID(fmt.Sprintf("5e1d0c8a-0000-4000-8000-%012d", i))
		// A bound claim: its PV counts, the PVC only names it.
		pvs[i] = pv("pvc-"+string(uid), fmt.Sprintf("node-%d", i%nodes), fmt.Sprintf("disk-%d", i%disks), 10*gi, uid)
	}
	var heap float64
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		l := New()
		for _, dn := range dns {
			l.SetDiskNode(dn)
		}
		for _, p := range pvs {
			l.SetPV(p)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		heap = float64(after.HeapInuse) - float64(before.HeapInuse)
		runtime.KeepAlive(l)
	}
	b.ReportMetric(heap/(1<<20), "MiB")
}
