package packing

import (
	"math"
	"math/bits"
)

// Exact search by disk completion. Disks are filled one at a time, in the
// strategy's preference order; for each disk the search picks the set of
// remaining claims it takes, then moves on to the next disk. This is
// exact and fast on tight nodes (demand close to the free total), where
// claim-by-claim search wanders:
//
//   - Waste bound: the free space a disk is left with once the search moves
//     past it is lost. The search stops a branch when the space lost so far
//     exceeds the node's slack (usable free space minus demand).
//   - Deadlines: the disks not yet filled still have all their free space,
//     so each claim has a last disk it fits on; there it must be taken.
//   - Maximal sets only: a set that leaves room for a claim it skipped is
//     not tried (moving that claim onto the disk never hurts).
//   - Equal claims (size, class, disk) are interchangeable: of a group, a
//     disk takes the first ones still open, never a later one instead.
//   - Memo: a state is the next disk and the set of claims left (the space
//     lost follows from these); failed states are remembered.

// maxBinClaims is the most claims the disk-completion search handles: sets
// of claims are bit masks.
const maxBinClaims = 32

// memoSlots is the size of the failed-state table (open addressing, kept
// inline so the search does not allocate); past three quarters full, new
// states are no longer remembered, which costs time, never exactness.
const memoSlots = 1 << 11

type binSearch struct {
	claims []Claim
	n      int
	m      int // disks taking part, positions 0..m-1
	disk   [MaxInlineDisks]int
	room   [MaxInlineDisks]int64  // usable free space of the disk at a position
	allow  [MaxInlineDisks]uint32 // claims that may go on it and fit alone
	due    [MaxInlineDisks]uint32 // claims for which it is the last such disk
	same   [maxBinClaims]uint32   // earlier claims equal to claim i
	chosen [MaxInlineDisks]uint32
	steps  int
	out    bool // ran out of steps
	used   int
	memo   [memoSlots]uint64
}

// binPack runs the disk-completion search. It reports whether the claims
// fit and, when they do not, whether that is proven (false when the step
// budget ran out). It handles nodes of at most MaxInlineDisks disks and
// maxBinClaims claims; others report unproven.
func binPack(disks []Disk, claims []Claim, strategy Strategy, assign []int) (fits, proven bool) {
	if len(disks) > MaxInlineDisks || len(claims) > maxBinClaims {
		return false, false
	}
	s := &binSearch{claims: claims, n: len(claims)}
	// Positions: disks some claim may use, in preference order (ties keep
	// the earlier disk).
	for di := range disks {
		var mask uint32
		var sum int64
		for ci := range claims {
			if claims[ci].Size <= disks[di].Free && claims[ci].allows(&disks[di]) {
				mask |= 1 << ci
				sum = SatAdd(sum, claims[ci].Size)
			}
		}
		if mask == 0 {
			continue
		}
		p := s.m
		s.m++
		// The disk can never hold more than every claim it may take.
		r := min(disks[di].Free, sum)
		for p > 0 && better(strategy, disks[di].Free, disks[s.disk[p-1]].Free) {
			s.disk[p], s.room[p], s.allow[p] = s.disk[p-1], s.room[p-1], s.allow[p-1]
			p--
		}
		s.disk[p], s.room[p], s.allow[p] = di, r, mask
	}
	var demand, supply int64
	for ci := range claims {
		demand = SatAdd(demand, claims[ci].Size)
		last := -1
		for p := s.m - 1; p >= 0; p-- {
			if s.allow[p]&(1<<ci) != 0 {
				last = p
				break
			}
		}
		if last < 0 {
			return false, true
		}
		s.due[last] |= 1 << ci
		for cj := range ci {
			if claims[cj].Size == claims[ci].Size && claims[cj].DeviceClass == claims[ci].DeviceClass && claims[cj].Disk == claims[ci].Disk {
				s.same[ci] |= 1 << cj
			}
		}
	}
	for p := range s.m {
		supply = SatAdd(supply, s.room[p])
	}
	slack := SatSub(supply, demand)
	if supply == math.MaxInt64 {
		// The sum saturated: the real slack is unknown, so no waste bound.
		slack = math.MaxInt64
	}
	if slack < 0 {
		return false, true
	}
	all := uint32(1)<<s.n - 1
	if s.n == maxBinClaims {
		all = ^uint32(0)
	}
	if !s.fill(0, all, slack) {
		return false, !s.out
	}
	for p := range s.m {
		for ci := range s.n {
			if s.chosen[p]&(1<<ci) != 0 {
				assign[ci] = s.disk[p]
			}
		}
	}
	return true, true
}

