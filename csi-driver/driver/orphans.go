package driver

import (
	"context"
	"errors"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"

	"github.com/diskfit/diskfit/csi-driver/backend"
)

// OrphanFinder tells which of the driver's volumes and snapshots no API
// object refers to. Both methods fail, rather than guess, when they cannot
// tell; the sweep then changes nothing.
type OrphanFinder interface {
	// VolumesWithoutPV returns those of the volume IDs that no
	// PersistentVolume of this driver on this node (or on no node it can
	// tell) has as its volume handle. With
	// confirm set, IDs the cache has no PV for are confirmed by the API
	// server; without it the answer may lag behind a PV made a moment ago.
	VolumesWithoutPV(ctx context.Context, ids []string, confirm bool) ([]string, error)
	// SnapshotsWithoutContent returns those of the snapshot IDs that no
	// VolumeSnapshotContent of this driver has as its snapshot handle,
	// asking the API server.
	SnapshotsWithoutContent(ctx context.Context, ids []string) ([]string, error)
	// ClaimWaits reports whether the claim namespace/name, which the
	// volume volumeID called volumeName was made for, may still get a PV
	// for it: it exists, is the claim the volume was made for, and is
	// bound to no PV but one that refers to the volume. It asks the API
	// server and fails when it cannot tell.
	ClaimWaits(ctx context.Context, namespace, name, volumeID, volumeName string) (bool, error)
	// SnapshotWaits reports whether a VolumeSnapshotContent of this driver
	// is being made for the snapshot snapshotName of the volume volumeID:
	// it names the volume as its source, a VolumeSnapshot the snapshot's
	// name was made from, and no snapshot handle yet, which
	// csi-snapshotter records once CreateSnapshot answered. It asks the
	// API server and fails when it cannot tell.
	SnapshotWaits(ctx context.Context, volumeID, snapshotName string) (bool, error)
	// PVsOf returns the PVs that refer to the volume (or may: see
	// diskfit.PVRefersTo), as the API server has them now. It fails when
	// it cannot tell.
	PVsOf(ctx context.Context, volumeID string) ([]*corev1.PersistentVolume, error)
	// Retain gives pv reclaim policy Retain, unless it changed since it was
	// read.
	Retain(ctx context.Context, pv *corev1.PersistentVolume) error
	// ContentsOf returns the VolumeSnapshotContents (external-snapshotter's
	// CRD, so unstructured) of this driver that refer to the snapshot, as
	// the API server has them now. It fails when it cannot tell.
	ContentsOf(ctx context.Context, snapshotID string) ([]*unstructured.Unstructured, error)
	// RetainContent gives content deletion policy Retain, unless it
	// changed since it was read.
	RetainContent(ctx context.Context, content *unstructured.Unstructured) error
	// DisksOfPVs counts, by disk name, the PersistentVolumes of this
	// driver on the node, from the cache; nil before the cache is filled.
	DisksOfPVs(node string) map[string]int
}

// The sweep keeps track of what refers to each volume (its PV) and each
// snapshot (its VolumeSnapshotContent), in their records (backend.Refs),
// and removes only what provably never had such an object: the claim was
// deleted while its volume was provisioned, so CreateVolume succeeded and
// no PV was ever made (external-provisioner cannot call DeleteVolume for a
// volume it has no PV for). A volume whose claim still exists and is bound
// to no other PV is kept however long it has been without one:
// external-provisioner saves the PV only once it can (an API server or a
// fail-closed webhook that is down longer than the grace period), and its
// retries of the PV save back off to about 17 minutes. Whatever once had a PV is kept, data and all,
// when the PV goes without a DeleteVolume: a PV with reclaim policy Retain
// deleted by an admin, or a control plane restored from an older backup.
// Such volumes are reported in the DiskNode and removed only through the
// Kubernetes reclaim path (`diskfit reclaim`).
//
// A volume is known to have had a PV when the sweep, the PV informer
// (VolumeReferenced) or NodeStageVolume (the kubelet stages only volumes
// of PVs) saw one; a snapshot to have had a VolumeSnapshotContent when the
// sweep or the VolumeSnapshotContent informer (SnapshotReferenced) saw
// one. One never seen with one is removed once it has been without one for
// the grace period, counted from the first sweep that found it without
// one, and after the API server confirmed it.

