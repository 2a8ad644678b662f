// Package lifecycle is diskfit-controller: it lets claims go from disks
// that are lost, so that StatefulSets move on.
//
// A local volume lives and dies with its disk. When a disk fails for good
// (its node's DiskNode has reported it unhealthy for DiskFailureGrace) or
// its node is gone (its Node deleted and its driver no longer reporting,
// for NodeLossGrace), the claims
// on it whose owner opted in (diskfit.ReleasedOnDiskLoss,
// diskfit.ReleasedOnNodeLoss) are released: the claim and its pod are
// deleted, and a StatefulSet recreates both on a working disk. Claims that
// did not opt in stay; people learn what happened and what to do from
// events on the claim and its pod.
//
// Deleting a claim is final, so the caches only nominate: before anything
// is deleted, a quorum read from the API server must confirm the loss, the
// loss must have lasted its grace time (counted from the first pass that
// saw it; seeing the disk healthy, or the Node or its driver's reports
// again, starts over), and a failed disk's status must be fresh (a node
// that stopped reporting is not a failed disk). Only the elected leader runs passes (cmd/diskfit-controller).
// Released volumes of a failed disk keep their data: their PVs become
// Retain (ReleaseKeepingData).
package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/diskfit/diskfit/apis/client/clientset/versioned"
	dfinformers "github.com/diskfit/diskfit/apis/client/informers/externalversions"
	dflisters "github.com/diskfit/diskfit/apis/client/listers/diskfit/v1alpha1"
	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
)

// Defaults of Options.
const (
	DefaultNodeLossGrace    = 2 * time.Minute
	DefaultDiskFailureGrace = 10 * time.Minute
	DefaultStatusMaxAge     = 2 * time.Minute
	DefaultInterval         = 30 * time.Second
)

// Defaults of Options.MaxNodesWithFailedDisks and Options.MaxLostNodes.
var (
	DefaultMaxNodesWithFailedDisks = intstr.FromString("10%")
	DefaultMaxLostNodes            = intstr.FromString("10%")
)

// Event reasons, on claims, their pods and PVs.
const (
	ReasonDiskFailed       = "DiskFailed"
	ReasonDiskRecovered    = "DiskRecovered"
	ReasonReleased         = "ReleasedFromLostDisk"
	ReasonReleaseFailed    = "ReleaseFailed"
	ReasonReleaseHeld      = "ReleaseHeld"
	ReasonNodeGone         = "NodeGone"
	ReasonReleasedWithNode = "ReleasedWithNode"
)

// Options configure a Controller.
type Options struct {
	// NodeLossGrace is how long a node must stay gone (its Node deleted,
	// its driver not reporting) before its opted-in claims are released.
	NodeLossGrace time.Duration
	// DiskFailureGrace is how long a disk must stay unhealthy before its
	// opted-in claims are released.
	DiskFailureGrace time.Duration
	// StatusMaxAge is how old a DiskNode status may be and still count as
	// the node's word on its disks.
	StatusMaxAge time.Duration
	// Interval is how often a pass runs besides on changes.
	Interval time.Duration
	// MaxNodesWithFailedDisks is on how many nodes (a number, or a
	// percentage of the nodes with a DiskNode, rounded down; at least
	// one) disks may fail at once for claims to be released: beyond it
	// the nodes likely share the cause (a node config or driver rolled out
	// to them), and nothing is released.
	MaxNodesWithFailedDisks intstr.IntOrString
	// MaxLostNodes is how many nodes holding volumes (a number, or a
	// percentage of the nodes whose DiskNode reports volumes, rounded
	// down; at least one) may be lost at once (within LossWindow of each other) for their claims to be
	// released: beyond it one cause likely deleted their Node objects (a
	// cloud controller that cannot see its instances, a script run
	// against the wrong cluster) while the machines and their data may be
	// fine, and nothing of them is released.
	MaxLostNodes intstr.IntOrString
	// Clock is the time source; nil means the real clock.
	Clock clock.WithTicker
}

