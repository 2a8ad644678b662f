package main

import (
	"math/rand/v2"
	"time"

	"github.com/diskfit/diskfit/scheduler-plugin/packing"
)

// model is one way of placing pods: the scheduler's Filter and Score over
// its view of the cluster, and who chooses each volume's disk.
type model interface {
	// filter reports whether the scheduler would let claims go to node n.
	filter(n int, claims []packing.Claim) bool
	// score rates node n for claims; higher wins.
	score(n int, claims []packing.Claim) int64
	// reserve returns the disk index the scheduler chose per claim on node
	// n, or nil when the driver chooses (no diskfit.io/selected-disk).
	reserve(pod *Pod, n int, claims []packing.Claim) []int
	// unreserve releases what reserve holds for a pod whose provisioning
	// failed, as Unreserve does when external-provisioner gives up.
	unreserve(pod *Pod)
	// provisioned reports a volume made on node n, disk d: the PV and the
	// node plugin's DiskNode update the scheduler then sees.
	provisioned(n, d int, c *packing.Claim)
	// deleted reports a volume deleted from node n, disk d: the PV's
	// deletion and the node plugin's DiskNode update.
	deleted(n, d int, c *packing.Claim)
}

// cluster is the truth: what every disk really has free, which is what
// the driver checks in CreateVolume.
type cluster struct {
	in   *Input
	free [][]int64
}

func newCluster(in *Input) *cluster {
	c := &cluster{in: in, free: make([][]int64, len(in.Nodes))}
	for i, n := range in.Nodes {
		c.free[i] = make([]int64, len(n.Disks))
		for j, d := range n.Disks {
			c.free[i][j] = d.Free
		}
	}
	return c
}

// disks returns node n's disks with their current free space.
func (c *cluster) disks(n int, buf []packing.Disk) []packing.Disk {
	buf = append(buf[:0], c.in.Nodes[n].Disks...)
	for j := range buf {
		buf[j].Free = c.free[n][j]
	}
	return buf
}

// capacity is what the driver's GetCapacity publishes for node n and a
// StorageClass of the device class ("" for any disk):
// CSIStorageCapacity.capacity (total free) and maximumVolumeSize (largest
// single-disk free), over the disks of that class.
func (c *cluster) capacity(n int, class string) (total, largest int64) {
	for j, f := range c.free[n] {
		if class != "" && c.in.Nodes[n].Disks[j].DeviceClass != class {
			continue
		}
		total += f
		largest = max(largest, f)
	}
	return total, largest
}

// bestFitDisk is the driver's own choice for a volume without a disk
// annotation (csi-driver/driver/placement.go placeVolume): the disk of
// the claim's device class with the least free space that still holds the
// volume, the first on ties; -1 is ResourceExhausted.
func (c *cluster) bestFitDisk(n int, cl *packing.Claim) int {
	best := -1
	for j, f := range c.free[n] {
		if f >= cl.Size && (cl.DeviceClass == "" || c.in.Nodes[n].Disks[j].DeviceClass == cl.DeviceClass) &&
			(best < 0 || f < c.free[n][best]) {
			best = j
		}
	}
	return best
}

// fragmentation is the share of the free space that lies in each node's
// largest hole: Σ over nodes of the largest free disk over Σ of all free.
// 1 means every node's free space is in one disk; the lower it is, the
// more free space is scattered over holes a large claim cannot use.
func (c *cluster) fragmentation() float64 {
	var largest, total int64
	for n := range c.free {
		t, l := c.capacity(n, "")
		total += t
		largest += l
	}
	if total == 0 {
		return 1
	}
	return float64(largest) / float64(total)
}

// Options configure a run.
type Options struct {
	// PercentageOfNodesToScore is kube-scheduler's setting; 0 is its
	// adaptive default.
	PercentageOfNodesToScore int32
	// MaxReschedules bounds the reschedules of one pod; past it the pod
	// stays Pending.
	MaxReschedules int
	// Seed drives the scheduler's tie-breaks.
	Seed uint64
}

