// Package packing decides whether a set of volume claims fits onto the disks
// of one node, which disk each claim gets, and how good that placement is.
//
// It is plain Go with no scheduler framework underneath, so the DiskFit
// plugin, its ledger and offline simulations all run the same arithmetic.
// The hot entry points (Pack, Score) do not allocate when the caller
// provides the output slice and the node has at most MaxInlineDisks disks.
package packing

import (
	"cmp"
	"math"
	"slices"
)

// Strategy says which disk a claim should prefer among those it fits on.
type Strategy int

const (
	// MostAllocated prefers the disk with the least free space that still
	// fits (best fit), and Score rates the bytes it leaves, keeping large
	// holes free for large volumes later.
	MostAllocated Strategy = iota
	// LeastAllocated prefers the emptiest disk (worst fit), spreading
	// volumes and their IO across disks.
	LeastAllocated
)

// String returns the name used in DiskFitArgs (config.ScoringStrategyType;
// diskfit's TestPackingOptions keeps the two in step).
func (s Strategy) String() string {
	if s == LeastAllocated {
		return "LeastAllocated"
	}
	return "MostAllocated"
}

// ExactClaimsLimit is the most claims for which Pack's exact search is
// built and tested (exact on nodes of up to MaxInlineDisks disks, within
// the step budget on tight nodes); Options.MaxExactClaims above it counts
// as ExactClaimsLimit. DiskFitArgs' maxExactClaims is validated against it.
const ExactClaimsLimit = 16

// DefaultMaxExactClaims is the number of claims up to which Pack searches
// exactly when the greedy placement fails. It is also the default of
// DiskFitArgs' maxExactClaims (scheduler-plugin/apis/config/v1), so there is
// one such number.
const DefaultMaxExactClaims = ExactClaimsLimit

// MaxInlineDisks is the number of disks per node Pack handles without
// allocating scratch space.
const MaxInlineDisks = 32

// legacyExactClaims is the claim count up to which Pack, once the exact
// search found that the claims fit, returns the placement of the
// claim-by-claim search it used before (the first one in the strategy's
// preference order, claim by claim), so such pods land where they did.
const legacyExactClaims = 8

// maxSearchSteps bounds each exact search. On nodes of up to 32 disks with
// up to ExactClaimsLimit claims, tight ones included, the search stays far
// under it (TestTightInstances); it only protects the scheduler from
// adversarial inputs. Running out answers with first-fit decreasing, which
// errs on the safe side.
const maxSearchSteps = 200000

// Disk is one disk of a node as the packer sees it.
type Disk struct {
	// Name is the disk's name within its node.
	Name string
	// DeviceClass is the disk's device class ("" when unclassified).
	DeviceClass string
	// Capacity is the usable size of the disk in bytes.
	Capacity int64
	// Free is what may still be allocated on the disk in bytes, already
	// reduced by every volume, annotated claim and reservation on it.
	Free int64
	// Healthy is false when the disk does not work.
	Healthy bool
	// Unschedulable is true when an admin took the disk out of service
	// for new volumes (DiskNode spec).
	Unschedulable bool
}

// Open reports whether the disk takes new volumes at all.
func (d *Disk) Open() bool {
	return d.Healthy && !d.Unschedulable
}

// Usable reports whether a claim of deviceClass may be placed on d.
func (d *Disk) Usable(deviceClass string) bool {
	return d.Open() && (deviceClass == "" || d.DeviceClass == deviceClass)
}

// Claim is one volume that still needs a disk.
type Claim struct {
	// Key identifies the claim (the PVC's UID in the scheduler).
	Key string
	// Name is a human-readable name for messages (namespace/name).
	Name string
	// Size is the requested size in bytes.
	Size int64
	// DeviceClass restricts the claim to disks of this class; "" means any.
	DeviceClass string
	// Disk restricts the claim to the disk of this name: a volume restored
	// from a snapshot or cloned from another volume is a reflink copy,
	// which only its source's disk can hold. "" means any.
	Disk string
}

// allows reports whether c may be placed on d, free space aside.
func (c *Claim) allows(d *Disk) bool {
	return d.Usable(c.DeviceClass) && (c.Disk == "" || c.Disk == d.Name)
}

// SortClaims orders claims largest first, the order Pack expects. Sorting
// once per pod (in PreFilter) keeps Pack itself free of sorting.
func SortClaims(claims []Claim) {
	slices.SortStableFunc(claims, func(a, b Claim) int {
		if c := cmp.Compare(b.Size, a.Size); c != 0 {
			return c
		}
		return cmp.Compare(a.Key, b.Key)
	})
}

// Options tune Pack.
type Options struct {
	// Strategy picks the preferred disk per claim.
	Strategy Strategy
	// MaxExactClaims is the largest number of claims for which Pack falls
	// back to an exact search when the greedy placement fails; zero means
	// DefaultMaxExactClaims, negative disables the search, and more than
	// ExactClaimsLimit counts as ExactClaimsLimit.
	MaxExactClaims int
}