// Validate returns an error unless every duration is positive.
func (o Options) Validate() error {
	if o.NodeLossGrace <= 0 || o.DiskFailureGrace <= 0 || o.StatusMaxAge <= 0 || o.Interval <= 0 {
		return fmt.Errorf("--node-loss-grace, --disk-failure-grace, --disknode-max-age and --interval must be positive")
	}
	if _, err := intstr.GetScaledValueFromIntOrPercent(&o.MaxNodesWithFailedDisks, 100, false); err != nil {
		return fmt.Errorf("--max-nodes-with-failed-disks: %w", err)
	}
	if _, err := intstr.GetScaledValueFromIntOrPercent(&o.MaxLostNodes, 100, false); err != nil {
		return fmt.Errorf("--max-lost-nodes: %w", err)
	}
	return nil
}

// Controller releases claims of lost disks and nodes.
type Controller struct {
	opts     Options
	client   kubernetes.Interface
	diskfit  versioned.Interface
	recorder events.EventRecorder

	nodes     corelisters.NodeLister
	pvs       corelisters.PersistentVolumeLister
	pvcs      corelisters.PersistentVolumeClaimLister
	classes   storagelisters.StorageClassLister
	diskNodes dflisters.DiskNodeLister
	synced    []cache.InformerSynced
	changed   chan struct{}

	// mu serializes passes.
	mu sync.Mutex
	// nodeGoneSince is when the API server first said gone (disknodes.go)
	// a node with claims to release.
	nodeGoneSince map[string]time.Time
	// firstSeenGone is when a pass first saw gone a node without a
	// DiskNode (lostnodes.go).
	firstSeenGone map[string]time.Time
	// toldHeld holds the lost nodes whose claims were told that their
	// release is held.
	toldHeld sets.Set[string]
	// diskNodeGoneSince is when a pass first saw a DiskNode with an empty
	// spec whose node seems gone (disknodes.go).
	diskNodeGoneSince map[string]time.Time
	// failing holds the disks seen failed in a fresh status.
	failing map[diskfit.Location]*failure
	// notFailing holds the disks seen unhealthy in a fresh status with a
	// reason that says they did not fail.
	notFailing map[diskfit.Location]*notFailing
	// reports holds, per node, the last DiskNode report seen and when,
	// by this controller's clock (reports.go).
	reports map[string]report
	// holding is why releases of failed disks' claims are held, empty
	// when they are not; holdingNodes the same for lost nodes.
	holding, holdingNodes string
}

// failure is one unhealthy disk.
type failure struct {
	since   time.Time
	message string
	// told holds the claims (by UID) already told about the failure.
	told map[string]bool
	// toldHeld is true once its claims were told their release is held.
	toldHeld bool
	// settled is true once a pass past the grace time, releases not
	// held, found no claim of the disk left to release: from then on it
	// no longer counts towards MaxNodesWithFailedDisks.
	settled bool
}

// notFailing is one unhealthy disk that did not fail.
type notFailing struct {
	reason v1alpha1.DiskReason
	// told holds the opted-in claims (by UID) already told that they
	// are not released.
	told map[string]bool
}

// New builds a controller on the given informer factories; start them
// after New and before Run.
func New(client kubernetes.Interface, df versioned.Interface, factory informers.SharedInformerFactory, dfFactory dfinformers.SharedInformerFactory, recorder events.EventRecorder, opts Options) (*Controller, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	c := &Controller{
		opts: opts, client: client, diskfit: df, recorder: recorder,
		nodes:             factory.Core().V1().Nodes().Lister(),
		pvs:               factory.Core().V1().PersistentVolumes().Lister(),
		pvcs:              factory.Core().V1().PersistentVolumeClaims().Lister(),
		classes:           factory.Storage().V1().StorageClasses().Lister(),
		diskNodes:         dfFactory.Diskfit().V1alpha1().DiskNodes().Lister(),
		changed:           make(chan struct{}, 1),
		nodeGoneSince:     map[string]time.Time{},
		firstSeenGone:     map[string]time.Time{},
		toldHeld:          sets.New[string](),
		diskNodeGoneSince: map[string]time.Time{},
		failing:           map[diskfit.Location]*failure{},
		notFailing:        map[diskfit.Location]*notFailing{},
		reports:           map[string]report{},
	}
	kick := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { c.kick() },
		UpdateFunc: func(any, any) { c.kick() },
		DeleteFunc: func(any) { c.kick() },
	}
	for _, inf := range []cache.SharedIndexInformer{
		factory.Core().V1().Nodes().Informer(),
		dfFactory.Diskfit().V1alpha1().DiskNodes().Informer(),
	} {
		reg, err := inf.AddEventHandler(kick)
		if err != nil {
			return nil, err
		}
		c.synced = append(c.synced, reg.HasSynced)
	}
	c.synced = append(c.synced,
		factory.Core().V1().PersistentVolumes().Informer().HasSynced,
		factory.Core().V1().PersistentVolumeClaims().Informer().HasSynced,
		factory.Storage().V1().StorageClasses().Informer().HasSynced)
	return c, nil
}

