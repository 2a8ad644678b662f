// Command placement compares how many bytes of StatefulSet volumes
// different placement models fit onto the same synthetic clusters of
// multi-disk nodes, and how often each makes the driver fail a
// CreateVolume with ResourceExhausted. It is a deterministic simulation:
// no API server, the same seed gives the same tables.
//
//	go run ./test/bench/placement -seed 1 -nodes 100,1000
//
// With -churn-cycles N it runs the churn mode instead: StatefulSets
// arrive, scale down and up and are deleted with their PVCs, for N
// cluster-fill cycles, and each model's bytes placed are measured against
// the bound over time (churn.go).
//
//	go run ./test/bench/placement -seed 1 -nodes 100 -churn-cycles 10
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/diskfit/diskfit/scheduler-plugin/apis/config"
)

// Config is everything a run depends on.
type Config struct {
	// Seed drives the inputs and the schedulers' tie-breaks.
	Seed uint64
	// Nodes lists the cluster sizes to simulate.
	Nodes []int
	// Load is the stream's requested bytes over the cluster's free bytes.
	Load float64
	// PercentageOfNodesToScore is kube-scheduler's setting (0: adaptive).
	PercentageOfNodesToScore int32
	// MaxReschedules bounds the reschedules of one pod.
	MaxReschedules int
	// SmallInstances is the number of small inputs solved exactly.
	SmallInstances int
	// ChurnCycles, when positive, runs the churn mode instead: that many
	// cluster-fill cycles of deletions and arrivals per cluster size.
	ChurnCycles int
	// ChurnLoad is the demand the churn's arrivals keep up, over the
	// cluster's free bytes.
	ChurnLoad float64
}

func parseNodes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("bad node count %q", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func main() {
	var cfg Config
	var nodes string
	var pct, procs int
	flag.Uint64Var(&cfg.Seed, "seed", 1, "seed for the inputs and the schedulers' tie-breaks")
	flag.StringVar(&nodes, "nodes", "100,1000", "comma-separated cluster sizes")
	flag.Float64Var(&cfg.Load, "load", 1.5, "requested bytes of the pod stream over the cluster's free bytes")
	flag.IntVar(&pct, "percentage-of-nodes-to-score", 0, "kube-scheduler's percentageOfNodesToScore (0: its adaptive default)")
	flag.IntVar(&cfg.MaxReschedules, "max-reschedules", 10, "reschedules of one pod before it is left Pending")
	flag.IntVar(&cfg.SmallInstances, "small", 100, "small inputs (3 nodes) solved exactly; 0 skips them")
	flag.IntVar(&cfg.ChurnCycles, "churn-cycles", 0, "run the churn mode for this many cluster-fill cycles instead of one fill (0: one fill)")
	flag.Float64Var(&cfg.ChurnLoad, "churn-load", 1.2, "churn mode: demand (bytes of existing claims) the arrivals keep up, over the cluster's free bytes")
	flag.IntVar(&procs, "procs", 0, "models run side by side (0: GOMAXPROCS); the tables do not depend on it")
	flag.Parse()
	var err error
	if cfg.Nodes, err = parseNodes(nodes); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if cfg.Load <= 0 || pct < 0 || pct > 100 || cfg.MaxReschedules < 0 || cfg.SmallInstances < 0 ||
		cfg.ChurnCycles < 0 || cfg.ChurnLoad <= 0 {
		fmt.Fprintln(os.Stderr, "-load must be positive, -percentage-of-nodes-to-score within 0..100, the rest not negative")
		os.Exit(2)
	}
	cfg.PercentageOfNodesToScore = int32(pct)
	if procs > 0 {
		runtime.GOMAXPROCS(procs)
	}
	if cfg.ChurnCycles > 0 {
		reportChurn(os.Stdout, cfg)
		return
	}
	report(os.Stdout, cfg)
}

// modelSpec names a model and builds it on a fresh cluster.
type modelSpec struct {
	name string
	make func(in *Input, c *cluster) model
}

var models = []modelSpec{
	{"DiskFit (MostAllocated, default)", func(in *Input, _ *cluster) model {
		return newDiskFitModel(in, diskFitArgs(""))
	}},
	{"DiskFit (MostAllocated), score halved as in the 1.37 profile", func(in *Input, _ *cluster) model {
		m := newDiskFitModel(in, diskFitArgs(""))
		m.halveScore = true
		return m
	}},
	{"DiskFit (LeastAllocated)", func(in *Input, _ *cluster) model {
		return newDiskFitModel(in, diskFitArgs(config.LeastAllocated))
	}},
	{"VolumeBinding + CSIStorageCapacity, driver best fit", func(_ *Input, c *cluster) model {
		return &capacityModel{c: c}
	}},
	{"VolumeBinding + CSIStorageCapacity without capacity scoring (before 1.37), driver best fit", func(_ *Input, c *cluster) model {
		return &capacityModel{c: c, unscored: true}
	}},
	{"node sum of free (TopoLVM-style), driver best fit", func(_ *Input, c *cluster) model {
		return &capacityModel{c: c, joint: true}
	}},
}

// eachModel runs every model on in, each on its own copy of the cluster and
// with its own tie-break source, so running them side by side changes no
// result, only the wall time of each.
func eachModel[R any](in *Input, run func(name string, c *cluster, m model) R) []R {
	out := make([]R, len(models))
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	var wg sync.WaitGroup
	for i, spec := range models {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			c := newCluster(in)
			out[i] = run(spec.name, c, spec.make(in, c))
		}()
	}
	wg.Wait()
	return out
}

