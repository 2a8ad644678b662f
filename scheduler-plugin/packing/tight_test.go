package packing_test

// Tight instances: 8 to 32 disks, 9 to 16 claims, demand within a few GiB
// of the usable free total, mixed device classes, claims pinned to a disk,
// and disks that are unhealthy or unschedulable. The seeded set lives in
// testdata/tight.json; its "fit" answers come from truthFits below, an
// exhaustive search written separately from package packing (it calls
// nothing of it), so Pack is checked against an independent solver.
//
// Regenerate the set (slow: the truth solver is plain exhaustive search):
//
//	go test ./scheduler-plugin/packing -run TestTightInstances -update-tight

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/diskfit/diskfit/scheduler-plugin/packing"
)

var updateTight = flag.Bool("update-tight", false, "regenerate testdata/tight.json with the independent solver")

const (
	tightFile  = "testdata/tight.json"
	tightSeed  = 20261130
	tightCount = 400
	mib        = int64(1) << 20
)

// tightDisk is a disk of an instance; sizes are in MiB.
type tightDisk struct {
	Free   int64  `json:"f,omitempty"`
	Class  string `json:"c,omitempty"`
	Down   bool   `json:"down,omitempty"`   // not healthy
	Closed bool   `json:"closed,omitempty"` // unschedulable
}

// tightClaim is a claim of an instance; Disk is an index into Disks or -1.
type tightClaim struct {
	Size  int64  `json:"s"`
	Class string `json:"c,omitempty"`
	Disk  int    `json:"d"`
}

type tightInstance struct {
	ID       int          `json:"id"`
	Strategy string       `json:"strategy"`
	Disks    []tightDisk  `json:"disks"`
	Claims   []tightClaim `json:"claims"`
	Fit      bool         `json:"fit"`
}

// genTight makes instance id of the set: a hidden placement of the claims,
// each disk's free space its load plus a share of a few GiB of slack, then
// for half of the instances a perturbation that keeps the totals tight
// (space moved between disks, a claim grown) and may or may not leave a
// packing. Every fourth instance has 16 claims on 32 disks.
func genTight(id int) tightInstance {
	r := rand.New(rand.NewPCG(tightSeed, uint64(id)))
	nd, nc := 8+r.IntN(25), 9+r.IntN(8)
	if id%4 == 0 {
		nd, nc = 32, 16
	}
	classes := []string{"nvme", "ssd", "hdd"}[:1+r.IntN(3)]
	in := tightInstance{ID: id, Strategy: "MostAllocated"}
	if id%2 == 1 {
		in.Strategy = "LeastAllocated"
	}
	for range nd {
		in.Disks = append(in.Disks, tightDisk{Class: classes[r.IntN(len(classes))]})
	}
	load := make([]int64, nd)
	fine := r.IntN(3) == 0 // sizes with MiB granularity instead of whole GiB
	for range nc {
		var gib int64
		switch r.IntN(10) {
		case 0, 1, 2, 3:
			gib = 1 + r.Int64N(20)
		case 4, 5, 6, 7, 8:
			gib = 20 + r.Int64N(100)
		default:
			gib = 120 + r.Int64N(400)
		}
		size := gib * 1024
		if fine {
			size += r.Int64N(1024) - 512
		}
		d := r.IntN(nd)
		c := tightClaim{Size: size, Disk: -1}
		if r.IntN(3) > 0 {
			c.Class = in.Disks[d].Class
		}
		if r.IntN(12) == 0 {
			c.Disk = d
		}
		load[d] += size
		in.Claims = append(in.Claims, c)
	}
	slack := r.Int64N(4*1024 + 1)
	for i := range in.Disks {
		in.Disks[i].Free = load[i]
	}
	for slack > 0 {
		s := min(slack, 1+r.Int64N(1024))
		in.Disks[r.IntN(nd)].Free += s
		slack -= s
	}
	if r.IntN(2) == 0 {
		switch r.IntN(3) {
		case 0: // move space from one disk to another
			a, b := r.IntN(nd), r.IntN(nd)
			m := min(in.Disks[a].Free, 1024*(1+r.Int64N(30)))
			in.Disks[a].Free -= m
			in.Disks[b].Free += m
		case 1: // grow one claim by up to 3 GiB
			in.Claims[r.IntN(nc)].Size += 1 + r.Int64N(3*1024)
		default: // swap the free space of two disks of different load
			a, b := r.IntN(nd), r.IntN(nd)
			in.Disks[a].Free, in.Disks[b].Free = in.Disks[b].Free, in.Disks[a].Free
		}
	}
	// Closed or broken disks with plenty of room, which must not count:
	// disks of the hidden placement that hold no claim.
	for range r.IntN(3) {
		i := r.IntN(nd)
		if load[i] > 0 {
			continue
		}
		in.Disks[i].Free = 1024 * (50 + r.Int64N(500))
		if r.IntN(2) == 0 {
			in.Disks[i].Down = true
		} else {
			in.Disks[i].Closed = true
		}
	}
	in.Fit = truthFits(in)
	return in
}