func (c *Controller) kick() {
	select {
	case c.changed <- struct{}{}:
	default:
	}
}

// Run runs passes until ctx ends: when a Node or DiskNode changes and
// every Interval, which also retries failures. Nothing happens before the
// caches are filled: until then every node would look gone.
func (c *Controller) Run(ctx context.Context) error {
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return fmt.Errorf("caches did not sync: %w", ctx.Err())
	}
	klog.FromContext(ctx).Info("Releasing claims of lost disks and nodes", "nodeLossGrace", c.opts.NodeLossGrace,
		"diskFailureGrace", c.opts.DiskFailureGrace, "statusMaxAge", c.opts.StatusMaxAge)
	ticker := c.opts.Clock.NewTicker(c.opts.Interval)
	defer ticker.Stop()
	for {
		c.Pass(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-c.changed:
		case <-ticker.C():
		}
	}
}

// Pass looks at every node and disk once.
func (c *Controller) Pass(ctx context.Context) {
	c.mu.Lock()
	defer c.mu.Unlock()
	logger := klog.FromContext(ctx)
	claims, err := c.claimsByDisk()
	if err != nil {
		logger.Error(err, "Listing the claims on diskfit volumes")
		return
	}
	lost, err := c.losses(claims)
	if err != nil {
		// Without them no lost node's claim is released, and no DiskNode
		// of a gone node is deleted.
		logger.Error(err, "Listing DiskNodes")
	} else {
		c.releaseLostNodes(ctx, claims, lost)
	}
	c.releaseFailedDisks(ctx, claims)
	if err == nil {
		c.tidyDiskNodes(ctx, claims, lost)
	}
}

// claimsByDisk returns the bound claims on diskfit volumes, by where the
// volumes live.
func (c *Controller) claimsByDisk() (map[diskfit.Location][]Claim, error) {
	pvs, err := c.pvs.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	out := map[diskfit.Location][]Claim{}
	for _, pv := range pvs {
		loc, ok := diskfit.PVLocation(pv)
		ref := pv.Spec.ClaimRef
		if !ok || ref == nil {
			continue
		}
		pvc, err := c.pvcs.PersistentVolumeClaims(ref.Namespace).Get(ref.Name)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		// A claim being deleted stays: a release interrupted after the
		// claim's delete (its pods still hold it) is finished next pass.
		if !diskfit.BoundClaim(pv, pvc) {
			continue
		}
		cl := Claim{PVC: pvc, PV: pv}
		if name := diskfit.ClaimClass(pvc, ""); name != "" {
			cl.Class, _ = c.classes.Get(name)
		}
		out[loc] = append(out[loc], cl)
	}
	return out, nil
}

