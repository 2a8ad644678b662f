package main

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/diskfit/diskfit/scheduler-plugin/packing"
)

// ChurnConfig shapes a churn run: a cluster filled by StatefulSets, then
// sets deleted, scaled down and up, and new sets arriving, for Cycles
// cluster-fill cycles.
type ChurnConfig struct {
	// Nodes is the cluster size.
	Nodes int
	// Cycles is how many times the deleted volumes add up to the
	// cluster's free space at the start.
	Cycles int
	// Load is the demand the arrivals keep up: bytes of existing claims
	// over the cluster's free bytes at the start.
	Load float64
	// SamplesPerCycle is how often per cycle the run is measured.
	SamplesPerCycle int
	// Seed makes the cluster, the script and the tie-breaks reproducible.
	Seed uint64
}

// setSpec is one StatefulSet of the churn script.
type setSpec struct {
	// template is the claim template, largest first; keys are filled in
	// per replica and generation.
	template []packing.Claim
	// retain is persistentVolumeClaimRetentionPolicy.whenScaled: Retain
	// keeps a scaled-down replica's PVCs (and volumes) for when it
	// comes back; Delete deletes them.
	retain bool
	// fits is whether one replica fits on some node of the empty cluster;
	// sets that never fit are left out of the bound.
	fits bool
}

type eventKind uint8

const (
	// evCreate: set arrives with replicas 0..to-1.
	evCreate eventKind = iota
	// evScale: set goes from `from` replicas to `to`.
	evScale
	// evDelete: set and every PVC of it are deleted.
	evDelete
	// evSample: measure.
	evSample
)

type churnEvent struct {
	kind     eventKind
	set      int
	from, to int
}

// ChurnScript is one churn input: every model replays exactly this.
type ChurnScript struct {
	In     *Input
	Sets   []setSpec
	Events []churnEvent
	// Cycle is the cluster's free bytes at the start: one cycle deletes
	// that many bytes of claims.
	Cycle int64
	// SamplesPerCycle is how many evSample events each cycle has.
	SamplesPerCycle int
}

// pickClass gives a claim a device class, or none (40%): classes whose
// disks can hold the size, uniformly (nvme disks are 512Gi and 1Ti, ssd 2
// and 4Ti, hdd 8Ti, all up to 60% used at the start).
func pickClass(r *rand.Rand, size int64) string {
	if r.IntN(10) < 4 {
		return ""
	}
	classes := []string{"hdd"}
	if size <= 2*ti {
		classes = append(classes, "ssd")
	}
	if size <= 300*gi {
		classes = append(classes, "nvme")
	}
	return classes[r.IntN(len(classes))]
}