// runAll runs every model on in.
func runAll(in *Input, opts Options) []Result {
	return eachModel(in, func(name string, c *cluster, m model) Result { return Run(name, in, c, m, opts) })
}

// runAllChurn replays the script with every model.
func runAllChurn(sc *ChurnScript, opts Options) []ChurnResult {
	return eachModel(sc.In, func(name string, c *cluster, m model) ChurnResult { return RunChurn(name, sc, m, c, opts) })
}

// churnSamplesPerCycle is how often a churn run is measured.
const churnSamplesPerCycle = 4

func reportChurn(w io.Writer, cfg Config) {
	fmt.Fprintf(w, "churn: seed %d, %d cycles, demand %.2f of the free space, percentageOfNodesToScore %d, max reschedules %d, %s %s/%s, %d CPUs\n",
		cfg.Seed, cfg.ChurnCycles, cfg.ChurnLoad, cfg.PercentageOfNodesToScore, cfg.MaxReschedules, runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.NumCPU())
	for _, n := range cfg.Nodes {
		start := time.Now()
		sc := GenerateChurn(ChurnConfig{Nodes: n, Cycles: cfg.ChurnCycles, Load: cfg.ChurnLoad, SamplesPerCycle: churnSamplesPerCycle, Seed: cfg.Seed})
		kinds := map[eventKind]int{}
		for _, ev := range sc.Events {
			kinds[ev.kind]++
		}
		fmt.Fprintf(w, "\n### Churn, %d nodes\n\n", n)
		fmt.Fprintf(w, "%s TiB free at the start; %d StatefulSets arrived, %d deleted, %d scaled; %d samples.\n\n",
			tib(sc.Cycle), kinds[evCreate], kinds[evDelete], kinds[evScale], kinds[evSample])
		results := runAllChurn(sc, Options{PercentageOfNodesToScore: cfg.PercentageOfNodesToScore, MaxReschedules: cfg.MaxReschedules, Seed: cfg.Seed})
		fmt.Fprintln(w, "| model | of bound, mean | of bound, lowest | of bound, end | ResourceExhausted | reschedules | largest hole share, end | TiB stranded, end (most) | pending, end | time |")
		fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
		for _, r := range results {
			var sum float64
			var most int64
			for _, s := range r.Samples {
				sum += float64(s.Placed) / float64(max(s.Bound, 1))
				most = max(most, s.Stranded)
			}
			end := r.Samples[len(r.Samples)-1]
			fmt.Fprintf(w, "| %s | %.2f%% | %.2f%% | %s | %d | %d | %.3f | %s (%s) | %d | %.1fs |\n",
				r.Model, 100*sum/float64(len(r.Samples)), 100*r.MinOfBound(), pct(end.Placed, end.Bound),
				r.ResourceExhausted, r.Reschedules, end.Fragmentation, tib(end.Stranded), tib(most), end.Pending, r.Elapsed.Seconds())
		}
		fmt.Fprintf(w, "\nBytes placed over the bound, per cycle (0: the end of the first fill):\n\n")
		perCycle(w, results, nil, func(s ChurnSample) string { return pct(s.Placed, s.Bound) })
		fmt.Fprintf(w, "\nBound (TiB) and largest hole share, per cycle:\n\n")
		perCycle(w, results, func(s ChurnSample) string { return tib(s.Bound) },
			func(s ChurnSample) string { return strconv.FormatFloat(s.Fragmentation, 'f', 3, 64) })
		fmt.Fprintf(w, "\n(%.1fs for this cluster size)\n", time.Since(start).Seconds())
	}
}