// releaseLostNodes releases the opted-in claims of nodes the API server
// has said for NodeLossGrace are gone (disknodes.go): their Node deleted,
// and their driver not reporting. Nothing of a node is released while
// more nodes than MaxLostNodes were lost at once with it (lostnodes.go).
func (c *Controller) releaseLostNodes(ctx context.Context, claims map[diskfit.Location][]Claim, losses lostNodes) {
	logger := klog.FromContext(ctx)
	lost := map[string][]Claim{}
	for loc, list := range claims {
		if !c.seemsGone(loc.Node) {
			continue
		}
		for _, cl := range list {
			if diskfit.ReleasedOnNodeLoss(cl.PVC, cl.Class) {
				lost[loc.Node] = append(lost[loc.Node], cl)
			}
		}
	}
	// A node back in the cache or reporting again, or without claims
	// left to release, starts over.
	for name := range c.nodeGoneSince {
		if _, ok := lost[name]; !ok {
			delete(c.nodeGoneSince, name)
			c.toldHeld.Delete(name)
		}
	}
	now := c.opts.Clock.Now()
	var holding []string
	for name, list := range lost {
		gone, err := c.gone(ctx, name)
		switch {
		case err != nil:
			logger.Error(err, "Reading a node that seems gone; its claims are not released now", "node", name)
			continue
		case !gone:
			logger.V(2).Info("Node that seems gone exists or reports; its claims stay", "node", name)
			delete(c.nodeGoneSince, name)
			continue
		}
		held := c.heldWith(name, losses)
		since, ok := c.nodeGoneSince[name]
		if !ok {
			c.nodeGoneSince[name] = now
			logger.Info("Node is gone; releasing its opted-in claims unless it comes back", "node", name, "after", c.opts.NodeLossGrace)
			when := fmt.Sprintf("the claim is released at %s unless the node comes back", now.Add(c.opts.NodeLossGrace).UTC().Format(time.RFC3339))
			if held != "" {
				when = "the claim is not released while " + held
			}
			for _, cl := range list {
				c.recorder.Eventf(cl.PVC, nil, v1.EventTypeWarning, ReasonNodeGone, "Release",
					"Node %s, which holds this claim's volume, was deleted and its driver no longer reports; %s", name, when)
			}
			continue
		}
		if now.Sub(since) < c.opts.NodeLossGrace {
			continue
		}
		if held != "" {
			holding = append(holding, held)
			c.tellNodeHeld(name, since, list, held)
			continue
		}
		for _, cl := range list {
			if err := ReleaseWithNode(ctx, c.client, cl); err != nil {
				if errors.Is(err, ErrClaimChanged) {
					logger.Info("Claim changed since it was chosen for release; the next pass looks again", "node", name, "pvc", klog.KObj(cl.PVC))
				} else {
					logger.Error(err, "Releasing a claim of a deleted node", "node", name, "pvc", klog.KObj(cl.PVC))
				}
				continue
			}
			loc, _ := diskfit.PVLocation(cl.PV)
			logger.Info("Released a claim of a deleted node", "node", name, "disk", loc.Disk, "pv", cl.PV.Name, "pvc", klog.KObj(cl.PVC))
			c.recorder.Eventf(cl.PVC, nil, v1.EventTypeWarning, ReasonReleasedWithNode, "Release",
				"Released: node %s has been gone since %s; the claim and its PV are deleted so the workload can recreate it on a live node",
				name, since.UTC().Format(time.RFC3339))
		}
	}
	slices.Sort(holding)
	noteHold(logger, &c.holdingNodes, strings.Join(slices.Compact(holding), "; "), "lost node")
}