// truthUsable is the feasibility rule written out again: a disk takes a
// claim when it is healthy, schedulable, of the claim's class (or the claim
// has none) and the claim is not restricted to another disk.
func truthUsable(in tightInstance, c tightClaim, d int) bool {
	k := in.Disks[d]
	return !k.Down && !k.Closed && (c.Class == "" || c.Class == k.Class) && (c.Disk < 0 || c.Disk == d)
}

// truthFits decides by depth-first search over the claims, largest first,
// with a memo of failed states (claim index and, per kind of disk, the
// sorted free spaces) and the bound that the remaining claims must not
// exceed the remaining usable space.
func truthFits(in tightInstance) bool {
	cs := slices.Clone(in.Claims)
	sort.SliceStable(cs, func(a, b int) bool { return cs[a].Size > cs[b].Size })
	free := make([]int64, len(in.Disks))
	for i, d := range in.Disks {
		if !d.Down && !d.Closed {
			free[i] = d.Free
		}
	}
	pinned := map[int]bool{}
	for _, c := range cs {
		if c.Disk >= 0 {
			pinned[c.Disk] = true
		}
	}
	rest := make([]int64, len(cs)+1)
	for i := len(cs) - 1; i >= 0; i-- {
		rest[i] = rest[i+1] + cs[i].Size
	}
	failed := map[string]bool{}
	key := func(i int) string {
		kinds := map[string][]int64{}
		var b strings.Builder
		for d := range in.Disks {
			if pinned[d] {
				fmt.Fprintf(&b, "p%d=%d;", d, free[d])
				continue
			}
			kinds[in.Disks[d].Class] = append(kinds[in.Disks[d].Class], free[d])
		}
		names := make([]string, 0, len(kinds))
		for k := range kinds {
			names = append(names, k)
		}
		sort.Strings(names)
		for _, k := range names {
			f := kinds[k]
			slices.Sort(f)
			b.WriteString(k + ":")
			for _, v := range f {
				b.WriteString(strconv.FormatInt(v, 10) + ",")
			}
		}
		return strconv.Itoa(i) + "|" + b.String()
	}
	var dfs func(i int) bool
	dfs = func(i int) bool {
		if i == len(cs) {
			return true
		}
		var total int64
		for _, f := range free {
			total += f
		}
		if total < rest[i] {
			return false
		}
		k := key(i)
		if failed[k] {
			return false
		}
		for d := range in.Disks {
			if free[d] >= cs[i].Size && truthUsable(in, cs[i], d) {
				free[d] -= cs[i].Size
				ok := dfs(i + 1)
				free[d] += cs[i].Size
				if ok {
					return true
				}
			}
		}
		failed[k] = true
		return false
	}
	return dfs(0)
}

func loadTight(t testing.TB) []tightInstance {
	data, err := os.ReadFile(tightFile)
	if err != nil {
		t.Fatal(err)
	}
	var set []tightInstance
	if err := json.Unmarshal(data, &set); err != nil {
		t.Fatal(err)
	}
	return set
}