// GenerateChurn builds the cluster as Generate does and a script of set
// events. The script depends only on demand (bytes of claims that exist),
// never on where a model put anything, so every model sees the same one:
// while demand is below Load times the free space, a new set arrives (or,
// 30% of the time, a scaled-down set scales back up); otherwise a set is
// deleted with its PVCs (half the time) or scaled down by 1 to all of its
// replicas. The fill before the first cycle is arrivals only.
func GenerateChurn(cfg ChurnConfig) *ChurnScript {
	in := Generate(InputConfig{Nodes: cfg.Nodes, MinDisks: 2, MaxDisks: 8, MaxUsed: 0.6, Load: 0, Seed: cfg.Seed})
	sc := &ChurnScript{In: in, Cycle: in.FreeBytes(), SamplesPerCycle: max(cfg.SamplesPerCycle, 1)}
	r := rand.New(rand.NewPCG(cfg.Seed, 0x6a09e667f3bcc909))
	target := int64(cfg.Load * float64(sc.Cycle))
	type live struct {
		set      int
		scale    int
		retained int // replicas whose PVCs exist: max(scale, retained ones)
	}
	var sets []live
	var demand, deleted int64
	podBytes := func(set int) int64 {
		var b int64
		for _, c := range sc.Sets[set].template {
			b += c.Size
		}
		return b
	}
	var buf []packing.Disk
	assign := make([]int, 8)
	arrive := func() {
		replicas := 1 + r.IntN(6)
		template := make([]packing.Claim, pick(r, claimsPerPod))
		for i := range template {
			template[i].Size = pick(r, claimSizes)
			template[i].DeviceClass = pickClass(r, template[i].Size)
			template[i].Key = fmt.Sprintf("vol%d", i)
		}
		packing.SortClaims(template)
		spec := setSpec{template: template, retain: r.IntN(10) < 6}
		for n := range in.Nodes {
			buf = append(buf[:0], in.Nodes[n].Disks...)
			if packing.Pack(buf, template, packing.Options{}, assign[:len(template)]) {
				spec.fits = true
				break
			}
		}
		sc.Sets = append(sc.Sets, spec)
		id := len(sc.Sets) - 1
		sets = append(sets, live{set: id, scale: replicas, retained: replicas})
		demand += int64(replicas) * podBytes(id)
		sc.Events = append(sc.Events, churnEvent{kind: evCreate, set: id, to: replicas})
	}
	for demand < target {
		arrive()
	}
	sc.Events = append(sc.Events, churnEvent{kind: evSample})
	samples := sc.SamplesPerCycle
	next := int64(1)
	total := int64(cfg.Cycles) * int64(samples)
	for next <= total {
		if demand < target {
			var down []int
			for i, s := range sets {
				if s.scale < 6 {
					down = append(down, i)
				}
			}
			if len(down) > 0 && r.IntN(10) < 3 {
				i := down[r.IntN(len(down))]
				s := &sets[i]
				to := s.scale + 1 + r.IntN(6-s.scale)
				if to > s.retained {
					demand += int64(to-s.retained) * podBytes(s.set)
					s.retained = to
				}
				sc.Events = append(sc.Events, churnEvent{kind: evScale, set: s.set, from: s.scale, to: to})
				s.scale = to
			} else {
				arrive()
			}
			continue
		}
		i := r.IntN(len(sets))
		s := &sets[i]
		if r.IntN(2) == 0 || s.scale == 0 {
			b := int64(s.retained) * podBytes(s.set)
			demand -= b
			deleted += b
			sc.Events = append(sc.Events, churnEvent{kind: evDelete, set: s.set, from: s.scale})
			sets = slices.Delete(sets, i, i+1)
		} else {
			to := r.IntN(s.scale)
			if !sc.Sets[s.set].retain {
				b := int64(s.retained-to) * podBytes(s.set)
				demand -= b
				deleted += b
				s.retained = to
			}
			sc.Events = append(sc.Events, churnEvent{kind: evScale, set: s.set, from: s.scale, to: to})
			s.scale = to
		}
		for next <= total && deleted >= next*sc.Cycle/int64(samples) {
			sc.Events = append(sc.Events, churnEvent{kind: evSample})
			next++
		}
	}
	return sc
}

// ChurnSample is one measurement of a churn run.
type ChurnSample struct {
	// Cycles is how many cluster-fill cycles of claims had been deleted
	// (0: the end of the first fill).
	Cycles float64
	// Bound is the bytes any placement of the claims that exist could
	// hold (ChurnBound).
	Bound int64
	// Placed is the bytes of the volumes of replicas with every volume
	// made (running, or scaled down with their PVCs retained).
	Placed int64
	// Stranded is the bytes of the volumes of replicas with some but not
	// all volumes made: space held for no running pod.
	Stranded int64
	// Fragmentation is the cluster's largest-hole share
	// (cluster.fragmentation).
	Fragmentation float64
	// Pending counts replicas that exist and are not running.
	Pending int
}

// ChurnResult is what one model achieved over a churn script.
type ChurnResult struct {
	Model   string
	Samples []ChurnSample
	// ResourceExhausted and Reschedules are over the whole run.
	ResourceExhausted int
	Reschedules       int
	Elapsed           time.Duration
}

// MinOfBound is the lowest Placed over Bound of any sample.
func (r *ChurnResult) MinOfBound() float64 {
	low := 1.0
	for _, s := range r.Samples {
		if s.Bound > 0 {
			low = min(low, float64(s.Placed)/float64(s.Bound))
		}
	}
	return low
}

// replica is one StatefulSet replica in a churn run: its pod (when it
// exists) and its claims, with the volumes made so far.
type replica struct {
	pod    Pod
	st     podState
	exists bool
	// running: every claim has a volume.
	running bool
	// gen counts the times its PVCs were deleted, so a recreated PVC has
	// a new UID (claim key).
	gen int
	// hasPVCs is false when no PVC of the replica exists yet.
	hasPVCs bool
	// queued orders pending replicas (kube-scheduler's queue is FIFO
	// within a priority); tried is the event count at its last attempt.
	queued, tried int
}

