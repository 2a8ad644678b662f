package schedperf

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
)

// Profile prefixes of the test case names in configFile: "<profile>_<pods>".
const (
	profileDiskFit = "DiskFit"
	profileDefault = "Default"
)

// throughput is one workload's SchedulingThroughput for one profile.
type throughput struct {
	profile  string // DiskFit or Default
	pods     string // PodOnly, OneClaim, ThreeClaims
	workload string // 500Nodes, 5000Nodes
	average  float64
	perc50   float64
	// duration is scheduler_perf's SchedulingDuration: seconds from the
	// start of the measured pods' creation until all are scheduled.
	duration float64
}

// readThroughput reads the SchedulingThroughput items of the newest data
// items file scheduler_perf wrote for topic into dir.
func readThroughput(dir, topic string) ([]throughput, error) {
	files, err := filepath.Glob(filepath.Join(dir, "BenchmarkPerfScheduling_benchmark_"+topic+"_*.json"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no data items file for topic %q in %s", topic, dir)
	}
	sort.Strings(files) // the names end with a timestamp
	raw, err := os.ReadFile(files[len(files)-1])
	if err != nil {
		return nil, err
	}
	var items struct {
		DataItems []struct {
			Data   map[string]float64 `json:"data"`
			Labels map[string]string  `json:"labels"`
		} `json:"dataItems"`
	}
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, fmt.Errorf("parsing %s: %w", files[len(files)-1], err)
	}
	var out []throughput
	index := map[[3]string]int{}
	for _, item := range items.DataItems {
		metric := item.Labels["Metric"]
		if metric != "SchedulingThroughput" && metric != "SchedulingDuration" {
			continue
		}
		profile, pods, workload, ok := parseName(item.Labels["Name"])
		if !ok {
			continue
		}
		k := [3]string{profile, pods, workload}
		i, seen := index[k]
		if !seen {
			i = len(out)
			index[k] = i
			out = append(out, throughput{profile: profile, pods: pods, workload: workload})
		}
		if metric == "SchedulingDuration" {
			out[i].duration = item.Data["Duration"]
		} else {
			out[i].average = item.Data["Average"]
			out[i].perc50 = item.Data["Perc50"]
		}
	}
	return out, nil
}

// parseName splits a data item's Name label,
// "BenchmarkPerfScheduling/<profile>_<pods>[#NN]/<workload>/<namespace>", into
// its parts.
func parseName(name string) (profile, pods, workload string, ok bool) {
	parts := strings.Split(name, "/")
	for i := 0; i+1 < len(parts); i++ {
		// A test case run again in the same process gets a "#01" suffix.
		name, _, _ := strings.Cut(parts[i], "#")
		profile, pods, found := strings.Cut(name, "_")
		if found && (profile == profileDefault || profile == profileDiskFit) {
			return profile, pods, parts[i+1], true
		}
	}
	return "", "", "", false
}

// throughputTable renders one row per workload with both profiles, the
// ratio DiskFit/default of the averages and of the medians, and each
// profile's SchedulingDuration.
func throughputTable(items []throughput) string {
	type key struct{ workload, pods string }
	rows := map[key]map[string]throughput{}
	var keys []key
	for _, t := range items {
		k := key{t.workload, t.pods}
		if rows[k] == nil {
			rows[k] = map[string]throughput{}
			keys = append(keys, k)
		}
		rows[k][t.profile] = t
	}
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "workload\tpods\tdefault avg\tdefault p50\tdiskfit avg\tdiskfit p50\tratio avg\tratio p50\tdefault s\tdiskfit s\t")
	for _, k := range keys {
		d, hasD := rows[k][profileDefault]
		f, hasF := rows[k][profileDiskFit]
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", k.workload, k.pods,
			num(d.average, hasD), num(d.perc50, hasD), num(f.average, hasF), num(f.perc50, hasF),
			ratio(f.average, d.average, hasF && hasD), ratio(f.perc50, d.perc50, hasF && hasD),
			num(d.duration, hasD), num(f.duration, hasF))
	}
	_ = w.Flush()
	return "SchedulingThroughput, pods/s (ratio = DiskFit / default); SchedulingDuration, s\n" + b.String()
}

func num(v float64, ok bool) string {
	if !ok {
		return "-"
	}
	return fmt.Sprintf("%.1f", v)
}

func ratio(a, b float64, ok bool) string {
	if !ok || b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", a/b)
}

// ratioSummary renders, per workload, the DiskFit/default ratio of the
// average throughput in every round and their median.
func ratioSummary(rounds [][]throughput) string {
	type key struct{ workload, pods string }
	ratios := map[key][]float64{}
	var keys []key
	for _, items := range rounds {
		avg := map[key]map[string]float64{}
		for _, t := range items {
			k := key{t.workload, t.pods}
			if avg[k] == nil {
				avg[k] = map[string]float64{}
			}
			avg[k][t.profile] = t.average
		}
		for _, t := range items {
			k := key{t.workload, t.pods}
			d, f := avg[k][profileDefault], avg[k][profileDiskFit]
			if t.profile != profileDiskFit || d == 0 {
				continue
			}
			if ratios[k] == nil {
				keys = append(keys, k)
			}
			ratios[k] = append(ratios[k], f/d)
		}
	}
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "workload\tpods\trounds\tratio avg per round\tmedian\t")
	for _, k := range keys {
		r := ratios[k]
		each := make([]string, len(r))
		for i, v := range r {
			each[i] = fmt.Sprintf("%.2f", v)
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%.2f\t\n", k.workload, k.pods, len(r), strings.Join(each, " "), median(r))
	}
	_ = w.Flush()
	return "DiskFit / default, average SchedulingThroughput, over rounds\n" + b.String()
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
