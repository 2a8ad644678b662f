package lifecycle

import (
	"time"

	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
)

// report is the last DiskNode report the controller saw from a node.
type report struct {
	observed time.Time
	seen     time.Time
}

// fresh reports whether dn's node is reporting: its status is new by the
// node's own clock, and a new report (a later observedTime) has reached
// this controller within StatusMaxAge by this controller's clock. The
// second half keeps a node whose clock runs ahead, and that then went
// silent, from looking fresh for as long as its clock is ahead.
func (c *Controller) fresh(dn *v1alpha1.DiskNode) bool {
	now := c.opts.Clock.Now()
	if dn.Status.Stale(now, c.opts.StatusMaxAge) {
		return false
	}
	observed := dn.Status.ObservedTime.Time
	r, ok := c.reports[dn.Name]
	if !ok || observed.After(r.observed) {
		r = report{observed: observed, seen: now}
		c.reports[dn.Name] = r
	}
	return now.Sub(r.seen) <= c.opts.StatusMaxAge
}