// perCycle prints a table with a column per cycle: a "bound" row when
// bound is not nil, then cell of each model's samples.
func perCycle(w io.Writer, results []ChurnResult, bound, cell func(ChurnSample) string) {
	row := func(label string, samples []ChurnSample, cell func(ChurnSample) string) {
		fmt.Fprintf(w, "| %s |", label)
		for i, s := range samples {
			if i%churnSamplesPerCycle == 0 {
				fmt.Fprintf(w, " %s |", cell(s))
			}
		}
		fmt.Fprintln(w)
	}
	row("model", results[0].Samples, func(s ChurnSample) string { return strconv.FormatFloat(s.Cycles, 'g', -1, 64) })
	row("---", results[0].Samples, func(ChurnSample) string { return "---:" })
	if bound != nil {
		row("bound", results[0].Samples, bound)
	}
	for _, r := range results {
		row(r.Model, r.Samples, cell)
	}
}

func tib(b int64) string { return strconv.FormatFloat(float64(b)/float64(ti), 'f', 1, 64) }

func pct(a, b int64) string {
	if b == 0 {
		return "-"
	}
	return strconv.FormatFloat(100*float64(a)/float64(b), 'f', 2, 64) + "%"
}

func report(w io.Writer, cfg Config) {
	fmt.Fprintf(w, "seed %d, load %.2f, percentageOfNodesToScore %d, max reschedules %d, %s %s/%s, %d CPUs\n",
		cfg.Seed, cfg.Load, cfg.PercentageOfNodesToScore, cfg.MaxReschedules, runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.NumCPU())
	for _, n := range cfg.Nodes {
		start := time.Now()
		in := Generate(InputConfig{Nodes: n, MinDisks: 2, MaxDisks: 8, MaxUsed: 0.6, Load: cfg.Load, Seed: cfg.Seed})
		b := FractionalBound(in)
		disks := 0
		for _, nd := range in.Nodes {
			disks += len(nd.Disks)
		}
		fmt.Fprintf(w, "\n### %d nodes\n\n", n)
		fmt.Fprintf(w, "%d disks, %s TiB free at the start; stream of %d pods requesting %s TiB; "+
			"%d pods fit on no node even at the start; bound %s TiB (%s of the free space).\n\n",
			disks, tib(b.FreeBytes), len(in.Pods), tib(in.StreamBytes()), b.Infeasible, tib(b.Bytes), pct(b.Bytes, b.FreeBytes))
		fmt.Fprintln(w, "| model | pods placed | TiB placed | of bound | first Pending at | ResourceExhausted | reschedules | pending | stuck (TiB stranded) | pending that could fit | time |")
		fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
		for _, r := range runAll(in, Options{PercentageOfNodesToScore: cfg.PercentageOfNodesToScore, MaxReschedules: cfg.MaxReschedules, Seed: cfg.Seed}) {
			first := "never"
			if r.FirstPendingAt >= 0 {
				first = pct(r.FirstPendingAt, b.FreeBytes)
			}
			fmt.Fprintf(w, "| %s | %d | %s | %s | %s | %d | %d | %d | %d (%s) | %d | %.1fs |\n",
				r.Model, r.Placed, tib(r.PlacedBytes), pct(r.PlacedBytes, b.Bytes), first, r.ResourceExhausted, r.Reschedules,
				r.Pending, r.Stuck, tib(r.StrandedBytes), r.PendingCouldFit, r.Elapsed.Seconds())
		}
		fmt.Fprintf(w, "\n(%.1fs for this cluster size)\n", time.Since(start).Seconds())
	}
	if cfg.SmallInstances > 0 {
		reportSmall(w, cfg)
	}
}