// toPacking turns an instance into Pack's input, claims sorted.
func toPacking(in tightInstance) ([]packing.Disk, []packing.Claim, packing.Options) {
	disks := make([]packing.Disk, len(in.Disks))
	for i, d := range in.Disks {
		disks[i] = packing.Disk{Name: fmt.Sprintf("d%02d", i), DeviceClass: d.Class, Capacity: 1 << 50,
			Free: d.Free * mib, Healthy: !d.Down, Unschedulable: d.Closed}
	}
	claims := make([]packing.Claim, len(in.Claims))
	for i, c := range in.Claims {
		claims[i] = packing.Claim{Key: fmt.Sprintf("c%02d", i), Name: fmt.Sprintf("ns/c%02d", i), Size: c.Size * mib, DeviceClass: c.Class}
		if c.Disk >= 0 {
			claims[i].Disk = disks[c.Disk].Name
		}
	}
	packing.SortClaims(claims)
	opts := packing.Options{}
	if in.Strategy == "LeastAllocated" {
		opts.Strategy = packing.LeastAllocated
	}
	return disks, claims, opts
}

// TestTightInstances checks Pack's answer against the independent solver's
// on every instance of the seeded set, every placement it returns against
// the rules, and that the search never ran out of steps.
func TestTightInstances(t *testing.T) {
	if *updateTight {
		var set []tightInstance
		for id := range tightCount {
			set = append(set, genTight(id))
		}
		var b bytes.Buffer
		b.WriteString("[\n")
		for i, in := range set {
			line, err := json.Marshal(in)
			if err != nil {
				t.Fatal(err)
			}
			b.Write(line)
			if i < len(set)-1 {
				b.WriteString(",")
			}
			b.WriteString("\n")
		}
		b.WriteString("]\n")
		if err := os.WriteFile(tightFile, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	set := loadTight(t)
	if len(set) != tightCount {
		t.Fatalf("%s has %d instances, want %d", tightFile, len(set), tightCount)
	}
	fits := 0
	for _, in := range set {
		disks, claims, opts := toPacking(in)
		assign := make([]int, len(claims))
		got, exhausted := packing.PackForTest(disks, claims, opts, assign)
		if exhausted {
			t.Errorf("instance %d: the search ran out of steps", in.ID)
		}
		if got != in.Fit {
			t.Errorf("instance %d (%d claims, %d disks, %s): Pack = %v, independent solver = %v", in.ID, len(claims), len(disks), in.Strategy, got, in.Fit)
			continue
		}
		if got {
			fits++
			checkPlacement(t, in.ID, disks, claims, assign)
		}
	}
	// For the record: how often the greedy placements alone (the
	// strategy's, then first-fit decreasing) miss a packing that exists.
	missed := 0
	for _, in := range set {
		disks, claims, opts := toPacking(in)
		opts.MaxExactClaims = -1
		if in.Fit && !packing.Pack(disks, claims, opts, make([]int, len(claims))) {
			missed++
		}
	}
	t.Logf("%d instances, %d fit; without the exact search %d of those are rejected", len(set), fits, missed)
}

// TestPackNoAlloc checks that Pack allocates nothing on nodes of up to
// MaxInlineDisks disks, the exact search included.
func TestPackNoAlloc(t *testing.T) {
	for _, in := range loadTight(t) {
		disks, claims, opts := toPacking(in)
		assign := make([]int, len(claims))
		if n := testing.AllocsPerRun(3, func() { packing.Pack(disks, claims, opts, assign) }); n != 0 {
			t.Fatalf("instance %d: %v allocations per Pack", in.ID, n)
		}
	}
}

// checkPlacement checks an assignment by the rules, without package packing.
func checkPlacement(t *testing.T, id int, disks []packing.Disk, claims []packing.Claim, assign []int) {
	t.Helper()
	used := make([]int64, len(disks))
	for i, c := range claims {
		d := disks[assign[i]]
		if !d.Healthy || d.Unschedulable || (c.DeviceClass != "" && c.DeviceClass != d.DeviceClass) || (c.Disk != "" && c.Disk != d.Name) {
			t.Errorf("instance %d: claim %s on disk %s, which it may not use", id, c.Name, d.Name)
		}
		used[assign[i]] += c.Size
	}
	for i, d := range disks {
		if used[i] > d.Free {
			t.Errorf("instance %d: disk %s overbooked: %d > %d", id, d.Name, used[i], d.Free)
		}
	}
}

// TestTightGenerator checks that the committed set is what the generator
// makes (the truth answers included) for a sample of instances.
func TestTightGenerator(t *testing.T) {
	set := loadTight(t)
	for _, id := range []int{0, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377} {
		want := genTight(id)
		a, _ := json.Marshal(set[id])
		b, _ := json.Marshal(want)
		if !bytes.Equal(a, b) {
			t.Errorf("instance %d differs from the generator's:\n%s\n%s", id, a, b)
		}
	}
}

// BenchmarkPackTight reports per-node Pack time over the tight set: p50
// and p99 over all instances and over those with 16 claims on 32 disks.
func BenchmarkPackTight(b *testing.B) {
	set := loadTight(b)
	type input struct {
		disks  []packing.Disk
		claims []packing.Claim
		opts   packing.Options
		big    bool
	}
	var ins []input
	for _, in := range set {
		d, c, o := toPacking(in)
		ins = append(ins, input{d, c, o, len(c) == 16 && len(d) == 32})
	}
	assign := make([]int, 16)
	samples := make([][]time.Duration, len(ins))
	for b.Loop() {
		for i, in := range ins {
			start := time.Now()
			packing.Pack(in.disks, in.claims, in.opts, assign[:len(in.claims)])
			samples[i] = append(samples[i], time.Since(start))
		}
	}
	// Each instance's median over the iterations, then quantiles over the
	// instances: one slow iteration (a GC, the machine's other work) does
	// not make an instance slow.
	var all, big []time.Duration
	for i, s := range samples {
		slices.Sort(s)
		m := s[len(s)/2]
		all = append(all, m)
		if ins[i].big {
			big = append(big, m)
		}
	}
	q := func(ds []time.Duration, p float64) float64 {
		slices.Sort(ds)
		return float64(ds[int(p*float64(len(ds)-1)+0.5)].Nanoseconds()) / 1e3
	}
	b.ReportMetric(q(all, 0.5), "p50-µs")
	b.ReportMetric(q(all, 0.99), "p99-µs")
	b.ReportMetric(q(all, 1), "max-µs")
	b.ReportMetric(q(big, 0.5), "p50-16x32-µs")
	b.ReportMetric(q(big, 0.99), "p99-16x32-µs")
}

// TestPackAgainstTruthRandom compares Pack with the independent solver on
// small random nodes, loose and tight, with classes, pinned claims and
// closed disks: sizes of a few units make many placements tie.
func TestPackAgainstTruthRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	classes := []string{"", "a", "b"}
	for iter := range 3000 {
		nd, nc := 1+r.IntN(10), 1+r.IntN(16)
		in := tightInstance{ID: iter, Strategy: "MostAllocated"}
		if r.IntN(2) == 0 {
			in.Strategy = "LeastAllocated"
		}
		var total int64
		for range nc {
			c := tightClaim{Size: 1 + r.Int64N(6), Class: classes[r.IntN(3)], Disk: -1}
			if r.IntN(10) == 0 {
				c.Disk = r.IntN(nd)
			}
			total += c.Size
			in.Claims = append(in.Claims, c)
		}
		for range nd {
			d := tightDisk{Free: r.Int64N(2*total/int64(nd) + 3), Class: classes[1+r.IntN(2)]}
			d.Down = r.IntN(15) == 0
			d.Closed = r.IntN(15) == 0
			in.Disks = append(in.Disks, d)
		}
		want := truthFits(in)
		disks, claims, opts := toPacking(in)
		assign := make([]int, len(claims))
		got, exhausted := packing.PackForTest(disks, claims, opts, assign)
		if exhausted {
			t.Errorf("instance %d: the search ran out of steps", iter)
		}
		if got != want {
			b, _ := json.Marshal(in)
			t.Fatalf("Pack = %v, independent solver = %v on %s", got, want, b)
		}
		if got {
			checkPlacement(t, iter, disks, claims, assign)
		}
	}
}