// releaseFailedDisks follows the disks that fresh DiskNode statuses call
// unhealthy: it tells their claims and pods when a disk fails and when it
// recovers, and releases the opted-in claims of a disk that stayed
// unhealthy for DiskFailureGrace.
func (c *Controller) releaseFailedDisks(ctx context.Context, claims map[diskfit.Location][]Claim) {
	logger := klog.FromContext(ctx)
	now := c.opts.Clock.Now()
	seen, notFailed := map[diskfit.Location]bool{}, map[diskfit.Location]bool{}
	dns, err := c.diskNodes.List(labels.Everything())
	if err != nil {
		logger.Error(err, "Listing DiskNodes")
		return
	}
	for _, dn := range dns {
		if !c.fresh(dn) {
			// No word from the node: neither failed nor recovered. A
			// failure's grace time starts over once it reports again.
			continue
		}
		for _, ds := range dn.Status.Disks {
			loc := diskfit.Location{Node: dn.Name, Disk: ds.Name}
			if ds.Healthy {
				continue
			}
			// An unhealthy disk with a reason did not fail, and its data
			// is intact: one the node config does not name (an admin's
			// change; a config rolled out to every node must not release
			// every replica at once), one mounted at another disk's path.
			if !ds.Failed() {
				notFailed[loc] = true
				c.tellNotFailed(ctx, loc, &ds, claims[loc])
				continue
			}
			seen[loc] = true
			f := c.failing[loc]
			if f == nil {
				f = &failure{since: now, message: ds.Message, told: map[string]bool{}}
				c.failing[loc] = f
				logger.Info("Disk failed", "node", dn.Name, "disk", ds.Name, "message", ds.Message, "claims", len(claims[loc]))
			}
			c.tellFailure(loc, f, claims[loc])
		}
	}
	for loc := range c.notFailing {
		if !notFailed[loc] {
			delete(c.notFailing, loc)
		}
	}
	for loc, f := range c.failing {
		if seen[loc] {
			continue
		}
		delete(c.failing, loc)
		if c.healthy(loc) {
			logger.Info("Disk recovered", "node", loc.Node, "disk", loc.Disk)
			for _, cl := range claims[loc] {
				if !f.told[string(cl.PVC.UID)] {
					continue
				}
				note := fmt.Sprintf("Disk %s on node %s, which holds this claim's volume, works again", loc.Disk, loc.Node)
				c.recorder.Eventf(cl.PVC, nil, v1.EventTypeNormal, ReasonDiskRecovered, "Recover", "%s", note)
				for _, pod := range c.podsOf(cl.PVC, loc.Node) {
					c.recorder.Eventf(pod, cl.PVC, v1.EventTypeNormal, ReasonDiskRecovered, "Recover", "%s", note)
				}
			}
		}
	}
	held := c.tooManyNodesFailing(len(dns))
	noteHold(logger, &c.holding, held, "failed disk")
	for loc, f := range c.failing {
		if now.Sub(f.since) < c.opts.DiskFailureGrace {
			continue
		}
		if held != "" {
			c.tellHeld(loc, f, claims[loc], held)
			continue
		}
		release := optedIn(claims[loc])
		if len(release) == 0 {
			f.settled = true
			continue
		}
		if err := c.confirmFailed(ctx, loc); err != nil {
			logger.Info("Not releasing the claims of a disk", "node", loc.Node, "disk", loc.Disk, "reason", err.Error())
			continue
		}
		for _, cl := range release {
			// The cache nominated the claim; its owner may have opted out
			// since. The API server's copy decides, and the delete carries
			// its resourceVersion.
			cl, err := StillReleasedOnDiskLoss(ctx, c.client, cl)
			if err == nil {
				err = ReleaseKeepingData(ctx, c.client, cl, loc.Node)
			}
			if errors.Is(err, ErrClaimChanged) {
				logger.V(2).Info("Claim no longer to release", "pvc", klog.KObj(cl.PVC), "reason", err.Error())
				continue
			}
			if err != nil {
				logger.Error(err, "Releasing a claim of a failed disk", "node", loc.Node, "disk", loc.Disk, "pvc", klog.KObj(cl.PVC))
				c.recorder.Eventf(cl.PVC, nil, v1.EventTypeWarning, ReasonReleaseFailed, "Release", "Releasing the claim from failed disk %s on node %s: %v", loc.Disk, loc.Node, err)
				continue
			}
			logger.Info("Released a claim of a failed disk", "node", loc.Node, "disk", loc.Disk, "pv", cl.PV.Name, "pvc", klog.KObj(cl.PVC))
			note := fmt.Sprintf("Released claim %s/%s: disk %s on node %s has failed since %s (%s). Its PV %s is kept with reclaim policy Retain: once its data is not needed, set the PV's reclaim policy to Delete to free the space (the disk served again), or delete the PV (the disk gone for good)",
				cl.PVC.Namespace, cl.PVC.Name, loc.Disk, loc.Node, f.since.UTC().Format(time.RFC3339), f.message, cl.PV.Name)
			c.recorder.Eventf(cl.PVC, nil, v1.EventTypeWarning, ReasonReleased, "Release", "%s", note)
			c.recorder.Eventf(cl.PV, nil, v1.EventTypeWarning, ReasonReleased, "Release", "%s", note)
		}
	}
}

