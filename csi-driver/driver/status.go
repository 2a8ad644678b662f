package driver

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
	"github.com/diskfit/diskfit/csi-driver/backend"
	"github.com/diskfit/diskfit/csi-driver/loop"
)

// maxMessageLength is the DiskNode schema's limit on a disk's message.
const maxMessageLength = 1024

// unhealthy returns st unhealthy with err as its message.
func unhealthy(st v1alpha1.DiskStatus, err error) v1alpha1.DiskStatus {
	st.Healthy = false
	st.Message = err.Error()
	if len(st.Message) > maxMessageLength {
		st.Message = st.Message[:maxMessageLength]
	}
	return st
}

// diskStatus observes one disk, without a bound of its own: observe runs
// it in the disk's bounded status observation.
func (d *Driver) diskStatus(ctx context.Context, dk *disk) v1alpha1.DiskStatus {
	st := v1alpha1.DiskStatus{Name: dk.name, Backend: dk.backend.Kind(), DeviceClass: dk.class(), Healthy: true}
	fail := func(err error) v1alpha1.DiskStatus {
		return unhealthy(st, timedOut(ctx, err, observingWhat, dk.timeout))
	}
	if err := dk.checkHealth(ctx); err != nil {
		switch {
		case errors.Is(err, loop.ErrFreesSpace):
			// Refused on this kernel, its data intact: no failure.
			st.Reason = v1alpha1.DiskUnsupported
		case errors.Is(err, backend.ErrServedByAnotherProcess):
			// Another driver process serves it, and it answers.
			st.Reason = v1alpha1.DiskServedByAnotherProcess
		case errors.Is(err, backend.ErrDuplicateGroup):
			// Another device has a group of its name; its own is there.
			st.Reason = v1alpha1.DiskDuplicateVolumeGroup
		}
		return fail(err)
	}
	u, err := dk.backend.Usage(ctx)
	if err != nil {
		return fail(err)
	}
	vols, err := dk.backend.ListVolumes(ctx)
	if err != nil {
		return fail(err)
	}
	st.VolumeCount = int32(len(vols))
	// Capacity is what the disk offers volumes: its free space plus what its
	// volumes take. So capacity minus the volumes is exactly the free space,
	// and the scheduler's ledger (capacity minus the PVs it knows) agrees
	// with the disk between two reports, whatever the filesystem keeps for
	// itself (ext4 journal, XFS metadata) or whatever else was written there.
	// Volumes without a PV are left out: the scheduler counts a disk's
	// volumes by their PVs (capacity minus PVs is what it may hand out), so
	// a volume kept after its PV went must not look like room.
	var used int64
	for _, v := range vols {
		if v.UnreferencedSince.IsZero() {
			used += v.SizeBytes
		}
	}
	st.FreeBytes = u.FreeBytes
	st.CapacityBytes = min(u.FreeBytes+used, u.CapacityBytes)
	withoutPV(&st, dk.name, vols)
	return st
}

// withoutPV reports the volumes the orphan sweep found without a PV, the
// longest without one first.
func withoutPV(st *v1alpha1.DiskStatus, diskName string, vols []backend.Volume) {
	for _, v := range vols {
		if v.UnreferencedSince.IsZero() {
			continue
		}
		st.VolumesWithoutPV++
		st.BytesWithoutPV += v.SizeBytes
		claim := ""
		if v.PVCName != "" {
			claim = v.PVCNamespace + "/" + v.PVCName
		}
		st.WithoutPV = append(st.WithoutPV, v1alpha1.VolumeWithoutPV{
			VolumeHandle: makeID(diskName, v.Key), SizeBytes: v.SizeBytes, Claim: claim,
			Since: metav1.NewTime(v.UnreferencedSince), NeverHadPV: v.NeverReferenced,
		})
	}
	slices.SortStableFunc(st.WithoutPV, func(a, b v1alpha1.VolumeWithoutPV) int { return a.Since.Compare(b.Since.Time) })
	if len(st.WithoutPV) > v1alpha1.MaxWithoutPV {
		st.WithoutPV = st.WithoutPV[:v1alpha1.MaxWithoutPV]
	}
}