func (o Options) maxExact() int {
	if o.MaxExactClaims == 0 {
		return DefaultMaxExactClaims
	}
	return min(o.MaxExactClaims, ExactClaimsLimit)
}

// Pack places every claim on one disk so that no disk's Free is exceeded.
// claims must be sorted by SortClaims. On success it returns true and
// assign[i] is the index in disks of claims[i]'s disk; assign must have
// len(claims) entries.
//
// The placement is greedy in claim order (largest first) with the
// strategy's disk preference, which is best-fit decreasing for
// MostAllocated and worst-fit decreasing for LeastAllocated. Only when that
// fails and there are at most MaxExactClaims claims does Pack run an exact
// search (disk completion, see exact.go), so "does not fit" is exact for
// such pods on nodes of up to MaxInlineDisks disks. Beyond that, and
// should the search run out of steps, first-fit decreasing has the last
// word: Pack never rejects a node on which either greedy placement fits.
func Pack(disks []Disk, claims []Claim, opts Options, assign []int) bool {
	fits, _ := pack(disks, claims, opts, assign)
	return fits
}

// pack is Pack that also reports whether the exact search ran out of steps.
func pack(disks []Disk, claims []Claim, opts Options, assign []int) (fits, exhausted bool) {
	if len(claims) == 0 {
		return true, false
	}
	var inline [MaxInlineDisks]int64
	free := inline[:0]
	if len(disks) > MaxInlineDisks {
		free = make([]int64, 0, len(disks))
	}
	for i := range disks {
		free = append(free, disks[i].Free)
	}
	if greedy(disks, claims, opts.Strategy, free, assign) {
		return true, false
	}
	if len(claims) <= opts.maxExact() {
		fits, proven := binPack(disks, claims, opts.Strategy, assign)
		if fits {
			if len(claims) <= legacyExactClaims {
				var keep [legacyExactClaims]int
				copy(keep[:], assign)
				resetFree(disks, free)
				if !legacySearch(disks, claims, opts.Strategy, free, assign) {
					copy(assign, keep[:len(claims)])
				}
			}
			return true, false
		}
		if proven {
			return false, false
		}
		exhausted = true
	}
	resetFree(disks, free)
	return firstFit(disks, claims, free, assign), exhausted
}

func resetFree(disks []Disk, free []int64) {
	for i := range disks {
		free[i] = disks[i].Free
	}
}

// legacySearch is the claim-by-claim search Pack used alone up to 8
// claims: every disk for each claim in preference order, pruning equal
// disks and hopeless branches. It now only chooses among placements once
// binPack has shown that one exists.
func legacySearch(disks []Disk, claims []Claim, strategy Strategy, free []int64, assign []int) bool {
	s := searcher{disks: disks, claims: claims, strategy: strategy, free: free, assign: assign}
	// remaining[i] = Σ sizes of claims[i:], for the capacity bound.
	var rem [legacyExactClaims + 1]int64
	for i := len(claims) - 1; i >= 0; i-- {
		rem[i] = SatAdd(rem[i+1], claims[i].Size)
	}
	s.remaining = rem[:len(claims)+1]
	return s.search(0)
}

// firstFit places claims one by one on the first disk (in the node's
// order) that fits: first-fit decreasing, given sorted claims.
func firstFit(disks []Disk, claims []Claim, free []int64, assign []int) bool {
	for ci := range claims {
		c := &claims[ci]
		placed := false
		for di := range disks {
			if free[di] >= c.Size && c.allows(&disks[di]) {
				free[di] -= c.Size
				assign[ci] = di
				placed = true
				break
			}
		}
		if !placed {
			return false
		}
	}
	return true
}

// better reports whether a disk with free space a is preferred over one with
// b for the strategy. Ties keep the earlier disk, so results are stable.
func better(s Strategy, a, b int64) bool {
	if s == LeastAllocated {
		return a > b
	}
	return a < b
}

// greedy places claims one by one on the preferred disk that fits.
func greedy(disks []Disk, claims []Claim, s Strategy, free []int64, assign []int) bool {
	for ci := range claims {
		c := &claims[ci]
		best := -1
		for di := range disks {
			if free[di] < c.Size || !c.allows(&disks[di]) {
				continue
			}
			if best < 0 || better(s, free[di], free[best]) {
				best = di
			}
		}
		if best < 0 {
			return false
		}
		free[best] -= c.Size
		assign[ci] = best
	}
	return true
}

type searcher struct {
	disks     []Disk
	claims    []Claim
	strategy  Strategy
	free      []int64
	assign    []int
	remaining []int64
	steps     int
}