// tooManyNodesFailing says why releases are held, if disks fail on more
// nodes at once than MaxNodesWithFailedDisks of the diskNodes nodes
// allows. Every failed disk counts, with claims to release or not (a
// driver rolled out to every node fails disks without claims too), until
// it is settled: its grace time passed while releases were not held, and
// it has nothing left to release (its claims released, or none opted in:
// a dead disk awaiting replacement). A settled failure counting would
// hold every later release.
func (c *Controller) tooManyNodesFailing(diskNodes int) string {
	nodes := sets.New[string]()
	for loc, f := range c.failing {
		if !f.settled {
			nodes.Insert(loc.Node)
		}
	}
	limit, _ := intstr.GetScaledValueFromIntOrPercent(&c.opts.MaxNodesWithFailedDisks, diskNodes, false) // Validate checked it
	limit = max(limit, 1)
	if nodes.Len() <= limit {
		return ""
	}
	return fmt.Sprintf("disks fail on %d nodes at once (%s), more than %d (--max-nodes-with-failed-disks %s of %d nodes): "+
		"a cause the nodes share (a node config or driver rolled out to them) is likelier than so many failed disks, "+
		"and releasing would recreate every replica of a workload at once",
		nodes.Len(), strings.Join(sets.List(nodes), ", "), limit, c.opts.MaxNodesWithFailedDisks.String(), diskNodes)
}

// noteHold logs when the releases of what's claims start or stop being
// held, and keeps why they are (held, empty when not) in was.
func noteHold(logger klog.Logger, was *string, held, what string) {
	if held == *was {
		return
	}
	if held != "" {
		logger.Info("Releasing no claim of a "+what, "reason", held)
	} else {
		logger.Info("Releasing claims of " + what + "s again")
	}
	*was = held
}

// tellHeld puts a Warning event on each opted-in claim of a failed disk,
// once per failure, saying that its release is held and why.
func (c *Controller) tellHeld(loc diskfit.Location, f *failure, claims []Claim, why string) {
	if f.toldHeld {
		return
	}
	f.toldHeld = true
	for _, cl := range optedIn(claims) {
		c.recorder.Eventf(cl.PVC, nil, v1.EventTypeWarning, ReasonReleaseHeld, "Release",
			"Not released although disk %s on node %s has failed since %s: %s. Once failures are on few enough nodes it is released; to move it now, run diskfit drain %s/%s --release",
			loc.Disk, loc.Node, f.since.UTC().Format(time.RFC3339), why, loc.Node, loc.Disk)
	}
}

// tellNotFailed logs, once per reason, that an unhealthy disk whose
// reason says it did not fail (v1alpha1.DiskStatus.Failed) has none of its
// claims released, and tells each opted-in claim once, with the disk's
// message, which says what to do.
func (c *Controller) tellNotFailed(ctx context.Context, loc diskfit.Location, ds *v1alpha1.DiskStatus, claims []Claim) {
	nf := c.notFailing[loc]
	if nf == nil || nf.reason != ds.Reason {
		nf = &notFailing{reason: ds.Reason, told: map[string]bool{}}
		c.notFailing[loc] = nf
		klog.FromContext(ctx).Info("Disk unhealthy but not failed; none of its claims is released", "node", loc.Node, "disk", loc.Disk,
			"reason", ds.Reason, "message", ds.Message, "claims", len(claims))
	}
	note := fmt.Sprintf("Not released although disk %s on node %s, which holds this claim's volume, is unhealthy: %s is no failure of the disk, whose data is intact, and the claim stays however long it lasts (%s)",
		loc.Disk, loc.Node, ds.Reason, ds.Message)
	for _, cl := range optedIn(claims) {
		if nf.told[string(cl.PVC.UID)] {
			continue
		}
		nf.told[string(cl.PVC.UID)] = true
		c.recorder.Eventf(cl.PVC, nil, v1.EventTypeWarning, ReasonReleaseHeld, "Release", "%s", note)
	}
}