// Observe returns the node's current DiskNode status.
func (d *Driver) Observe(ctx context.Context) *v1alpha1.DiskNodeStatus {
	return d.observe(ctx, false)
}

// observe returns the node's current DiskNode status; with start, a disk
// whose backend has not started is started first.
//
// Each disk is observed in a goroutine of its own (see bounded.go), all at
// once, and observe waits for each until its observation's deadline, the
// disk's timeout after it started: a disk whose syscalls or lvm commands
// hang is reported unhealthy, not answering, while the others' statuses
// are published on time. Otherwise the whole DiskNode would stop being
// refreshed: the scheduler would reject the node for its stale status, and
// diskfit-controller would take the node for silent and never learn that
// the disk failed. An observation still in flight from an earlier refresh
// is joined, not started again; once past its deadline the disk is
// reported still not answering since it started, without waiting.
func (d *Driver) observe(ctx context.Context, start bool) *v1alpha1.DiskNodeStatus {
	st := &v1alpha1.DiskNodeStatus{ObservedTime: metav1.NewTime(time.Now())}
	disks := d.disks()
	flights := make([]*flight[v1alpha1.DiskStatus], len(disks))
	for i, dk := range disks {
		flights[i] = dk.observing.join(ctx, dk.timeout, func(ctx context.Context) v1alpha1.DiskStatus {
			if start {
				d.startUnavailable(ctx, dk)
			}
			return d.diskStatus(ctx, dk)
		})
	}
	for i, dk := range disks {
		ds, err := flights[i].wait(ctx, observingWhat, dk.timeout)
		if err != nil {
			ds = unhealthy(v1alpha1.DiskStatus{Name: dk.name, Backend: dk.backend.Kind(), DeviceClass: dk.class()}, err)
		}
		st.Disks = append(st.Disks, ds)
	}
	st.Disks = append(st.Disks, d.unservedDisks(st)...)
	atAnotherPath(st, disks)
	st.Summarize()
	return st
}

// atAnotherPath marks, DiskAtAnotherPath, each unhealthy disk of st whose
// state directory one of disks found at its own path, where it refused to
// start (backend.AnotherDiskError): the disk's filesystem is mounted at
// another disk's path (two disks at each other's paths, or one at the
// path of a disk that died, after a boot that handed out device names in
// another order), so its data is intact, and diskfit-controller releases
// none of its claims. A file disk whose state is found nowhere is left as
// it is: it may have failed. An lvm disk given another disk's group is
// marked too: a group is found by its name, which no boot hands out
// anew, so its own group was only left out of the node config, not lost.
func atAnotherPath(st *v1alpha1.DiskNodeStatus, disks []*disk) {
	var refused []*backend.AnotherDiskError
	for _, dk := range disks {
		var another *backend.AnotherDiskError
		if errors.As(dk.unavailable(), &another) {
			refused = append(refused, another)
		}
	}
	for _, another := range refused {
		ds := st.Disk(another.Holder)
		if ds == nil || ds.Healthy || ds.Reason != "" {
			continue
		}
		ds.Reason = v1alpha1.DiskAtAnotherPath
		if another.VolumeGroup != "" {
			*ds = unhealthy(*ds, fmt.Errorf("its volume group is configured for another disk: its volumes are in volume group %s, which the node config gives disk %s; give it back its own volume group to serve them (%s)",
				another.VolumeGroup, another.Disk, ds.Message))
			continue
		}
		*ds = unhealthy(*ds, fmt.Errorf("mounted at another disk's path: its volumes are at %s, the path of disk %s; mount its filesystem at its own path to serve them (%s)",
			another.Path, another.Disk, ds.Message))
	}
	// An lvm disk given another disk's group whose own group no other
	// disk was given.
	for _, another := range refused {
		ds := st.Disk(another.Disk)
		if another.VolumeGroup == "" || ds == nil || ds.Healthy || ds.Reason != "" {
			continue
		}
		ds.Reason = v1alpha1.DiskAtAnotherPath
		*ds = unhealthy(*ds, fmt.Errorf("given another disk's volume group: the node config gives it volume group %s, which holds disk %s's volumes; give it its own volume group to serve its volumes (%s)",
			another.VolumeGroup, another.Holder, ds.Message))
	}
}

