package driver

import (
	"context"
	"errors"
	"time"

	"k8s.io/klog/v2"

	"github.com/diskfit/diskfit/csi-driver/backend"
)

// OrphanFinder tells which of the driver's volumes and snapshots no API
// object refers to any more. Both methods fail, rather than guess, when
// they cannot tell for sure; the sweep then removes nothing.
type OrphanFinder interface {
	// VolumesWithoutPV returns those of the volume IDs that no
	// PersistentVolume of this driver has as its volume handle.
	VolumesWithoutPV(ctx context.Context, ids []string) ([]string, error)
	// SnapshotsWithoutContent returns those of the snapshot IDs that no
	// VolumeSnapshotContent of this driver has as its snapshot handle.
	SnapshotsWithoutContent(ctx context.Context, ids []string) ([]string, error)
}

// orphanSweepInterval is how often orphans are looked for: twice per grace
// period, so an orphan goes between one and one and a half grace periods
// after it was made.
func orphanSweepInterval(grace time.Duration) time.Duration { return max(grace/2, time.Second) }

// orphanLoop sweeps orphans every orphanSweepInterval until ctx ends.
func (d *Driver) orphanLoop(ctx context.Context) {
	ticker := time.NewTicker(orphanSweepInterval(d.cfg.OrphanGracePeriod))
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
			d.sweepOrphans(ctx)
		}
	}
}

// orphan is a volume or snapshot old enough to be removed if nothing in
// the API refers to it.
type orphan struct {
	dk      *disk
	key     string
	name    string
	created time.Time
	age     time.Duration
}

// errReplaced says a candidate was deleted, or deleted and made again,
// since the sweep listed it; it is not an orphan of this sweep.
var errReplaced = errors.New("deleted or made again since it was listed")

// sweepOrphans removes the volumes that have been without a PV, and the
// snapshots that have been without a VolumeSnapshotContent, for longer than
// the grace period: the PVC was deleted while the volume was provisioned
// (CreateVolume succeeded, no PV was ever made), or the PV went and its
// DeleteVolume never reached the driver. A volume younger than the grace
// period may be about to get its PV, and is kept. Disks that are unhealthy
// are skipped, an API error stops the sweep, and a volume still attached is
// left alone (it is in use, whatever the API says).
func (d *Driver) sweepOrphans(ctx context.Context) {
	logger := klog.FromContext(ctx)
	grace := d.cfg.OrphanGracePeriod
	if d.cfg.Orphans == nil || grace <= 0 {
		return
	}
	now := d.now()
	var vols, snaps []orphan
	for _, dk := range d.disks {
		if dk.health(ctx) != nil {
			continue
		}
		vs, err := dk.backend.ListVolumes(ctx)
		if err != nil {
			logger.Error(err, "Listing volumes for the orphan sweep", "disk", dk.name)
			continue
		}
		for _, v := range vs {
			if age := now.Sub(v.CreatedAt); age >= grace {
				vols = append(vols, orphan{dk: dk, key: v.Key, name: v.Name, created: v.CreatedAt, age: age})
			}
		}
		if !dk.backend.SupportsSnapshots() {
			continue
		}
		ss, err := dk.backend.ListSnapshots(ctx)
		if err != nil {
			logger.Error(err, "Listing snapshots for the orphan sweep", "disk", dk.name)
			continue
		}
		for _, s := range ss {
			if age := now.Sub(s.CreatedAt); age >= grace {
				snaps = append(snaps, orphan{dk: dk, key: s.Key, name: s.Name, created: s.CreatedAt, age: age})
			}
		}
	}
	d.removeOrphans(ctx, orphanVolume, vols, d.cfg.Orphans.VolumesWithoutPV, d.removeOrphanVolume)
	d.removeOrphans(ctx, orphanSnapshot, snaps, d.cfg.Orphans.SnapshotsWithoutContent, d.removeOrphanSnapshot)
}

// removeOrphans asks the API which candidates are orphans and removes those.
func (d *Driver) removeOrphans(ctx context.Context, kind string, candidates []orphan,
	find func(context.Context, []string) ([]string, error), remove func(context.Context, orphan) error) {
	if len(candidates) == 0 {
		return
	}
	logger := klog.FromContext(ctx)
	byID := map[string]orphan{}
	ids := make([]string, 0, len(candidates))
	for _, o := range candidates {
		id := makeID(o.dk.name, o.key)
		byID[id] = o
		ids = append(ids, id)
	}
	orphans, err := find(ctx, ids)
	if err != nil {
		logger.Error(err, "Cannot tell which are orphans, removing none", "kind", kind, "candidates", len(ids))
		return
	}
	for _, id := range orphans {
		o, ok := byID[id]
		if !ok {
			continue
		}
		err := remove(ctx, o)
		switch {
		case errors.Is(err, errReplaced):
			logger.V(2).Info("Orphan candidate changed during the sweep, keeping it", "kind", kind, "id", id)
		case errors.Is(err, backend.ErrInUse):
			logger.Info("Orphan is in use, keeping it", "kind", kind, "id", id, "name", o.name, "err", err.Error())
		case err != nil:
			logger.Error(err, "Removing orphan", "kind", kind, "id", id, "name", o.name)
		default:
			logger.Info("Removed orphan", "kind", kind, "id", id, "name", o.name, "age", o.age.Round(time.Second))
			d.diskMetrics.orphansRemoved.WithLabelValues(kind).Inc()
			d.triggerStatus()
		}
	}
}

// removeOrphanVolume deletes the volume under its lock, if it is still
// the one the sweep listed.
func (d *Driver) removeOrphanVolume(ctx context.Context, o orphan) error {
	defer d.locks.lock("volume/" + o.key)()
	vol, err := o.dk.backend.GetVolume(ctx, o.key)
	if errors.Is(err, backend.ErrNotFound) || (err == nil && !vol.CreatedAt.Equal(o.created)) {
		return errReplaced
	}
	if err != nil {
		return err
	}
	return o.dk.backend.DeleteVolume(ctx, o.key)
}

// removeOrphanSnapshot is removeOrphanVolume for a snapshot.
func (d *Driver) removeOrphanSnapshot(ctx context.Context, o orphan) error {
	defer d.locks.lock("snapshot/" + o.key)()
	snap, err := o.dk.backend.GetSnapshot(ctx, o.key)
	if errors.Is(err, backend.ErrNotFound) || (err == nil && !snap.CreatedAt.Equal(o.created)) {
		return errReplaced
	}
	if err != nil {
		return err
	}
	return o.dk.backend.DeleteSnapshot(ctx, o.key)
}