// optedIn returns the claims that asked to be released when their disk
// is lost (diskfit.ReleasedOnDiskLoss).
func optedIn(claims []Claim) []Claim {
	var out []Claim
	for _, cl := range claims {
		if diskfit.ReleasedOnDiskLoss(cl.PVC, cl.Class) {
			out = append(out, cl)
		}
	}
	return out
}

// tellFailure puts a Warning event on each claim of a failed disk and on
// the pods using it, once per claim and failure, saying what happens next
// and what a person can do.
func (c *Controller) tellFailure(loc diskfit.Location, f *failure, claims []Claim) {
	for _, cl := range claims {
		uid := string(cl.PVC.UID)
		if f.told[uid] {
			continue
		}
		f.told[uid] = true
		note := fmt.Sprintf("Disk %s on node %s, which holds this claim's volume, failed (%s). ", loc.Disk, loc.Node, strings.TrimRight(f.message, ".?! "))
		if diskfit.ReleasedOnDiskLoss(cl.PVC, cl.Class) {
			note += fmt.Sprintf("The claim asked to be released (%s: %s): unless the disk recovers by %s, it and its pod are deleted so the workload recreates them on a working disk; the volume's PV is kept",
				diskfit.OnDiskLossAnnotation, diskfit.OnDiskLossRelease, f.since.Add(c.opts.DiskFailureGrace).UTC().Format(time.RFC3339))
		} else {
			note += fmt.Sprintf("The pod cannot use the volume until the disk recovers. To recreate the claim on a working disk, annotate it %s=%s (or delete the claim and its pod)",
				diskfit.OnDiskLossAnnotation, diskfit.OnDiskLossRelease)
		}
		c.recorder.Eventf(cl.PVC, nil, v1.EventTypeWarning, ReasonDiskFailed, "Fail", "%s", note)
		for _, pod := range c.podsOf(cl.PVC, loc.Node) {
			c.recorder.Eventf(pod, cl.PVC, v1.EventTypeWarning, ReasonDiskFailed, "Fail", "%s", note)
		}
	}
}

// podsOf returns the pods on node using pvc, for events; none when the
// API server cannot say.
func (c *Controller) podsOf(pvc *v1.PersistentVolumeClaim, node string) []*v1.Pod {
	pods, err := PodsUsing(context.Background(), c.client, pvc, node)
	if err != nil {
		return nil
	}
	out := make([]*v1.Pod, len(pods))
	for i := range pods {
		out[i] = &pods[i]
	}
	return out
}

// healthy reports whether the cache's DiskNode says the disk is healthy.
func (c *Controller) healthy(loc diskfit.Location) bool {
	dn, err := c.diskNodes.Get(loc.Node)
	if err != nil {
		return false
	}
	d := dn.Status.Disk(loc.Disk)
	return d != nil && d.Healthy && c.fresh(dn)
}

// confirmFailed reads the DiskNode from the API server (a quorum read) and
// returns nil only if its fresh status still calls the disk unhealthy.
func (c *Controller) confirmFailed(ctx context.Context, loc diskfit.Location) error {
	dn, err := c.diskfit.DiskfitV1alpha1().DiskNodes().Get(ctx, loc.Node, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reading DiskNode %s: %w", loc.Node, err)
	}
	if !c.fresh(dn) {
		return fmt.Errorf("DiskNode %s has not been reported for %s", dn.Name, c.opts.StatusMaxAge)
	}
	return failed(dn, loc.Disk)
}

// failed returns nil when dn's status reports disk failed.
func failed(dn *v1alpha1.DiskNode, disk string) error {
	d := dn.Status.Disk(disk)
	switch {
	case d == nil:
		return fmt.Errorf("DiskNode %s no longer lists disk %s", dn.Name, disk)
	case d.Healthy:
		return fmt.Errorf("disk %s is healthy again", disk)
	case !d.Failed():
		return fmt.Errorf("disk %s is unhealthy but did not fail: %s", disk, d.Reason)
	}
	return nil
}