// orphanSweepInterval is how often the sweep runs: twice per grace period,
// so a never-referenced volume goes between one and one and a half grace
// periods after it was first found without a PV; every defaultSweepInterval
// when removal is off (grace 0), to keep the records and the DiskNode's
// count of volumes without a PV current.
func orphanSweepInterval(grace time.Duration) time.Duration {
	if grace <= 0 {
		return defaultSweepInterval
	}
	return max(grace/2, time.Second)
}

const defaultSweepInterval = 5 * time.Minute

// orphanLoop sweeps at once and then every orphanSweepInterval until ctx
// ends. The first sweep records what refers to each volume and snapshot
// when the driver starts: the informers' events that came before the
// driver was ready were not recorded, and an object made while the driver
// was down may be gone again before the next sweep. It removes nothing:
// a removal waits a grace period from the first sweep that found the
// item without a reference.
func (d *Driver) orphanLoop(ctx context.Context) {
	d.sweepOrphans(ctx)
	every(ctx, orphanSweepInterval(d.cfg.OrphanGracePeriod), d.sweepOrphans)
}

// swept is a volume or snapshot as a sweep lists it.
type swept struct {
	dk      *disk
	key     string
	name    string
	created time.Time
	refs    backend.Refs
	// claimNamespace and claimName name the claim a volume was made
	// for, when its creation said.
	claimNamespace, claimName string
	// source is the key of a snapshot's volume.
	source string
}

// refKind is what the sweep needs to know about volumes or snapshots.
type refKind struct {
	// name is the kind label of diskfit_orphans_removed_total.
	name string
	// lock is the prefix of the per-key lock.
	lock string
	// without returns those of ids that nothing refers to; confirm asks
	// the API server rather than a cache.
	without func(ctx context.Context, ids []string, confirm bool) ([]string, error)
	// waits reports whether something still waits for an item nothing
	// refers to, so that it must not be removed; nil when nothing can.
	waits func(ctx context.Context, it swept) (bool, error)
	// get and set read and replace a record's Refs; remove deletes it.
	get    func(ctx context.Context, dk *disk, key string) (time.Time, backend.Refs, error)
	set    func(ctx context.Context, dk *disk, key string, refs backend.Refs) error
	remove func(ctx context.Context, dk *disk, key string) error
}

func (d *Driver) volumeRefs() refKind {
	return refKind{
		name: orphanVolume, lock: "volume/",
		without: func(ctx context.Context, ids []string, confirm bool) ([]string, error) {
			return d.cfg.Orphans.VolumesWithoutPV(ctx, ids, confirm)
		},
		waits: func(ctx context.Context, it swept) (bool, error) {
			if it.claimName == "" {
				return false, nil
			}
			return d.cfg.Orphans.ClaimWaits(ctx, it.claimNamespace, it.claimName, makeID(it.dk.name, it.key), it.name)
		},
		get: func(ctx context.Context, dk *disk, key string) (time.Time, backend.Refs, error) {
			v, err := dk.backend.GetVolume(ctx, key)
			if err != nil {
				return time.Time{}, backend.Refs{}, err
			}
			return v.CreatedAt, v.Refs, nil
		},
		set: func(ctx context.Context, dk *disk, key string, refs backend.Refs) error {
			return dk.backend.SetVolumeRefs(ctx, key, refs)
		},
		remove: func(ctx context.Context, dk *disk, key string) error { return dk.backend.DeleteVolume(ctx, key) },
	}
}

func (d *Driver) snapshotRefs() refKind {
	return refKind{
		name: orphanSnapshot, lock: "snapshot/",
		without: func(ctx context.Context, ids []string, _ bool) ([]string, error) {
			return d.cfg.Orphans.SnapshotsWithoutContent(ctx, ids)
		},
		waits: func(ctx context.Context, it swept) (bool, error) {
			return d.cfg.Orphans.SnapshotWaits(ctx, makeID(it.dk.name, it.source), it.name)
		},
		get: func(ctx context.Context, dk *disk, key string) (time.Time, backend.Refs, error) {
			s, err := dk.backend.GetSnapshot(ctx, key)
			if err != nil {
				return time.Time{}, backend.Refs{}, err
			}
			return s.CreatedAt, s.Refs, nil
		},
		set: func(ctx context.Context, dk *disk, key string, refs backend.Refs) error {
			return dk.backend.SetSnapshotRefs(ctx, key, refs)
		},
		remove: func(ctx context.Context, dk *disk, key string) error { return dk.backend.DeleteSnapshot(ctx, key) },
	}
}