// smallDiskSizes and smallClaimSizes keep small inputs small: a few
// dozen pods fill three nodes, so the exact solver finishes. Claims are
// large against the disks, which is where packing matters most.
var (
	smallDiskSizes  = []weighted{{512 * gi, 2}, {1 * ti, 3}, {2 * ti, 2}}
	smallClaimSizes = []weighted{{50 * gi, 2}, {100 * gi, 3}, {200 * gi, 3}, {300 * gi, 3}, {500 * gi, 3}, {750 * gi, 2}, {1 * ti, 2}, {1536 * gi, 1}}
)

func reportSmall(w io.Writer, cfg Config) {
	type agg struct {
		sum, worst float64
		atOpt, re  int
	}
	stats := make([]agg, len(models))
	for i := range stats {
		stats[i].worst = 1
	}
	var fracSum, fracWorst float64
	solved, unsolved := 0, 0
	for k := 0; k < cfg.SmallInstances; k++ {
		in := Generate(InputConfig{Nodes: 3, MinDisks: 2, MaxDisks: 3, MaxUsed: 0.5, Load: 1.3,
			Seed: cfg.Seed*1_000_003 + uint64(k), DiskSizes: smallDiskSizes, ClaimSizes: smallClaimSizes})
		results := runAll(in, Options{MaxReschedules: cfg.MaxReschedules, Seed: cfg.Seed + uint64(k)})
		opt, ok := Exact(in)
		if !ok || opt == 0 {
			unsolved++
			continue
		}
		solved++
		for i, r := range results {
			ratio := float64(r.PlacedBytes) / float64(opt)
			stats[i].sum += ratio
			stats[i].worst = min(stats[i].worst, ratio)
			if r.PlacedBytes == opt {
				stats[i].atOpt++
			}
			stats[i].re += r.ResourceExhausted
		}
		f := float64(FractionalBound(in).Bytes) / float64(opt)
		fracSum += f
		fracWorst = max(fracWorst, f)
	}
	fmt.Fprintf(w, "\n### Small inputs against the exact optimum\n\n")
	fmt.Fprintf(w, "%d inputs of 3 nodes with 2 to 3 disks of 0.5 to 2 TiB, load 1.3; %d solved exactly (%d over the step budget, left out). "+
		"The optimum may choose which pods to place and in any order; the models take the stream in order. "+
		"The fractional bound is on average %.1f%% (at most %.1f%%) above the optimum.\n\n",
		cfg.SmallInstances, solved, unsolved, 100*(fracSum/float64(max(solved, 1))-1), 100*(fracWorst-1))
	fmt.Fprintln(w, "| model | mean of optimum | worst | inputs at optimum | ResourceExhausted |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: |")
	for i, s := range stats {
		fmt.Fprintf(w, "| %s | %.2f%% | %.2f%% | %d/%d | %d |\n", models[i].name,
			100*s.sum/float64(max(solved, 1)), 100*s.worst, s.atOpt, solved, s.re)
	}
}
