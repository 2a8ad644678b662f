package main

import (
	"cmp"
	"slices"
	"strconv"

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

// maxExactSteps bounds the exact solver; an instance that needs more is
// reported as unsolved rather than with a wrong optimum.
const maxExactSteps = 2_000_000

// Exact returns the most bytes any choice of pods and disks achieves on
// in, order-free: every pod either gets all its claims on disks of one
// node or none. ok is false when the search exceeded its step budget.
// lower is a placement already known to be achievable; it only prunes.
func Exact(in *Input, lower int64) (best int64, ok bool) {
	e := exact{in: in, c: newCluster(in), best: lower, seen: map[string]int64{}}
	e.search(0, 0)
	return e.best, e.steps <= maxExactSteps
}

type exact struct {
	in    *Input
	c     *cluster
	best  int64
	steps int
	// seen maps a state (next pod, free space of every disk) to the most
	// bytes placed on reaching it; reaching it again with no more bytes
	// cannot do better.
	seen  map[string]int64
	key   []byte
	sizes []int64
	disks []int64
	buf   []packing.Disk
	asg   []int
}

func (e *exact) search(pi int, placed int64) {
	if placed > e.best {
		e.best = placed
	}
	if pi == len(e.in.Pods) || e.steps > maxExactSteps {
		return
	}
	e.steps++
	if placed+e.pour(pi) <= e.best {
		return
	}
	k := e.stateKey(pi)
	if p, ok := e.seen[k]; ok && p >= placed {
		return
	}
	e.seen[k] = placed
	pod := &e.in.Pods[pi]
	for n := range e.in.Nodes {
		if e.identicalEarlierNode(n) {
			continue
		}
		e.placeClaims(pi, pod, n, 0, placed)
	}
	// Replicas of one StatefulSet are interchangeable, so some optimum
	// places a prefix of each run of identical pods: skipping this pod
	// skips its identical successors too.
	next := pi + 1
	for next < len(e.in.Pods) && sameClaims(&e.in.Pods[next], pod) {
		next++
	}
	e.search(next, placed)
}

func sameClaims(a, b *Pod) bool {
	if len(a.Claims) != len(b.Claims) {
		return false
	}
	for i := range a.Claims {
		if a.Claims[i].Size != b.Claims[i].Size {
			return false
		}
	}
	return true
}

// pour is the fractional bound (see FractionalBound) of pods[pi:] on the
// disks as they are now, counting only pods that still fit on some node.
func (e *exact) pour(pi int) int64 {
	e.sizes = e.sizes[:0]
	for i := pi; i < len(e.in.Pods); i++ {
		claims := e.in.Pods[i].Claims
		if len(e.asg) < len(claims) {
			e.asg = make([]int, len(claims))
		}
		for n := range e.in.Nodes {
			e.buf = e.c.disks(n, e.buf)
			if packing.Pack(e.buf, claims, packing.Options{}, e.asg[:len(claims)]) {
				for _, c := range claims {
					e.sizes = append(e.sizes, c.Size)
				}
				break
			}
		}
	}
	e.disks = e.disks[:0]
	for _, f := range e.c.free {
		e.disks = append(e.disks, f...)
	}
	return pourBytes(e.sizes, e.disks)
}

// stateKey encodes the next pod and every disk's free space.
func (e *exact) stateKey(pi int) string {
	e.key = strconv.AppendInt(e.key[:0], int64(pi), 36)
	for _, f := range e.c.free {
		e.key = append(e.key, '|')
		for _, x := range f {
			e.key = strconv.AppendInt(e.key, x>>20, 36)
			e.key = append(e.key, ',')
		}
	}
	return string(e.key)
}

// identicalEarlierNode reports whether an earlier node has the same free
// space on every disk: placing the pod there leads to the same
// sub-problem.
func (e *exact) identicalEarlierNode(n int) bool {
	for o := 0; o < n; o++ {
		if slices.Equal(e.c.free[o], e.c.free[n]) {
			return true
		}
	}
	return false
}

// placeClaims tries every disk of node n for claim ci of the pod, then
// recurses to the next claim and finally the next pod.
func (e *exact) placeClaims(pi int, pod *Pod, n, ci int, placed int64) {
	if ci == len(pod.Claims) {
		e.search(pi+1, placed+pod.Bytes())
		return
	}
	size := pod.Claims[ci].Size
	free := e.c.free[n]
	for d := range free {
		if free[d] < size || slices.Contains(free[:d], free[d]) {
			continue
		}
		free[d] -= size
		e.placeClaims(pi, pod, n, ci+1, placed)
		free[d] += size
	}
}