// sweepOrphans lists every volume and snapshot of the healthy disks and
// brings their Refs up to date with the API, removing those that never
// had a PV or content and have been without one for the grace period.
func (d *Driver) sweepOrphans(ctx context.Context) {
	logger := klog.FromContext(ctx)
	if d.cfg.Orphans == nil {
		return
	}
	var vols, snaps []swept
	for _, dk := range d.disks() {
		if dk.health(ctx) != nil {
			continue
		}
		// What was referred to while the disk was down counts before
		// anything of it is judged.
		d.recordLateRefs(ctx, dk)
		vs, err := dk.backend.ListVolumes(ctx)
		if err != nil {
			logger.Error(err, "Listing volumes for the orphan sweep", "disk", dk.name)
			continue
		}
		for _, v := range vs {
			vols = append(vols, swept{dk: dk, key: v.Key, name: v.Name, created: v.CreatedAt, refs: v.Refs,
				claimNamespace: v.PVCNamespace, claimName: v.PVCName})
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
			snaps = append(snaps, swept{dk: dk, key: s.Key, name: s.Name, created: s.CreatedAt, refs: s.Refs, source: s.SourceVolume})
		}
	}
	d.sweep(ctx, d.volumeRefs(), vols)
	d.sweep(ctx, d.snapshotRefs(), snaps)
}

// sweep updates the Refs of items and removes the orphans among them.
func (d *Driver) sweep(ctx context.Context, kind refKind, items []swept) {
	if len(items) == 0 {
		return
	}
	logger := klog.FromContext(ctx)
	// Records keep whole seconds (LVM tags hold Unix seconds).
	now, grace := d.now().UTC().Truncate(time.Second), d.cfg.OrphanGracePeriod
	ids := make([]string, len(items))
	for i, it := range items {
		ids[i] = makeID(it.dk.name, it.key)
	}
	unref, err := kind.without(ctx, ids, false)
	if err != nil {
		logger.Error(err, "Cannot tell what refers to the disks' contents, changing nothing", "kind", kind.name, "count", len(ids))
		return
	}
	without := sets.New(unref...)
	var candidates []swept
	for i, it := range items {
		switch {
		case !without.Has(ids[i]) && it.refs.Equal(backend.Refs{}):
			// Referenced, as recorded: no lock taken (see referenced).
		case !without.Has(ids[i]):
			_ = d.updateRefs(ctx, kind, it, func(backend.Refs) backend.Refs { return backend.Refs{} })
		case it.refs.UnreferencedSince.IsZero():
			_ = d.updateRefs(ctx, kind, it, func(r backend.Refs) backend.Refs {
				if r.UnreferencedSince.IsZero() {
					r.UnreferencedSince = now
					if !r.NeverReferenced {
						logger.Info("Nothing refers to it any more; keeping it until it is reclaimed", "kind", kind.name, "id", ids[i], "name", it.name)
					}
				}
				return r
			})
		case it.refs.NeverReferenced && grace > 0 && now.Sub(it.refs.UnreferencedSince) >= grace:
			candidates = append(candidates, it)
		}
	}
	d.removeOrphans(ctx, kind, candidates)
}

// updateRefs replaces an item's Refs with what change makes of the
// current ones, under the item's lock. NeverReferenced is never set again
// once cleared.
func (d *Driver) updateRefs(ctx context.Context, kind refKind, it swept, change func(backend.Refs) backend.Refs) error {
	unlock, err := d.locks.lock(ctx, kind.lock+it.key)
	if err != nil {
		return err
	}
	defer unlock()
	if err := d.changeRefs(ctx, kind, it.dk, it.key, change); err != nil && !errors.Is(err, backend.ErrNotFound) {
		klog.FromContext(ctx).Error(err, "Recording what refers to it", "kind", kind.name, "id", makeID(it.dk.name, it.key))
		return err
	}
	return nil
}

