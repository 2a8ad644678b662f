package main

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/diskfit/diskfit/scheduler-plugin/packing"
)

// Bound is an upper bound on the bytes any placement of the input's pods
// can achieve, in any order.
type Bound struct {
	// FreeBytes is the cluster's free space: the trivial bound.
	FreeBytes int64
	// Bytes is the fractional bound: pods that fit on no node of the empty
	// cluster are dropped (they never fit later), then the remaining
	// claims are poured into the disks, a claim only into disks whose free
	// space is at least its size, and splitting a claim across such disks
	// is allowed. It ignores that a pod's claims share one node and that
	// a claim takes one disk, so no real placement exceeds it.
	Bytes int64
	// Infeasible counts the dropped pods.
	Infeasible int
}

// FractionalBound computes the Bound of in.
//
// Eligibility is nested (a disk large enough for a claim is large enough
// for every smaller one), so pouring the largest claims first into the
// pool of disks eligible for them, and letting smaller claims use what is
// left of that pool plus the disks that become eligible, is a maximum
// flow: a byte given to a large claim could have served a smaller claim
// only on a disk the smaller claim may also use.
func FractionalBound(in *Input) Bound {
	c := newCluster(in)
	b := Bound{FreeBytes: in.FreeBytes()}
	var sizes []int64
	var buf []packing.Disk
	assign := make([]int, 8)
	for pi := range in.Pods {
		claims := in.Pods[pi].Claims
		if len(assign) < len(claims) {
			assign = make([]int, len(claims))
		}
		fits := false
		for n := range in.Nodes {
			buf = c.disks(n, buf)
			if packing.Pack(buf, claims, packing.Options{}, assign[:len(claims)]) {
				fits = true
				break
			}
		}
		if !fits {
			b.Infeasible++
			continue
		}
		for _, cl := range claims {
			sizes = append(sizes, cl.Size)
		}
	}
	var disks []int64
	for _, f := range c.free {
		disks = append(disks, f...)
	}
	b.Bytes = pourBytes(sizes, disks)
	return b
}

// pourBytes pours claims of the given sizes into disks of the given free
// space, a claim only into disks at least its size, largest claims first;
// it sorts both slices.
func pourBytes(sizes, disks []int64) int64 {
	slices.SortFunc(sizes, func(a, b int64) int { return cmp.Compare(b, a) })
	slices.SortFunc(disks, func(a, b int64) int { return cmp.Compare(b, a) })
	var pool, total int64
	next := 0
	for _, s := range sizes {
		for next < len(disks) && disks[next] >= s {
			pool += disks[next]
			next++
		}
		take := min(s, pool)
		total += take
		pool -= take
	}
	return total
}

// maxExactSteps bounds the exact solver's work; an input that needs more
// is reported as unsolved rather than with a wrong optimum.
const maxExactSteps = 5_000_000

// podType is a run of interchangeable pods: StatefulSet replicas with the
// same claim sizes.
type podType struct {
	sizes []int64 // largest first
	bytes int64
	count int
}

// Exact returns the most bytes any choice of pods and disks achieves on
// in, order-free: every chosen pod gets all its claims on disks of one
// node. ok is false when the search exceeded its step budget.
//
// Pods with the same claim sizes are interchangeable, so a node's share
// is a vector of counts per pod type. For every node it lists the count
// vectors whose claims fit its disks (an exact bin-packing check), then
// combines the nodes by dynamic programming over the counts still
// available.
func Exact(in *Input) (best int64, ok bool) {
	var types []podType
	index := map[string]int{}
	for i := range in.Pods {
		p := &in.Pods[i]
		key := fmt.Sprint(podSizes(p))
		t, seen := index[key]
		if !seen {
			t = len(types)
			index[key] = t
			types = append(types, podType{sizes: podSizes(p), bytes: p.Bytes()})
		}
		types[t].count++
	}
	// States are the counts still available, in a mixed radix.
	radix := make([]int, len(types))
	states := 1
	for i, t := range types {
		radix[i] = states
		states *= t.count + 1
		if states > 1<<22 {
			return 0, false
		}
	}
	full := 0
	for i, t := range types {
		full += t.count * radix[i]
	}
	steps := 0
	dp := map[int]int64{full: 0}
	for n := range in.Nodes {
		free := make([]int64, len(in.Nodes[n].Disks))
		for j, d := range in.Nodes[n].Disks {
			free[j] = d.Free
		}
		shares := nodeShares(free, types, &steps)
		if steps > maxExactSteps {
			return 0, false
		}
		next := make(map[int]int64, len(dp))
		for state, bytes := range dp {
			for _, sh := range shares {
				// A node's feasible sets are closed under removing pods, so
				// a maximal share capped at what is still available is
				// feasible too.
				ns, b := state, bytes
				for i := range types {
					c := min(sh.counts[i], state/radix[i]%(types[i].count+1))
					ns -= c * radix[i]
					b += int64(c) * types[i].bytes
				}
				if old, seen := next[ns]; !seen || b > old {
					next[ns] = b
				}
				if steps++; steps > maxExactSteps {
					return 0, false
				}
			}
		}
		dp = next
	}
	for _, b := range dp {
		best = max(best, b)
	}
	return best, true
}