// fill places the claims in left on the disks from position p on, losing
// at most slack bytes of free space.
func (s *binSearch) fill(p int, left uint32, slack int64) bool {
	if left == 0 {
		return true
	}
	if p == s.m {
		return false
	}
	key := uint64(p+1)<<32 | uint64(left)
	if s.failed(key) {
		return false
	}
	s.steps++
	if s.steps > maxSearchSteps {
		s.out = true
		return false
	}
	must := s.due[p] & left
	var mustSum int64
	for m := must; m != 0; m &= m - 1 {
		mustSum = SatAdd(mustSum, s.claims[trailingZeros(m)].Size)
	}
	if mustSum <= s.room[p] {
		// Candidates, largest first (claims are sorted), with the sum of
		// each candidate and those after it.
		var cand [maxBinClaims]int
		var after [maxBinClaims + 1]int64
		k := 0
		for m := s.allow[p] & left &^ must; m != 0; m &= m - 1 {
			cand[k] = trailingZeros(m)
			k++
		}
		for j := k - 1; j >= 0; j-- {
			after[j] = SatAdd(after[j+1], s.claims[cand[j]].Size)
		}
		if s.pick(p, left, slack, cand[:k], after[:k+1], 0, must, mustSum, 0, -1) {
			return true
		}
	}
	if !s.out {
		s.remember(key)
	}
	return false
}

// pick decides for cand[j:] whether disk p takes them, then fills the next
// disk. set is what p takes so far (sum bytes), skipped the candidates it
// left out, smallest the size of the smallest of those (-1: none).
func (s *binSearch) pick(p int, left uint32, slack int64, cand []int, after []int64, j int, set uint32, sum int64, skipped uint32, smallest int64) bool {
	room := s.room[p]
	if j == len(cand) {
		rest := room - sum
		if rest > slack || (smallest >= 0 && smallest <= rest) {
			return false
		}
		s.chosen[p] = set
		return s.fill(p+1, left&^set, slack-rest)
	}
	// Even taking every remaining candidate would lose too much.
	if room-SatAdd(sum, after[j]) > slack {
		return false
	}
	ci := cand[j]
	size := s.claims[ci].Size
	if size <= room-sum && skipped&s.same[ci] == 0 {
		if s.pick(p, left, slack, cand, after, j+1, set|1<<ci, sum+size, skipped, smallest) {
			return true
		}
		if s.out {
			return false
		}
	}
	if smallest < 0 || size < smallest {
		smallest = size
	}
	return s.pick(p, left, slack, cand, after, j+1, set, sum, skipped|1<<ci, smallest)
}

func (s *binSearch) failed(key uint64) bool {
	for i := hashSlot(key); ; i = (i + 1) & (memoSlots - 1) {
		switch s.memo[i] {
		case key:
			return true
		case 0:
			return false
		}
	}
}

func (s *binSearch) remember(key uint64) {
	if s.used >= memoSlots*3/4 {
		return
	}
	i := hashSlot(key)
	for s.memo[i] != 0 {
		i = (i + 1) & (memoSlots - 1)
	}
	s.memo[i] = key
	s.used++
}

func hashSlot(key uint64) uint64 {
	return (key * 0x9E3779B97F4A7C15) >> 53 & (memoSlots - 1)
}

func trailingZeros(m uint32) int {
	return bits.TrailingZeros32(m)
}