// RunChurn replays the script with one model.
func RunChurn(name string, sc *ChurnScript, m model, c *cluster, opts Options) ChurnResult {
	start := time.Now()
	res := ChurnResult{Model: name}
	var counts Result
	s := &scheduler{pct: opts.PercentageOfNodesToScore, rng: rand.New(rand.NewPCG(opts.Seed, 0x2545f4914f6cdd1d))}
	in := sc.In
	reps := make([][]*replica, len(sc.Sets))
	var pending []*replica
	freedAt := make([]int, len(in.Nodes))
	event, queued := 0, 0

	deleteVolumes := func(rp *replica) {
		for _, v := range rp.st.vols {
			c.free[v.n][v.d] += v.claim.Size
			m.deleted(v.n, v.d, &v.claim)
			freedAt[v.n] = event
		}
		rp.gen++
		rp.hasPVCs = false
		rp.running = false
		rp.st.vols = rp.st.vols[:0]
		rp.st.made = 0
	}
	schedule := func(rp *replica) {
		rp.tried = event
		if rp.st.try(s, m, c, &rp.pod, opts.MaxReschedules, &counts) {
			rp.running = true
			return
		}
		if rp.st.pinned < 0 && len(rp.st.vols) > 0 {
			rp.st.pinned = rp.st.vols[0].n
		}
	}
	// start makes a replica's pod exist, with new PVCs unless they were
	// retained, and schedules it at once.
	start1 := func(set, ord int) {
		for len(reps[set]) <= ord {
			reps[set] = append(reps[set], &replica{})
		}
		rp := reps[set][ord]
		rp.exists = true
		if !rp.hasPVCs {
			rp.pod = Pod{Name: fmt.Sprintf("ss%d-%d", set, ord)}
			for _, t := range sc.Sets[set].template {
				t.Key = fmt.Sprintf("%s-ss%d-%d-g%d", t.Key, set, ord, rp.gen)
				t.Name = "default/" + t.Key
				rp.pod.Claims = append(rp.pod.Claims, t)
			}
			rp.st.reset(&rp.pod)
			rp.hasPVCs = true
		}
		if rp.running {
			return
		}
		schedule(rp)
		if !rp.running {
			queued++
			rp.queued = queued
			pending = append(pending, rp)
		}
	}
	stop := func(rp *replica, keepPVCs bool) {
		rp.exists = false
		if i := slices.Index(pending, rp); i >= 0 {
			pending = slices.Delete(pending, i, i+1)
		}
		if !keepPVCs {
			deleteVolumes(rp)
		}
	}
	// retry gives every pending replica, oldest first, another attempt if
	// a node it could use gained space since its last one: its pinned
	// node, or any node that now passes Filter (space elsewhere only
	// shrank, so no other node can have become feasible). Skipping the
	// others changes nothing: a search that finds no node advances the
	// scheduler's start index by the whole cluster.
	retry := func() {
		kept := pending[:0]
		for _, rp := range pending {
			again := false
			if rp.st.pinned >= 0 {
				again = freedAt[rp.st.pinned] > rp.tried
			} else {
				for n := range freedAt {
					if freedAt[n] > rp.tried && m.filter(n, rp.st.remaining) {
						again = true
						break
					}
				}
			}
			if again {
				schedule(rp)
			}
			if !rp.running {
				kept = append(kept, rp)
			}
		}
		pending = kept
	}
	sample := func() {
		smp := ChurnSample{Cycles: float64(len(res.Samples)) / float64(sc.SamplesPerCycle), Fragmentation: c.fragmentation(), Bound: ChurnBound(sc, reps)}
		for _, rs := range reps {
			for _, rp := range rs {
				switch {
				case rp.running:
					smp.Placed += rp.st.made
				case rp.st.made > 0:
					smp.Stranded += rp.st.made
				}
				if rp.exists && !rp.running {
					smp.Pending++
				}
			}
		}
		res.Samples = append(res.Samples, smp)
	}
	for _, ev := range sc.Events {
		switch ev.kind {
		case evCreate:
			for ord := 0; ord < ev.to; ord++ {
				start1(ev.set, ord)
			}
		case evScale:
			for ord := ev.from; ord < ev.to; ord++ {
				start1(ev.set, ord)
			}
			if ev.to < ev.from {
				event++
				for ord := ev.from - 1; ord >= ev.to; ord-- {
					stop(reps[ev.set][ord], sc.Sets[ev.set].retain)
				}
				retry()
			}
		case evDelete:
			event++
			for _, rp := range reps[ev.set] {
				stop(rp, false)
			}
			reps[ev.set] = nil
			retry()
		case evSample:
			sample()
		}
	}
	res.ResourceExhausted, res.Reschedules = counts.ResourceExhausted, counts.Reschedules
	res.Elapsed = time.Since(start)
	return res
}

