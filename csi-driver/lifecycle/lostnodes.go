package lifecycle

import (
	"fmt"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
)

// LossWindow is how close in time nodes must go silent to count as lost
// at once for MaxLostNodes: a Node deletion gone wrong takes nodes within
// minutes, or, run by a throttled script, one every minute or two.
const LossWindow = 30 * time.Minute

// Many nodes lost at once are likelier a Node deletion gone wrong (a cloud
// controller that cannot see its instances, a script run against the
// wrong cluster) than so many lost machines: releasing their claims would
// recreate every replica of a workload empty at once while the machines
// and their data may be fine. So a lost node's claims are released only
// if at most MaxLostNodes nodes, itself among them, went silent within
// LossWindow of it.
//
// When a node went silent is its DiskNode's last report (lastReport, by
// the API server's clock): it is kept in the API, so a restarted
// controller (an upgrade, a new leader) tells the nodes lost at once from
// those retired long ago, whose DiskNodes stay for the cordon in their
// spec. Only gone nodes count whose DiskNode's last
// report held volumes, besides the node itself (one without a DiskNode
// gets the time a pass first saw it gone): an empty node removed (an
// autoscaler's scale-down) lost nothing anyone needs, and the limit is a
// share of the nodes that hold volumes. Their DiskNodes stay while some
// of them have claims to release (tidyDiskNodes), so the count stays as
// long as the loss.

// lostNodes is what a pass knows of the nodes that seem gone (seemsGone),
// those of a DiskNode or of a claim's volume: when each went silent and
// whether it counts; and how many nodes' DiskNodes report volumes.
type lostNodes struct {
	byNode      map[string]loss
	withVolumes int
}

// losses returns the pass's lostNodes.
func (c *Controller) losses(claims map[diskfit.Location][]Claim) (lostNodes, error) {
	dns, err := c.diskNodes.List(labels.Everything())
	if err != nil {
		return lostNodes{}, err
	}
	now := c.opts.Clock.Now()
	out := map[string]loss{}
	withVolumes := 0
	for _, dn := range dns {
		counted := holdsVolumes(dn)
		if counted {
			withVolumes++
		}
		if !c.seemsGone(dn.Name) {
			continue
		}
		out[dn.Name] = loss{silentSince: lastReport(dn), diskNode: true, counted: counted}
	}
	for loc := range claims {
		if _, ok := out[loc.Node]; ok || !c.seemsGone(loc.Node) {
			continue
		}
		if _, ok := c.firstSeenGone[loc.Node]; !ok {
			c.firstSeenGone[loc.Node] = now
		}
		out[loc.Node] = loss{silentSince: c.firstSeenGone[loc.Node]}
	}
	for name := range c.firstSeenGone {
		if l, ok := out[name]; !ok || l.diskNode {
			delete(c.firstSeenGone, name)
		}
	}
	return lostNodes{byNode: out, withVolumes: withVolumes}, nil
}

// lastReport is when dn's status was last written: by the API server's
// clock (the time of its status's managedFields entry), so that a node
// whose clock is off is not counted with the wrong neighbours; else by the
// node's (observedTime); else when dn was made.
func lastReport(dn *v1alpha1.DiskNode) time.Time {
	var at time.Time
	for _, f := range dn.ManagedFields {
		if f.Subresource == "status" && f.Time != nil && f.Time.After(at) {
			at = f.Time.Time
		}
	}
	if at.IsZero() {
		at = dn.Status.ObservedTime.Time
	}
	if at.IsZero() {
		at = dn.CreationTimestamp.Time
	}
	return at
}

// holdsVolumes says whether dn's last report counted volumes on a disk.
func holdsVolumes(dn *v1alpha1.DiskNode) bool {
	return slices.ContainsFunc(dn.Status.Disks, func(d v1alpha1.DiskStatus) bool { return d.VolumeCount > 0 })
}

// loss is a node that seems gone: since when, whether it has a DiskNode,
// and whether it counts towards MaxLostNodes (its DiskNode's last report
// held volumes).
type loss struct {
	silentSince       time.Time
	diskNode, counted bool
}

// lostWith returns the nodes counted that went silent within LossWindow
// of node, and node itself, sorted.
func (losses lostNodes) lostWith(node string) []string {
	at := losses.byNode[node].silentSince
	var out []string
	for name, l := range losses.byNode {
		if name == node || l.counted && l.silentSince.Sub(at).Abs() <= LossWindow {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// heldWith says why node's claims are held, if more nodes than
// MaxLostNodes were lost at once with it; empty when they are not.
func (c *Controller) heldWith(node string, losses lostNodes) string {
	at := losses.lostWith(node)
	limit := c.opts.MaxLostNodes
	n, _ := intstr.GetScaledValueFromIntOrPercent(&limit, losses.withVolumes, false) // Validate checked it
	n = max(n, 1)
	if len(at) <= n {
		return ""
	}
	return fmt.Sprintf("%d nodes holding volumes went silent, their Node deleted, within %s of each other (%s), more than %d (--max-lost-nodes %s of %d nodes holding volumes): "+
		"one cause deleting their Node objects (a cloud controller that cannot see its instances, a script) is likelier than so many lost machines, "+
		"and releasing would recreate every replica of a workload at once",
		len(at), LossWindow, strings.Join(at, ", "), n, limit.String(), losses.withVolumes)
}

// tellNodeHeld puts a Warning event on each opted-in claim of a lost
// node, once per loss, saying that its release is held, why and what a
// person can do.
func (c *Controller) tellNodeHeld(name string, since time.Time, claims []Claim, why string) {
	if c.toldHeld.Has(name) {
		return
	}
	c.toldHeld.Insert(name)
	for _, cl := range claims {
		c.recorder.Eventf(cl.PVC, nil, v1.EventTypeWarning, ReasonReleaseHeld, "Release",
			"Not released although node %s, which holds this claim's volume, has been gone since %s: %s. It is released if the Nodes come back but few enough; "+
				"if those machines are lost for good, delete their DiskNodes (kubectl delete disknode NAME), or raise diskfit-controller's --max-lost-nodes, "+
				"and it is released a grace time later",
			name, since.UTC().Format(time.RFC3339), why)
	}
}

// keepsCount says whether the DiskNode of gone node must stay because it
// counts towards holding the claims of a node lost at once with it: one in
// lostWith(node) that has opted-in claims and is held.
func (c *Controller) keepsCount(node string, losses lostNodes, claims map[diskfit.Location][]Claim) bool {
	if !losses.byNode[node].counted {
		return false
	}
	for _, other := range losses.lostWith(node) {
		if hasOptedIn(other, claims) && c.heldWith(other, losses) != "" {
			return true
		}
	}
	return false
}

// hasOptedIn says whether node holds a claim that asked to be released
// when its node is lost.
func hasOptedIn(node string, claims map[diskfit.Location][]Claim) bool {
	for loc, list := range claims {
		if loc.Node != node {
			continue
		}
		for _, cl := range list {
			if diskfit.ReleasedOnNodeLoss(cl.PVC, cl.Class) {
				return true
			}
		}
	}
	return false
}