// referenceComing starts an item's time without a reference over when a
// sidecar's idempotent retry of CreateVolume or CreateSnapshot returned it:
// the sidecar has no API object naming it yet (PV, or the handle in a
// VolumeSnapshotContent's status) and is about to make one, so no sweep
// may remove what it was just given.
func (d *Driver) referenceComing(ctx context.Context, kind refKind, dk *disk, key string, refs backend.Refs) error {
	if refs.UnreferencedSince.IsZero() {
		return nil
	}
	return d.changeRefs(ctx, kind, dk, key, func(r backend.Refs) backend.Refs {
		r.UnreferencedSince = time.Time{}
		return r
	})
}

// changeRefs is updateRefs for a caller that holds the lock.
func (d *Driver) changeRefs(ctx context.Context, kind refKind, dk *disk, key string, change func(backend.Refs) backend.Refs) error {
	_, cur, err := kind.get(ctx, dk, key)
	if err != nil {
		return err
	}
	next := change(cur)
	next.NeverReferenced = next.NeverReferenced && cur.NeverReferenced
	if next.Equal(cur) {
		return nil
	}
	return kind.set(ctx, dk, key, next)
}

// VolumeReferenced records that a PersistentVolume refers to the volume
// id, if it is one of this node's: from then on the driver never removes
// it on its own. The PV informer calls it for every PV of this driver it
// sees that is not on another node, so a PV that existed for a moment
// between two sweeps still counts.
func (d *Driver) VolumeReferenced(ctx context.Context, id string) {
	d.referenced(ctx, d.volumeRefs(), id)
}

// SnapshotReferenced records that a VolumeSnapshotContent refers to the
// snapshot id, if it is one of this node's: from then on the driver never
// removes it on its own. The VolumeSnapshotContent informer calls it for
// every snapshot handle of this driver it sees, so a content deleted
// before the next sweep (deletionPolicy Retain, the snapshot to be
// imported again) still counts.
func (d *Driver) SnapshotReferenced(ctx context.Context, id string) {
	d.referenced(ctx, d.snapshotRefs(), id)
}

// referenced clears the Refs of the volume or snapshot id for good.
func (d *Driver) referenced(ctx context.Context, kind refKind, id string) {
	if !d.ready.Load() {
		return
	}
	diskName, key, err := parseID(kind.name, id)
	if err != nil {
		return
	}
	dk, err := d.availableDisk(diskName, kind.name, id)
	if err != nil {
		if d.disk(diskName) != nil {
			// Down: recorded by the first sweep once it started
			// (recordLateRefs).
			d.late.add(kind.name, diskName, id)
		}
		return
	}
	_ = d.recordReference(ctx, kind, dk, key)
}

// recordReference clears the Refs of the volume or snapshot key of dk.
func (d *Driver) recordReference(ctx context.Context, kind refKind, dk *disk, key string) error {
	// Most events are of objects already recorded: those take no lock,
	// which a clone holds on its source volume and a restore on its
	// source snapshot for the whole copy, and the informer's handler
	// would hold up every other object's event behind it.
	if _, refs, err := kind.get(ctx, dk, key); err == nil && refs.Equal(backend.Refs{}) {
		return nil
	}
	return d.updateRefs(ctx, kind, swept{dk: dk, key: key}, func(backend.Refs) backend.Refs { return backend.Refs{} })
}

// lateRefs are the IDs of volumes and snapshots that a PV or
// VolumeSnapshotContent referred to while their disk could not be read (not
// mounted yet, held by another driver), by disk: the event cannot be
// recorded then, and the object may be gone by the time the disk starts
// and the sweep looks (a PV deleted with Retain), which would leave the
// volume reading as never referenced, to be removed.
type lateRefs struct {
	mu sync.Mutex
	// byDisk holds, by disk name, the kinds (refKind.name) and IDs.
	byDisk map[string]map[[2]string]bool
}

func (l *lateRefs) add(kind, disk, id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byDisk == nil {
		l.byDisk = map[string]map[[2]string]bool{}
	}
	if l.byDisk[disk] == nil {
		l.byDisk[disk] = map[[2]string]bool{}
	}
	l.byDisk[disk][[2]string{kind, id}] = true
}

