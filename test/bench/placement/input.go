package main

import (
	"fmt"
	"math/rand/v2"

	"github.com/diskfit/diskfit/scheduler-plugin/packing"
)

const (
	gi = int64(1) << 30
	ti = int64(1) << 40
)

// Node is one node of the synthetic cluster with its disks as the node
// plugin first reports them: Free already excludes pre-existing usage.
type Node struct {
	Name  string
	Disks []packing.Disk
}

// Pod is one StatefulSet replica with its claims, largest first
// (packing.SortClaims), as the plugin's PreFilter would hold them.
type Pod struct {
	Name   string
	Claims []packing.Claim
}

// Bytes is the sum of the pod's claim sizes.
func (p *Pod) Bytes() int64 {
	var b int64
	for _, c := range p.Claims {
		b += c.Size
	}
	return b
}

// Input is one simulation input: every model runs on exactly this.
type Input struct {
	Nodes []Node
	Pods  []Pod
}

// FreeBytes is the cluster's total free space before the stream starts.
func (in *Input) FreeBytes() int64 {
	var b int64
	for _, n := range in.Nodes {
		for _, d := range n.Disks {
			b += d.Free
		}
	}
	return b
}

// StreamBytes is the sum of every pod's claims.
func (in *Input) StreamBytes() int64 {
	var b int64
	for i := range in.Pods {
		b += in.Pods[i].Bytes()
	}
	return b
}

// InputConfig shapes a synthetic input.
type InputConfig struct {
	// Nodes is the number of nodes.
	Nodes int
	// MinDisks and MaxDisks bound the disks per node (uniform).
	MinDisks, MaxDisks int
	// MaxUsed is the largest pre-existing used fraction of a disk; each
	// disk's used fraction is uniform in [0, MaxUsed].
	MaxUsed float64
	// Load is the stream's requested bytes over the cluster's free bytes.
	// Above 1 the stream outlasts the cluster, so it ends full.
	Load float64
	// Seed makes the input reproducible.
	Seed uint64
	// DiskSizes and ClaimSizes override the size distributions when not
	// nil.
	DiskSizes, ClaimSizes []weighted
}

// weighted is one choice of a discrete distribution.
type weighted struct {
	value  int64
	weight int
}

func pick(r *rand.Rand, choices []weighted) int64 {
	total := 0
	for _, c := range choices {
		total += c.weight
	}
	x := r.IntN(total)
	for _, c := range choices {
		if x < c.weight {
			return c.value
		}
		x -= c.weight
	}
	panic("unreachable")
}

// diskSizes mixes small fast disks with large slow ones, as nodes bought
// over several years do; 8Ti is rare, so a 2Ti claim has few homes.
var diskSizes = []weighted{
	{512 * gi, 2}, {1 * ti, 3}, {2 * ti, 3}, {4 * ti, 2}, {8 * ti, 1},
}

// claimSizes has many small volumes (logs, caches), fewer medium ones and
// some large ones (databases) that need most of a disk.
var claimSizes = []weighted{
	{10 * gi, 14}, {20 * gi, 14}, {50 * gi, 14}, {100 * gi, 13},
	{200 * gi, 10}, {300 * gi, 10}, {500 * gi, 10},
	{750 * gi, 5}, {1 * ti, 4}, {1536 * gi, 3}, {2 * ti, 3},
}

// claimsPerPod: most StatefulSets have one volume (data), some two
// (data, log), a few three (data, log, backup).
var claimsPerPod = []weighted{{1, 5}, {2, 3}, {3, 2}}

func deviceClass(capacity int64) string {
	switch {
	case capacity <= 1*ti:
		return "nvme"
	case capacity <= 4*ti:
		return "ssd"
	default:
		return "hdd"
	}
}

// Generate builds a cluster and a stream of StatefulSet pods. The stream
// is StatefulSets one after another, each with 1 to 6 replicas sharing one
// claim template, until the requested bytes reach Load times the free
// bytes. Claims carry no device class: every model may use any disk.
func Generate(cfg InputConfig) *Input {
	r := rand.New(rand.NewPCG(cfg.Seed, 0x9e3779b97f4a7c15))
	in := &Input{Nodes: make([]Node, cfg.Nodes)}
	sizes := cfg.DiskSizes
	if sizes == nil {
		sizes = diskSizes
	}
	claimChoices := cfg.ClaimSizes
	if claimChoices == nil {
		claimChoices = claimSizes
	}
	for i := range in.Nodes {
		n := &in.Nodes[i]
		n.Name = fmt.Sprintf("node-%04d", i)
		k := cfg.MinDisks + r.IntN(cfg.MaxDisks-cfg.MinDisks+1)
		for j := 0; j < k; j++ {
			capacity := pick(r, sizes)
			used := int64(r.Float64()*cfg.MaxUsed*float64(capacity/gi)) * gi
			n.Disks = append(n.Disks, packing.Disk{
				Name:        fmt.Sprintf("disk%d", j),
				DeviceClass: deviceClass(capacity),
				Capacity:    capacity,
				Free:        capacity - used,
				Healthy:     true,
			})
		}
	}
	target := int64(cfg.Load * float64(in.FreeBytes()))
	var requested int64
	for set := 0; requested < target; set++ {
		replicas := 1 + r.IntN(6)
		template := make([]int64, pick(r, claimsPerPod))
		for i := range template {
			template[i] = pick(r, claimChoices)
		}
		for rep := 0; rep < replicas && requested < target; rep++ {
			p := Pod{Name: fmt.Sprintf("ss%d-%d", set, rep)}
			for ci, size := range template {
				name := fmt.Sprintf("vol%d-ss%d-%d", ci, set, rep)
				p.Claims = append(p.Claims, packing.Claim{Key: name, Name: "default/" + name, Size: size})
			}
			packing.SortClaims(p.Claims)
			requested += p.Bytes()
			in.Pods = append(in.Pods, p)
		}
	}
	return in
}