// Result is what one model achieved on one input.
type Result struct {
	Model string
	// Placed counts pods with every volume made; PlacedBytes sums their
	// claims.
	Placed      int
	PlacedBytes int64
	// Pending counts pods never placed; Stuck are those among them with
	// some volumes made on a node that cannot take the rest, and
	// StrandedBytes is the space those volumes hold for no running pod.
	Pending       int
	Stuck         int
	StrandedBytes int64
	// ResourceExhausted counts CreateVolume calls that found no room;
	// Reschedules counts the scheduling attempts they caused.
	ResourceExhausted int
	Reschedules       int
	// PendingCouldFit counts pending pods whose claims would all fit
	// together on some node at the end of the run.
	PendingCouldFit int
	// FirstPendingAt is the bytes the stream had requested before the
	// first pod that was left Pending: how full the cluster could be made
	// before it first refused a pod.
	FirstPendingAt int64
	// Elapsed is the wall time of the run.
	Elapsed time.Duration
}

// minFeasibleNodesToFind and minFeasibleNodesPercentageToFind are
// kube-scheduler's constants (pkg/scheduler/schedule_one.go).
const (
	minFeasibleNodesToFind           = 100
	minFeasibleNodesPercentageToFind = 5
)

// numFeasibleNodesToFind is kube-scheduler's rule for how many feasible
// nodes it looks for before scoring: in a large cluster it stops early, so
// a pod is scored against a rotating part of the cluster, not all of it.
func numFeasibleNodesToFind(percentage int32, numAllNodes int32) int32 {
	if numAllNodes < minFeasibleNodesToFind {
		return numAllNodes
	}
	if percentage == 0 {
		percentage = max(int32(50)-numAllNodes/125, minFeasibleNodesPercentageToFind)
	}
	n := numAllNodes * percentage / 100
	return max(n, minFeasibleNodesToFind)
}

// scheduler is the part of kube-scheduler every model shares: where the
// search for feasible nodes starts, how many it looks for, and the
// random choice among the best-scoring ones.
type scheduler struct {
	pct      int32
	next     int
	rng      *rand.Rand
	feasible []int
}

// schedule returns the node for claims, or -1 when no node passes filter.
// skip excludes nodes; pinned >= 0 restricts the pod to one node, as the
// node affinity of already provisioned local PVs does.
func (s *scheduler) schedule(m model, numNodes int, claims []packing.Claim, skip map[int]bool, pinned int) int {
	if pinned >= 0 {
		if m.filter(pinned, claims) {
			return pinned
		}
		return -1
	}
	want := int(numFeasibleNodesToFind(s.pct, int32(numNodes)))
	s.feasible = s.feasible[:0]
	processed := 0
	for i := 0; i < numNodes && len(s.feasible) < want; i++ {
		n := (s.next + i) % numNodes
		processed++
		if !skip[n] && m.filter(n, claims) {
			s.feasible = append(s.feasible, n)
		}
	}
	s.next = (s.next + processed) % numNodes
	switch len(s.feasible) {
	case 0:
		return -1
	case 1:
		// kube-scheduler skips scoring for a single feasible node.
		return s.feasible[0]
	}
	// selectHost: the highest score, ties broken uniformly at random by
	// reservoir sampling.
	best, bestScore, ties := -1, int64(0), 0
	for _, n := range s.feasible {
		sc := m.score(n, claims)
		switch {
		case best < 0 || sc > bestScore:
			best, bestScore, ties = n, sc, 1
		case sc == bestScore:
			ties++
			if s.rng.IntN(ties) == 0 {
				best = n
			}
		}
	}
	return best
}