// take returns and forgets what was referred to on disk.
func (l *lateRefs) take(disk string) [][2]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	refs := make([][2]string, 0, len(l.byDisk[disk]))
	for r := range l.byDisk[disk] {
		refs = append(refs, r)
	}
	delete(l.byDisk, disk)
	return refs
}

// recordLateRefs records what was referred to on dk while it was down, dk
// being healthy. It runs in every sweep, before the sweep judges any of
// dk's volumes and snapshots, and not in the status refresh: a recording
// that waits (a clone holding the volume's lock for its whole copy, many
// lvs calls) must not make the disk read as not answering. What cannot be
// recorded is put back for the next sweep.
func (d *Driver) recordLateRefs(ctx context.Context, dk *disk) {
	for _, r := range d.late.take(dk.name) {
		kind := d.volumeRefs()
		if r[0] == orphanSnapshot {
			kind = d.snapshotRefs()
		}
		_, key, err := parseID(kind.name, r[1])
		if err == nil && d.recordReference(ctx, kind, dk, key) != nil {
			d.late.add(r[0], dk.name, r[1])
		}
	}
}

// removeOrphans leaves out the candidates something still waits for, asks
// the API server to confirm that nothing refers to the others, and
// removes those. (Waiting is asked first: a volume whose claim waits may
// stay a candidate for long, and the confirmation lists every PV.)
func (d *Driver) removeOrphans(ctx context.Context, kind refKind, candidates []swept) {
	logger := klog.FromContext(ctx)
	byID := map[string]swept{}
	ids := make([]string, 0, len(candidates))
	for _, it := range candidates {
		id := makeID(it.dk.name, it.key)
		if kind.waits != nil {
			waits, err := kind.waits(ctx, it)
			if err != nil || waits {
				logger.Info("Keeping an item nothing refers to yet: what it was made for still waits for it, or cannot be read",
					"kind", kind.name, "id", id, "name", it.name, "claim", klog.KRef(it.claimNamespace, it.claimName), "err", err)
				continue
			}
		}
		byID[id] = it
		ids = append(ids, id)
	}
	if len(ids) == 0 {
		return
	}
	orphans, err := kind.without(ctx, ids, true)
	if err != nil {
		logger.Error(err, "Cannot tell which are orphans, removing none", "kind", kind.name, "candidates", len(ids))
		return
	}
	for _, id := range orphans {
		it, ok := byID[id]
		if !ok {
			continue
		}
		err := d.removeOrphan(ctx, kind, it)
		switch {
		case errors.Is(err, errReplaced):
			logger.V(2).Info("Orphan candidate changed during the sweep, keeping it", "kind", kind.name, "id", id)
		case errors.Is(err, backend.ErrInUse):
			logger.Info("Orphan is in use, keeping it", "kind", kind.name, "id", id, "name", it.name, "err", err.Error())
		case err != nil:
			logger.Error(err, "Removing orphan", "kind", kind.name, "id", id, "name", it.name)
		default:
			logger.Info("Removed orphan: nothing ever referred to it", "kind", kind.name, "id", id, "name", it.name,
				"withoutReferenceFor", d.now().Sub(it.refs.UnreferencedSince).Round(time.Second))
			d.diskMetrics.orphansRemoved.WithLabelValues(kind.name).Inc()
			d.triggerStatus()
		}
	}
}

// errReplaced says a candidate was deleted, made again, or referred to
// since the sweep listed it; it is not an orphan of this sweep.
var errReplaced = errors.New("deleted, made again or referred to since it was listed")

// removeOrphan deletes the item under its lock if it is still the one the
// sweep listed and still never referenced.
func (d *Driver) removeOrphan(ctx context.Context, kind refKind, it swept) error {
	unlock, err := d.locks.lock(ctx, kind.lock+it.key)
	if err != nil {
		return err
	}
	defer unlock()
	created, refs, err := kind.get(ctx, it.dk, it.key)
	if errors.Is(err, backend.ErrNotFound) || (err == nil && (!created.Equal(it.created) || !refs.Equal(it.refs))) {
		return errReplaced
	}
	if err != nil {
		return err
	}
	return kind.remove(ctx, it.dk, it.key)
}
