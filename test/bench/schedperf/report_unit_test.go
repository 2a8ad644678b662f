package schedperf

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestReadThroughput(t *testing.T) {
	dir := t.TempDir()
	// The shape scheduler_perf writes: one SchedulingThroughput item per
	// workload, other metrics beside it.
	data := `{"version":"v1","dataItems":[
{"data":{"Average":100,"Perc50":90},"unit":"pods/s","labels":{"Metric":"SchedulingThroughput","Name":"BenchmarkPerfScheduling/Default_OneClaim/500Nodes/bench"}},
{"data":{"Average":95,"Perc50":99},"unit":"pods/s","labels":{"Metric":"SchedulingThroughput","Name":"BenchmarkPerfScheduling/DiskFit_OneClaim/500Nodes/bench"}},
{"data":{"Average":1},"unit":"ms","labels":{"Metric":"scheduler_framework_extension_point_duration_seconds","Name":"BenchmarkPerfScheduling/DiskFit_OneClaim/500Nodes/bench"}},
{"data":{"Duration":10},"unit":"s","labels":{"Metric":"SchedulingDuration","Name":"BenchmarkPerfScheduling/Default_OneClaim/500Nodes/bench"}},
{"data":{"Duration":12.5},"unit":"s","labels":{"Metric":"SchedulingDuration","Name":"BenchmarkPerfScheduling/DiskFit_OneClaim/500Nodes/bench"}},
{"data":{"Average":50,"Perc50":40},"unit":"pods/s","labels":{"Metric":"SchedulingThroughput","Name":"BenchmarkPerfScheduling/Default_PodOnly#01/5000Nodes/bench"}}
]}`
	if err := os.WriteFile(filepath.Join(dir, "BenchmarkPerfScheduling_benchmark_diskfit_2026-11-30T01:00:00Z.json"), []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	items, err := readThroughput(dir, "diskfit")
	if err != nil {
		t.Fatal(err)
	}
	if len(items) != 3 {
		t.Fatalf("got %d throughput items, want 3: %+v", len(items), items)
	}
	table := throughputTable(items)
	for _, want := range []string{
		"500Nodes  OneClaim  100.0  90.0  95.0  99.0  0.95  1.10  10.0  12.5",
		"5000Nodes  PodOnly  50.0  40.0  -  -  -  -  0.0  -",
	} {
		if !strings.Contains(strings.Join(strings.Fields(table), "  "), want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
}

func TestRatioSummary(t *testing.T) {
	round := func(def, fit float64) []throughput {
		return []throughput{
			{profile: profileDefault, pods: "OneClaim", workload: "500Nodes", average: def},
			{profile: profileDiskFit, pods: "OneClaim", workload: "500Nodes", average: fit},
			// A workload measured for one profile only has no ratio.
			{profile: profileDefault, pods: "PodOnly", workload: "500Nodes", average: def},
		}
	}
	got := ratioSummary([][]throughput{round(100, 80), round(50, 60), round(40, 40)})
	want := "500Nodes  OneClaim  3  0.80 1.20 1.00  1.00"
	if !strings.Contains(strings.Join(strings.Fields(got), "  "), strings.Join(strings.Fields(want), "  ")) {
		t.Errorf("summary lacks %q:\n%s", want, got)
	}
	if strings.Contains(got, "PodOnly") {
		t.Errorf("summary has a ratio for a workload without DiskFit:\n%s", got)
	}
}

func TestMemoryTable(t *testing.T) {
	got := memoryTable(5000, 8, 20000, map[string]schedulerMemory{
		profileDefault: {heapInuse: 100 << 20, rss: 200 << 20, rssPeak: 300 << 20, ready: 1500 * time.Millisecond},
		profileDiskFit: {heapInuse: 150 << 20, rss: 260 << 20, rssPeak: 330 << 20, ready: 2 * time.Second},
	})
	for _, want := range []string{
		"5000 nodes x 8 disks, 20000 bound diskfit PVs and PVCs",
		"Default  100.0  200.0  300.0  1.5",
		"DiskFit  150.0  260.0  330.0  2.0",
		"DiskFit - default  50.0  60.0  30.0",
	} {
		if !strings.Contains(strings.Join(strings.Fields(got), "  "), strings.Join(strings.Fields(want), "  ")) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
}

func TestProcessRSS(t *testing.T) {
	rss, peak, err := processRSS(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if rss <= 0 || peak < rss {
		t.Errorf("RSS %d, peak %d: want 0 < RSS <= peak", rss, peak)
	}
}