// search tries every disk for claims[ci] in preference order and recurses.
func (s *searcher) search(ci int) bool {
	if ci == len(s.claims) {
		return true
	}
	s.steps++
	if s.steps > maxSearchSteps {
		return false
	}
	c := &s.claims[ci]
	// Capacity bound: the remaining claims cannot fit if all usable space
	// together is smaller than them.
	var total int64
	for di := range s.disks {
		if s.disks[di].Open() && s.free[di] > 0 {
			total = SatAdd(total, s.free[di])
		}
	}
	if total < s.remaining[ci] {
		return false
	}
	// Candidates in preference order, skipping disks interchangeable with
	// one already tried at this level: they lead to the same sub-problem.
	var candInline [MaxInlineDisks]int
	cand := candInline[:0]
	if len(s.disks) > MaxInlineDisks {
		cand = make([]int, 0, len(s.disks))
	}
	for di := range s.disks {
		if s.free[di] < c.Size || !c.allows(&s.disks[di]) {
			continue
		}
		dup := false
		for _, o := range cand {
			if s.interchangeable(o, di) {
				dup = true
				break
			}
		}
		if dup {
			continue
		}
		// Insertion keeps cand sorted by preference.
		cand = append(cand, di)
		for j := len(cand) - 1; j > 0 && better(s.strategy, s.free[cand[j]], s.free[cand[j-1]]); j-- {
			cand[j], cand[j-1] = cand[j-1], cand[j]
		}
	}
	for _, di := range cand {
		s.free[di] -= c.Size
		s.assign[ci] = di
		if s.search(ci + 1) {
			return true
		}
		s.free[di] += c.Size
	}
	return false
}

// interchangeable reports whether disks a and b are the same to every claim:
// same free space and class, and neither is the one disk a claim is
// restricted to.
func (s *searcher) interchangeable(a, b int) bool {
	if s.free[a] != s.free[b] || s.disks[a].DeviceClass != s.disks[b].DeviceClass {
		return false
	}
	for ci := range s.claims {
		if d := s.claims[ci].Disk; d != "" && (d == s.disks[a].Name || d == s.disks[b].Name) {
			return false
		}
	}
	return true
}

// Weigher returns the score weight of a device class. Nil means weight 1
// for every class.
type Weigher func(deviceClass string) int64

// Score rates a successful assignment from 0 (worst) to maxScore (best).
// Each claim contributes a rating of its disk once every claim of the pod
// is placed, weighted by the claim's device class. For MostAllocated the
// rating is LeftoverScore of the bytes the disk has left, the measure the
// disk choice within the node minimises, so nodes and disks are chosen
// alike: the tightest hole wins whatever the disk's size. For
// LeastAllocated it is 100 minus the disk's utilisation.
func Score(disks []Disk, claims []Claim, assign []int, s Strategy, weigh Weigher, maxScore int64) int64 {
	if len(claims) == 0 {
		return 0
	}
	var placedInline [MaxInlineDisks]int64
	var placed []int64
	if len(disks) > MaxInlineDisks {
		placed = make([]int64, len(disks))
	} else {
		placed = placedInline[:len(disks)]
	}
	for ci := range claims {
		placed[assign[ci]] = SatAdd(placed[assign[ci]], claims[ci].Size)
	}
	var sum, weights int64
	for ci := range claims {
		d := &disks[assign[ci]]
		w := int64(1)
		if weigh != nil {
			w = weigh(claims[ci].DeviceClass)
		}
		if w <= 0 || d.Capacity <= 0 {
			continue
		}
		freeAfter := SatSub(d.Free, placed[assign[ci]])
		if freeAfter < 0 {
			freeAfter = 0
		}
		var rating int64
		if s == LeastAllocated {
			used := d.Capacity - freeAfter
			if used > d.Capacity {
				used = d.Capacity
			}
			// Scale before dividing so small volumes on large disks still
			// register; capacities stay far below 2^63/maxScore.
			rating = maxScore - used*maxScore/d.Capacity
		} else {
			rating = LeftoverScore(freeAfter, maxScore)
		}
		sum += rating * w
		weights += w
	}
	if weights == 0 {
		return 0
	}
	return sum / weights
}

// leftoverOctaves is the number of doublings of the bytes left on a disk,
// counted from 1 GiB, that take LeftoverScore from its maximum to 0: 64 TiB
// or more left scores 0.
const leftoverOctaves = 16

// LeftoverScore rates a disk that has left bytes free after a placement:
// maxScore when it is full, less by maxScore/leftoverOctaves each time
// the leftover doubles, 0 from 64 TiB on. A logarithmic scale tells a 10Gi
// leftover from a 100Gi one as clearly as 1Ti from 10Ti, so a small claim
// goes to the tightest hole of the cluster and large holes stay whole for
// large claims. Utilisation cannot: a half-empty 8Ti disk (4Ti left) rates
// higher than a 512Gi disk with 200Gi left.
func LeftoverScore(left, maxScore int64) int64 {
	if left <= 0 {
		return maxScore
	}
	octaves := math.Log2(1 + float64(left)/float64(1<<30))
	return max(0, maxScore-int64(math.Round(octaves*float64(maxScore)/leftoverOctaves)))
}