// Run schedules the input's pods one at a time, in stream order, with m,
// and makes each volume as the driver would. A pod that no node passes is
// left Pending for good: free space only shrinks during a run, so it
// would never pass later either.
func Run(name string, in *Input, c *cluster, m model, opts Options) Result {
	start := time.Now()
	res := Result{Model: name}
	s := &scheduler{pct: opts.PercentageOfNodesToScore, rng: rand.New(rand.NewPCG(opts.Seed, 0x2545f4914f6cdd1d))}
	var pending []int
	var requested int64
	res.FirstPendingAt = -1
	st := podState{}
	for pi := range in.Pods {
		pod := &in.Pods[pi]
		requested += pod.Bytes()
		st.reset(pod)
		placed := st.try(s, m, c, pod, opts.MaxReschedules, &res)
		made := st.made
		if placed {
			res.Placed++
			res.PlacedBytes += pod.Bytes()
			continue
		}
		if res.Pending == 0 {
			res.FirstPendingAt = requested - pod.Bytes()
		}
		res.Pending++
		if made > 0 {
			res.Stuck++
			res.StrandedBytes += made
		}
		pending = append(pending, pi)
	}
	res.PendingCouldFit = couldFit(in, c, pending)
	res.Elapsed = time.Since(start)
	return res
}

// volume is one made volume: its claim and where it is.
type volume struct {
	claim packing.Claim
	n, d  int
}

// podState is what one pod has so far: the claims still without a volume,
// the volumes made, and the node they pin the pod to (-1: none yet).
type podState struct {
	remaining []packing.Claim
	made      int64
	vols      []volume
	pinned    int
}

// reset starts a pod with no volume made.
func (st *podState) reset(pod *Pod) {
	st.remaining = append(st.remaining[:0], pod.Claims...)
	st.made, st.vols, st.pinned = 0, st.vols[:0], -1
}

// try schedules the pod's remaining claims and makes their volumes as the
// driver would, rescheduling up to maxReschedules times after a
// ResourceExhausted; it reports whether every claim now has a volume.
func (st *podState) try(s *scheduler, m model, c *cluster, pod *Pod, maxReschedules int, res *Result) bool {
	var skip map[int]bool
	for attempt := 0; ; attempt++ {
		n := s.schedule(m, len(c.in.Nodes), st.remaining, skip, st.pinned)
		if n < 0 {
			return false
		}
		chosen := m.reserve(pod, n, st.remaining)
		failed := st.remaining[:0:0]
		for ci := range st.remaining {
			cl := &st.remaining[ci]
			d := -1
			if chosen != nil {
				// The driver honours the annotated disk or refuses.
				if d = chosen[ci]; c.free[n][d] < cl.Size {
					d = -1
				}
			} else {
				d = c.bestFitDisk(n, cl)
			}
			if d < 0 {
				res.ResourceExhausted++
				failed = append(failed, *cl)
				continue
			}
			c.free[n][d] -= cl.Size
			st.made += cl.Size
			st.vols = append(st.vols, volume{claim: *cl, n: n, d: d})
			m.provisioned(n, d, cl)
		}
		if len(failed) == 0 {
			st.remaining = st.remaining[:0]
			return true
		}
		m.unreserve(pod)
		if attempt >= maxReschedules {
			st.remaining = append(st.remaining[:0], failed...)
			return false
		}
		res.Reschedules++
		if len(failed) < len(st.remaining) {
			// Bound local PVs pin the pod to this node.
			st.pinned = n
		} else {
			// Nothing was made: external-provisioner drops
			// selected-node and the scheduler tries again. A real
			// scheduler would see the same inputs and could pick the
			// same node again; skipping it is generous to the model.
			if skip == nil {
				skip = map[int]bool{}
			}
			skip[n] = true
		}
		st.remaining = append(st.remaining[:0], failed...)
	}
}

// couldFit counts the pods whose claims all fit together on some node of
// c, checked exactly with packing.Pack (exhaustive for up to
// packing.DefaultMaxExactClaims claims).
func couldFit(in *Input, c *cluster, pods []int) int {
	var buf []packing.Disk
	assign := make([]int, 8)
	count := 0
	for _, pi := range pods {
		claims := in.Pods[pi].Claims
		if len(assign) < len(claims) {
			assign = make([]int, len(claims))
		}
		for n := range in.Nodes {
			buf = c.disks(n, buf)
			if packing.Pack(buf, claims, packing.Options{}, assign[:len(claims)]) {
				count++
				break
			}
		}
	}
	return count
}
