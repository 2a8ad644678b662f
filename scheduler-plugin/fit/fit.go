// Package fit is DiskFit's one answer to "does this node fit the pod's
// claims, why not, on which disks, and how well": from the ledger as it is
// now, the packing options, the device-class weights, the DiskNode age limit
// and a clock. The scheduler plugin's Filter and Score, diskfit simulate
// and the placement benchmark all ask it, so they cannot disagree.
//
// Like packing and ledger it is plain Go without the scheduler framework.
// Evaluate does not allocate for a node that fits (up to
// packing.MaxInlineDisks disks and 16 claims).
package fit

import (
	"fmt"
	"time"

	"github.com/diskfit/diskfit/scheduler-plugin/apis/config"
	configv1 "github.com/diskfit/diskfit/scheduler-plugin/apis/config/v1"
	"github.com/diskfit/diskfit/scheduler-plugin/ledger"
	"github.com/diskfit/diskfit/scheduler-plugin/packing"
)

// MaxScore is the score of the best node, kube-scheduler's
// framework.MaxScore (the plugin's tests check they agree); the worst is 0.
const MaxScore = 100

// Reason says whether a node fits and, if not, which check rejected it.
type Reason uint8

const (
	// Fits: every claim has a disk.
	Fits Reason = iota
	// NoDiskNode: the node's driver has not reported its disks.
	NoDiskNode
	// StaleDiskNode: the node's disks were last reported too long ago.
	StaleDiskNode
	// NoSpace: the claims do not fit on the node's disks together.
	NoSpace
)

// Evaluator answers for one configuration. Its fields are read only.
type Evaluator struct {
	// Ledger is the free space of every disk.
	Ledger *ledger.Ledger
	// Options are the packing options (PackingOptions).
	Options packing.Options
	// Weigh weighs the score by device class; nil weighs every class 1.
	Weigh packing.Weigher
	// MaxAge is the oldest DiskNode accepted; 0 accepts any age.
	MaxAge time.Duration
	// Now is the clock for MaxAge; nil is time.Now.
	Now func() time.Time
}

// New returns the evaluator of validated DiskFitArgs on the ledger.
func New(l *ledger.Ledger, args *config.DiskFitArgs, now func() time.Time) *Evaluator {
	return &Evaluator{
		Ledger:  l,
		Options: PackingOptions(args),
		Weigh:   DeviceClassWeigher(args),
		MaxAge:  args.MaxDiskNodeAge.Duration,
		Now:     now,
	}
}

// PackingOptions translates validated args into packing options.
func PackingOptions(args *config.DiskFitArgs) packing.Options {
	opts := packing.Options{Strategy: packing.MostAllocated, MaxExactClaims: int(args.MaxExactClaims)}
	if args.ScoringStrategy.Type == config.LeastAllocated {
		opts.Strategy = packing.LeastAllocated
	}
	if args.MaxExactClaims == 0 {
		// maxExactClaims 0 means "greedy only". packing.Options says that
		// with a negative count: its zero value stands for
		// packing.DefaultMaxExactClaims, the number the args default to.
		opts.MaxExactClaims = -1
	}
	return opts
}

// DeviceClassWeigher translates validated args into the device-class
// weights of the score; nil when no class is weighed.
func DeviceClassWeigher(args *config.DiskFitArgs) packing.Weigher {
	if len(args.ScoringStrategy.DeviceClassWeights) == 0 {
		return nil
	}
	weights := map[string]int64{}
	for _, w := range args.ScoringStrategy.DeviceClassWeights {
		weights[w.DeviceClass] = w.Weight
	}
	return func(class string) int64 {
		if w, ok := weights[class]; ok {
			return w
		}
		return configv1.DefaultDeviceClassWeight
	}
}

// Buffers is the scratch space of Evaluate; the zero value is ready. One
// Buffers serves one evaluation at a time.
type Buffers struct {
	disks  [packing.MaxInlineDisks]packing.Disk
	assign [16]int
}

// Result is the answer for one node. Its slices are in the Buffers given
// to Evaluate.
type Result struct {
	Reason Reason
	// Disks are the node's disks as the ledger has them.
	Disks []packing.Disk
	// Assign is each claim's index into Disks; only when Reason is Fits.
	Assign []int
	// observed and age date the DiskNode, for Message.
	observed time.Time
	age      time.Duration
}

// Evaluate decides whether claims (sorted by packing.SortClaims) fit on
// node's disks.
func (e *Evaluator) Evaluate(node string, claims []packing.Claim, b *Buffers) Result {
	disks, info := e.Ledger.Disks(node, b.disks[:0])
	r := Result{Disks: disks, observed: info.Observed}
	if !info.HasDiskNode {
		r.Reason = NoDiskNode
		return r
	}
	if e.MaxAge > 0 {
		now := time.Now
		if e.Now != nil {
			now = e.Now
		}
		if r.age = now().Sub(info.Observed); info.Observed.IsZero() || r.age > e.MaxAge {
			r.Reason = StaleDiskNode
			return r
		}
	}
	if len(claims) > len(b.assign) {
		r.Assign = make([]int, len(claims))
	} else {
		r.Assign = b.assign[:len(claims)]
	}
	if !packing.Pack(disks, claims, e.Options, r.Assign) {
		r.Reason, r.Assign = NoSpace, nil
	}
	return r
}

// Message says why the node does not fit, for an operator; "" when it
// fits.
func (e *Evaluator) Message(r Result, claims []packing.Claim) string {
	switch r.Reason {
	case NoDiskNode:
		return "no DiskNode, the diskfit node plugin has not reported this node's disks"
	case StaleDiskNode:
		if r.observed.IsZero() {
			return "DiskNode is stale (never refreshed)"
		}
		return fmt.Sprintf("DiskNode is stale (observed %s ago, maximum %s)", r.age.Round(time.Second), e.MaxAge)
	case NoSpace:
		return packing.Explain(r.Disks, claims)
	}
	return ""
}

// Score rates the node from 0 to MaxScore by how its disks would be filled
// by the claims placed as Result says; 0 when they do not fit.
func (e *Evaluator) Score(r Result, claims []packing.Claim) int64 {
	if r.Reason != Fits {
		return 0
	}
	return packing.Score(r.Disks, claims, r.Assign, e.Options.Strategy, e.Weigh, MaxScore)
}