// ChurnBound is the bytes an offline packer free to place every volume
// anew could at most hold with the claims that exist now: the claims of
// every replica whose PVCs exist (running, Pending, or scaled down with
// PVCs retained), of sets a replica of which fits on some node of the
// empty cluster, poured into the free space the cluster had before the
// first set arrived; a claim only into disks of its device class (any,
// without one) with at least its size free, splitting allowed. It ignores
// history (no model can move a volume once made) and that a pod's claims
// share a node, so no placement exceeds it.
func ChurnBound(sc *ChurnScript, reps [][]*replica) int64 {
	type group struct {
		class string
		size  int64
	}
	demand := map[group]int64{}
	for set, rs := range reps {
		if !sc.Sets[set].fits {
			continue
		}
		for _, rp := range rs {
			if !rp.hasPVCs {
				continue
			}
			for _, cl := range rp.pod.Claims {
				demand[group{cl.DeviceClass, cl.Size}] += cl.Size
			}
		}
	}
	var disks []packing.Disk
	for _, n := range sc.In.Nodes {
		disks = append(disks, n.Disks...)
	}
	var claims []classedDemand
	for g, b := range demand {
		claims = append(claims, classedDemand{class: g.class, size: g.size, bytes: b})
	}
	return pourClassed(claims, disks)
}

// classedDemand is the bytes of claims of one device class and size.
type classedDemand struct {
	class string
	size  int64
	bytes int64
}

// pourClassed is the maximum flow from claims to disks, a claim only into
// disks of its class (any when it has none) with at least its size free.
// Disks of one class whose free space lies between the same two claim
// sizes are alike to every claim, so they are pooled into bands, and the
// flow runs on a graph of a few dozen vertices.
func pourClassed(claims []classedDemand, disks []packing.Disk) int64 {
	var sizes []int64
	for _, c := range claims {
		sizes = append(sizes, c.size)
	}
	slices.Sort(sizes)
	sizes = slices.Compact(sizes)
	type band struct {
		class string
		floor int64
	}
	bands := map[band]int64{}
	for _, d := range disks {
		// The largest claim size not above the disk's free space.
		i, found := slices.BinarySearch(sizes, d.Free)
		if !found {
			i--
		}
		if i < 0 {
			continue
		}
		bands[band{d.DeviceClass, sizes[i]}] += d.Free
	}
	var bandList []band
	for b := range bands {
		bandList = append(bandList, b)
	}
	// Vertices: 0 source, 1 sink, then claims, then bands.
	f := newFlow(2 + len(claims) + len(bandList))
	const inf = int64(1) << 62
	for i, c := range claims {
		f.edge(0, 2+i, c.bytes)
		for j, b := range bandList {
			if (c.class == "" || c.class == b.class) && b.floor >= c.size {
				f.edge(2+i, 2+len(claims)+j, inf)
			}
		}
	}
	for j, b := range bandList {
		f.edge(2+len(claims)+j, 1, bands[b])
	}
	return f.max(0, 1)
}

// flow is a small Dinic maximum flow.
type flow struct {
	head  [][]int
	to    []int
	cap   []int64
	level []int
	iter  []int
}

func newFlow(n int) *flow { return &flow{head: make([][]int, n)} }

func (f *flow) edge(a, b int, c int64) {
	f.head[a] = append(f.head[a], len(f.to))
	f.to, f.cap = append(f.to, b), append(f.cap, c)
	f.head[b] = append(f.head[b], len(f.to))
	f.to, f.cap = append(f.to, a), append(f.cap, 0)
}

func (f *flow) bfs(s, t int) bool {
	f.level = make([]int, len(f.head))
	for i := range f.level {
		f.level[i] = -1
	}
	f.level[s] = 0
	queue := []int{s}
	for len(queue) > 0 {
		v := queue[0]
		queue = queue[1:]
		for _, e := range f.head[v] {
			if f.cap[e] > 0 && f.level[f.to[e]] < 0 {
				f.level[f.to[e]] = f.level[v] + 1
				queue = append(queue, f.to[e])
			}
		}
	}
	return f.level[t] >= 0
}

func (f *flow) dfs(v, t int, limit int64) int64 {
	if v == t {
		return limit
	}
	for ; f.iter[v] < len(f.head[v]); f.iter[v]++ {
		e := f.head[v][f.iter[v]]
		w := f.to[e]
		if f.cap[e] <= 0 || f.level[w] != f.level[v]+1 {
			continue
		}
		if got := f.dfs(w, t, min(limit, f.cap[e])); got > 0 {
			f.cap[e] -= got
			f.cap[e^1] += got
			return got
		}
	}
	return 0
}

func (f *flow) max(s, t int) int64 {
	var total int64
	for f.bfs(s, t) {
		f.iter = make([]int, len(f.head))
		for {
			got := f.dfs(s, t, int64(1)<<62)
			if got == 0 {
				break
			}
			total += got
		}
	}
	return total
}
