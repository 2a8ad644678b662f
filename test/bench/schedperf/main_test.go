package schedperf

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	_ "k8s.io/component-base/logs/json/register"
	perf "k8s.io/kubernetes/test/integration/scheduler_perf"
)

// configFile lists the test cases: every workload once per profile.
const configFile = "config/performance-config.yaml"

// topic names the data items file scheduler_perf writes.
const topic = "diskfit"

func TestMain(m *testing.M) {
	if filepath.Base(os.Args[0]) == etcdCommand {
		os.Exit(runEtcd(os.Args[1:]))
	}
	if err := perf.InitTests(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cleanup, err := installEtcdShim()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	cleanup()
	os.Exit(code)
}

// rounds repeats the whole set of selected workloads; each round prints its
// table, and the last a summary of the ratios over all rounds. Unlike
// -count, which repeats each workload back to back, a round measures both
// profiles within minutes of each other, under the same machine load.
var rounds = flag.Int("rounds", 1, "times to run the selected workloads, each time for both profiles")

// BenchmarkPerfScheduling runs every workload of configFile for the DiskFit
// and the default profile and prints pods/s per workload and profile with
// their ratio. It only runs with -bench: each workload starts its own etcd,
// API server and scheduler.
func BenchmarkPerfScheduling(b *testing.B) {
	dir := flag.Lookup("data-items-dir")
	if dir == nil {
		b.Fatal("scheduler_perf has no -data-items-dir flag")
	}
	if dir.Value.String() == "" {
		// The table is read back from the data items file.
		if err := dir.Value.Set(b.TempDir()); err != nil {
			b.Fatal(err)
		}
	}
	var all [][]throughput
	for round := range *rounds {
		perf.RunBenchmarkPerfScheduling(b, configFile, topic, registry(),
			perf.WithPrepareFn(prepareStorage),
			perf.WithNodeUpdateFn(addDiskNodes),
		)
		items, err := readThroughput(dir.Value.String(), topic)
		if err != nil {
			b.Fatal(err)
		}
		if *rounds > 1 {
			fmt.Printf("Round %d of %d, %s\n", round+1, *rounds, time.Now().UTC().Format(time.TimeOnly))
		}
		fmt.Print(throughputTable(items))
		all = append(all, items)
	}
	if len(all) > 1 {
		fmt.Print(ratioSummary(all))
	}
}