// startUnavailable starts the disk again if its backend could not start,
// so a disk mounted late is served without restarting the driver. It runs
// in the disk's status observation: a Start that hangs holds up only that
// disk. Start itself gets no deadline (as at driver start): a start that
// is only slow (an lvm volume group with much to roll back) must not be
// killed half way at every refresh; the refresh just stops waiting for it.
func (d *Driver) startUnavailable(ctx context.Context, dk *disk) {
	if dk.unavailable() == nil {
		return
	}
	if err := dk.start(context.WithoutCancel(ctx)); err != nil {
		klog.FromContext(ctx).V(2).Info("Disk still unavailable", "disk", dk.name, "reason", err.Error())
		return
	}
	klog.FromContext(ctx).Info("Disk available", "disk", dk.name)
}

// publish starts the disks that are not started yet, observes them, sets
// the per-disk metrics from what it saw, publishes the status and reports
// whether it reached the API.
func (d *Driver) publish(ctx context.Context) bool {
	st := d.observe(ctx, true)
	d.diskMetrics.observe(d.cfg.NodeID, st)
	if d.cfg.Status == nil {
		return true
	}
	if err := d.cfg.Status.Publish(ctx, st); err != nil {
		klog.FromContext(ctx).Error(err, "Publishing DiskNode status failed")
		return false
	}
	klog.FromContext(ctx).V(4).Info("Published DiskNode status", "healthyDisks", st.HealthyDisks, "free", st.Free.String())
	return true
}

// publishRetry is how soon a failed publish is tried again. A driver often
// starts before its Node object exists, and the scheduler should not wait
// a whole StatusInterval for the first DiskNode.
const publishRetry = 2 * time.Second

// statusLoop publishes at start, on every kick (create, delete, expand) and
// every StatusInterval, so the scheduler's view is never older than that;
// after a failure it retries sooner.
func (d *Driver) statusLoop(ctx context.Context) {
	for {
		wait := d.cfg.StatusInterval
		if !d.publish(ctx) {
			wait = min(wait, publishRetry)
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		case <-d.kick:
			timer.Stop()
		}
	}
}

// unservedDisks lists, unhealthy, the disks that this node's PVs are on
// but that the driver does not serve: discovery found the disk's mount gone
// (a disk that died before a reboot), or the node config lost it. Without
// them such a disk would vanish from the DiskNode, and nobody would learn
// that the volumes on it are unreachable. A disk a config that discovers
// nothing does not name is marked DiskNotConfigured: an admin's change,
// not a failure, for which diskfit-controller releases no claim.
func (d *Driver) unservedDisks(st *v1alpha1.DiskNodeStatus) []v1alpha1.DiskStatus {
	if d.cfg.Orphans == nil {
		return nil
	}
	var out []v1alpha1.DiskStatus
	for name, n := range d.cfg.Orphans.DisksOfPVs(d.cfg.NodeID) {
		if st.Disk(name) != nil {
			continue
		}
		ds := v1alpha1.DiskStatus{
			Name: name, Backend: v1alpha1.BackendFile, Healthy: false,
			Message: fmt.Sprintf("not served: %d PersistentVolumes of this node are on disk %s, but the node config does not name it and discovery found it not mounted", n, name),
		}
		var why string
		if skipped := d.skipped.Load(); skipped != nil {
			why = (*skipped)[name]
		}
		switch {
		case why != "":
			ds.Reason = v1alpha1.DiskNotConfigured
			ds.Message = fmt.Sprintf("not served: %d PersistentVolumes of this node are on disk %s, which discovery found %s; its volumes are unreachable until that is fixed", n, name, why)
		case !d.discovers.Load():
			ds.Reason = v1alpha1.DiskNotConfigured
			ds.Message = fmt.Sprintf("not served: %d PersistentVolumes of this node are on disk %s, but the node config has no such disk; its volumes are unreachable until it names the disk again", n, name)
		}
		out = append(out, ds)
	}
	slices.SortFunc(out, func(a, b v1alpha1.DiskStatus) int { return strings.Compare(a.Name, b.Name) })
	return out
}
