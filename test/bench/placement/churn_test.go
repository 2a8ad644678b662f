package main

import (
	"strings"
	"testing"

	"github.com/diskfit/diskfit/scheduler-plugin/packing"
)

// smallChurn is the churn the tests run: small enough for seconds, long
// enough for deletions to leave holes.
func smallChurn(seed uint64) *ChurnScript {
	return GenerateChurn(ChurnConfig{Nodes: 30, Cycles: 3, Load: 1.2, SamplesPerCycle: 2, Seed: seed})
}

// TestChurnDiskFitPromises holds DiskFit to what the churn benchmark
// reports: never a ResourceExhausted, a reschedule or a stranded byte, at
// least churnFloor of the bound at every sample, and never fewer bytes than
// a model of the default scheduler at the end.
func TestChurnDiskFitPromises(t *testing.T) {
	for _, seed := range []uint64{1, 2} {
		sc := smallChurn(seed)
		results := runAllChurn(sc, Options{MaxReschedules: 10, Seed: seed})
		df := results[0]
		if !strings.HasPrefix(df.Model, "DiskFit (MostAllocated, default)") {
			t.Fatalf("first model is %q, want the default DiskFit", df.Model)
		}
		if df.ResourceExhausted != 0 || df.Reschedules != 0 {
			t.Errorf("seed %d: DiskFit made %d ResourceExhausted, %d reschedules; want none", seed, df.ResourceExhausted, df.Reschedules)
		}
		for i, s := range df.Samples {
			ratio := float64(s.Placed) / float64(s.Bound)
			if s.Stranded != 0 {
				t.Errorf("seed %d, cycle %g: DiskFit strands %d bytes", seed, s.Cycles, s.Stranded)
			}
			if ratio < churnFloor {
				t.Errorf("seed %d, sample %d (cycle %g): DiskFit holds %.2f%% of the bound, want at least %.0f%%", seed, i, s.Cycles, 100*ratio, 100*churnFloor)
			}
		}
		end := df.Samples[len(df.Samples)-1]
		for _, r := range results[3:] {
			if o := r.Samples[len(r.Samples)-1]; o.Placed > end.Placed {
				t.Errorf("seed %d: %s ends with %d bytes placed, DiskFit with %d", seed, r.Model, o.Placed, end.Placed)
			}
		}
	}
}

// churnFloor is the share of the bound DiskFit keeps at every sample of the
// tests' 30-node churn (lowest measured 87.8%, seed 1). The target is
// 0.99, which DiskFit does not reach under churn yet: see
// docs/benchmarks.md, "Placement under churn". The floor only catches a
// regression.
const churnFloor = 0.87

func TestChurnDeterministic(t *testing.T) {
	run := func(seed uint64) []ChurnResult {
		rs := runAllChurn(GenerateChurn(ChurnConfig{Nodes: 20, Cycles: 1, Load: 1.2, SamplesPerCycle: 2, Seed: seed}), Options{MaxReschedules: 10, Seed: seed})
		for i := range rs {
			rs[i].Elapsed = 0
		}
		return rs
	}
	a, b := run(5), run(5)
	for i := range a {
		if a[i].ResourceExhausted != b[i].ResourceExhausted || a[i].Reschedules != b[i].Reschedules ||
			len(a[i].Samples) != len(b[i].Samples) {
			t.Fatalf("same seed, different results for %s", a[i].Model)
		}
		for j := range a[i].Samples {
			if a[i].Samples[j] != b[i].Samples[j] {
				t.Errorf("%s sample %d: %+v vs %+v", a[i].Model, j, a[i].Samples[j], b[i].Samples[j])
			}
		}
	}
}

// TestChurnScript checks the script keeps demand near its target and
// deletes a cycle's worth of claims per cycle.
func TestChurnScript(t *testing.T) {
	sc := GenerateChurn(ChurnConfig{Nodes: 20, Cycles: 2, Load: 1.2, SamplesPerCycle: 4, Seed: 3})
	kinds := map[eventKind]int{}
	for _, ev := range sc.Events {
		kinds[ev.kind]++
	}
	if kinds[evSample] != 1+2*4 {
		t.Errorf("%d samples, want 9", kinds[evSample])
	}
	if kinds[evCreate] == 0 || kinds[evDelete] == 0 || kinds[evScale] == 0 {
		t.Errorf("want every kind of event, got %v", kinds)
	}
	classes := map[string]bool{}
	for _, s := range sc.Sets {
		for _, c := range s.template {
			classes[c.DeviceClass] = true
		}
	}
	for _, c := range []string{"", "nvme", "ssd", "hdd"} {
		if !classes[c] {
			t.Errorf("no claim of device class %q", c)
		}
	}
}

// TestPourClassed checks the bound's flow against hand-made cases.
func TestPourClassed(t *testing.T) {
	disk := func(class string, free int64) packing.Disk {
		return packing.Disk{DeviceClass: class, Free: free * gi, Capacity: free * gi, Healthy: true}
	}
	tests := []struct {
		name   string
		claims []classedDemand
		disks  []packing.Disk
		want   int64
	}{
		{
			// The 100 ssd claims may only use the ssd disk; the
			// class-less claims get the rest of it and the nvme disk.
			name:   "classes",
			claims: []classedDemand{{"ssd", 100 * gi, 300 * gi}, {"", 50 * gi, 500 * gi}},
			disks:  []packing.Disk{disk("ssd", 400), disk("nvme", 150)},
			want:   550,
		},
		{
			// A 500 claim fits no disk; 200 claims fill both.
			name:   "size",
			claims: []classedDemand{{"", 500 * gi, 500 * gi}, {"", 200 * gi, 1000 * gi}},
			disks:  []packing.Disk{disk("hdd", 400), disk("ssd", 300)},
			want:   700,
		},
		{
			// nvme claims find no nvme disk.
			name:   "no disk of the class",
			claims: []classedDemand{{"nvme", 10 * gi, 100 * gi}},
			disks:  []packing.Disk{disk("hdd", 400)},
			want:   0,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := pourClassed(tt.claims, tt.disks); got != tt.want*gi {
				t.Errorf("pourClassed = %d GiB, want %d", got/gi, tt.want)
			}
		})
	}
}

// TestDiskFitLedgerMatchesDisksUnderChurn checks that the ledger, fed PV
// deletions and DiskNode updates, ends a churn with the disks' free space.
func TestDiskFitLedgerMatchesDisksUnderChurn(t *testing.T) {
	sc := GenerateChurn(ChurnConfig{Nodes: 15, Cycles: 1, Load: 1.2, SamplesPerCycle: 1, Seed: 9})
	c := newCluster(sc.In)
	m := newDiskFitModel(sc.In, diskFitArgs(""))
	RunChurn("DiskFit", sc, m, c, Options{MaxReschedules: 10, Seed: 9})
	for n, node := range sc.In.Nodes {
		disks, _ := m.l.Disks(node.Name, nil)
		for j, d := range disks {
			if d.Free != c.free[n][j] {
				t.Errorf("%s/%s: ledger free %d, disk free %d", node.Name, d.Name, d.Free, c.free[n][j])
			}
		}
	}
}
