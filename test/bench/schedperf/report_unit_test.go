package schedperf

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
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
{"data":{"Average":50,"Perc50":40},"unit":"pods/s","labels":{"Metric":"SchedulingThroughput","Name":"BenchmarkPerfScheduling/Default_PodOnly/5000Nodes/bench"}}
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