func podSizes(p *Pod) []int64 {
	out := make([]int64, len(p.Claims))
	for i, c := range p.Claims {
		out[i] = c.Size
	}
	return out
}

// share is how many pods of each type one node takes.
type share struct {
	counts []int
	bytes  int64
}

// nodeShares lists the maximal count vectors whose claims fit together
// on disks with the given free space. Adding a pod never makes an infeasible set
// fit, so each type's count grows only while the set still fits.
func nodeShares(free []int64, types []podType, steps *int) []share {
	var out []share
	counts := make([]int, len(types))
	var sizes []int64
	var walk func(t int, bytes int64)
	walk = func(t int, bytes int64) {
		if *steps > maxExactSteps {
			return
		}
		if t == len(types) {
			// Keep only maximal vectors: the caller caps them by what is
			// still available.
			for u := range types {
				if counts[u] < types[u].count && binPack(free, append(sizes[:len(sizes):len(sizes)], types[u].sizes...), steps) {
					return
				}
			}
			out = append(out, share{counts: slices.Clone(counts), bytes: bytes})
			return
		}
		walk(t+1, bytes)
		mark := len(sizes)
		for c := 1; c <= types[t].count; c++ {
			sizes = append(sizes, types[t].sizes...)
			if !binPack(free, sizes, steps) {
				break
			}
			counts[t] = c
			walk(t+1, bytes+int64(c)*types[t].bytes)
		}
		counts[t] = 0
		sizes = sizes[:mark]
	}
	walk(0, 0)
	return out
}

// binPack reports whether items of the given sizes fit into bins with the
// given free space, each item whole in one bin. It searches exhaustively,
// largest items first; equal items go to bins in non-decreasing order and
// bins of equal free space are tried once, which only removes mirror
// images of the same packing. It gives up (false, with *steps past
// maxExactSteps) when the budget is spent.
func binPack(free, sizes []int64, steps *int) bool {
	items := slices.Clone(sizes)
	slices.SortFunc(items, func(a, b int64) int { return cmp.Compare(b, a) })
	bins := slices.Clone(free)
	binOf := make([]int, len(items))
	smallest := items[len(items)-1]
	var need int64
	for _, s := range items {
		need += s
	}
	var place func(i int, need int64) bool
	place = func(i int, need int64) bool {
		if i == len(items) {
			return true
		}
		*steps++
		if *steps > maxExactSteps {
			return false
		}
		// Space in bins too full for even the smallest item is lost.
		var have int64
		for _, f := range bins {
			if f >= smallest {
				have += f
			}
		}
		if need > have {
			return false
		}
		start := 0
		if i > 0 && items[i] == items[i-1] {
			start = binOf[i-1]
		}
		for b := start; b < len(bins); b++ {
			if bins[b] < items[i] || slices.Contains(bins[start:b], bins[b]) {
				continue
			}
			bins[b] -= items[i]
			binOf[i] = b
			ok := place(i+1, need-items[i])
			bins[b] += items[i]
			if ok {
				return true
			}
		}
		return false
	}
	return place(0, need)
}
