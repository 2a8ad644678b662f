package driver

import (
	"context"
	"errors"
	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/klog/v2"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/csi-driver/backend"
)

// CreateSnapshot implements csi.ControllerServer. A snapshot lives on its
// source volume's disk as a reflink copy.
func (d *Driver) CreateSnapshot(ctx context.Context, req *csi.CreateSnapshotRequest) (*csi.CreateSnapshotResponse, error) {
	if err := checkName("snapshot", req.GetName()); err != nil {
		return nil, err
	}
	if req.GetSourceVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "source volume ID is missing")
	}
	dk, srcKey, err := d.volumeOf(req.GetSourceVolumeId())
	if err != nil {
		return nil, err
	}
	key := backend.KeyForName(req.GetName())
	// The source's lock keeps it as it is until the snapshot is made: an
	// expansion in between would leave an LVM snapshot of the grown volume
	// whose copy-on-write area and recorded size are for the smaller one,
	// and a DeleteVolume in between could miss the snapshot that depends
	// on it. The volume's lock comes first (see keyLocks).
	unlock, err := d.locks.lock(ctx, "volume/"+srcKey)
	if err != nil {
		return nil, err
	}
	defer unlock()
	unlockSnapshot, err := d.locks.lock(ctx, "snapshot/"+key)
	if err != nil {
		return nil, err
	}
	defer unlockSnapshot()
	for _, other := range d.disks() {
		if other.health(ctx) != nil {
			continue
		}
		snap, err := other.backend.GetSnapshot(ctx, key)
		if errors.Is(err, backend.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, toStatus(err)
		}
		if other != dk || snap.SourceVolume != srcKey || snap.Name != req.GetName() {
			return nil, status.Errorf(codes.AlreadyExists, "snapshot %q exists for another source volume", req.GetName())
		}
		// One name, two VolumeSnapshots of the volume: csi-snapshotter's
		// --snapshot-name-uuid-length cuts the VolumeSnapshot's UID in the
		// name. The later one must not get the earlier point in time.
		if content := req.GetParameters()[diskfit.SnapshotContentNameKey]; snap.For != "" && content != "" && snap.For != content {
			return nil, status.Errorf(codes.AlreadyExists, "snapshot %q exists for VolumeSnapshotContent %s, not %s", req.GetName(), snap.For, content)
		}
		// The snapshotter asks again because it has not recorded the
		// snapshot's handle yet and will.
		if err := d.referenceComing(ctx, d.snapshotRefs(), dk, key, snap.Refs); err != nil {
			return nil, toStatus(fmt.Errorf("snapshot %q: %w", req.GetName(), err))
		}
		return &csi.CreateSnapshotResponse{Snapshot: d.csiSnapshot(dk, snap)}, nil
	}
	if _, err := dk.backend.GetVolume(ctx, srcKey); err != nil {
		return nil, toStatus(fmt.Errorf("source volume %s: %w", req.GetSourceVolumeId(), err))
	}
	if !dk.backend.SupportsSnapshots() {
		return nil, status.Errorf(codes.FailedPrecondition, "disk %s cannot take snapshots (no reflink)", dk.name)
	}
	release, err := dk.hold()
	if err != nil {
		return nil, err
	}
	defer release()
	snap, err := dk.backend.CreateSnapshot(ctx, backend.SnapshotRequest{Key: key, Name: req.GetName(), SourceKey: srcKey,
		For: req.GetParameters()[diskfit.SnapshotContentNameKey]})
	if err != nil {
		return nil, toStatus(fmt.Errorf("creating snapshot %q: %w", req.GetName(), err))
	}
	klog.FromContext(ctx).Info("Created snapshot", "snapshot", makeID(dk.name, key), "source", req.GetSourceVolumeId())
	d.triggerStatus()
	return &csi.CreateSnapshotResponse{Snapshot: d.csiSnapshot(dk, snap)}, nil
}

// csiSnapshot describes a snapshot for CSI. Snapshots live on their
// volume's disk; a volume restored from one is made on that disk and its
// own accessible topology pins it to this node.
func (d *Driver) csiSnapshot(dk *disk, s *backend.Snapshot) *csi.Snapshot {
	return &csi.Snapshot{
		SnapshotId:     makeID(dk.name, s.Key),
		SourceVolumeId: makeID(dk.name, s.SourceVolume),
		SizeBytes:      s.SizeBytes,
		CreationTime:   timestamppb.New(s.CreatedAt),
		ReadyToUse:     true,
	}
}

// GetSnapshot implements csi.ControllerServer.
func (d *Driver) GetSnapshot(ctx context.Context, req *csi.GetSnapshotRequest) (*csi.GetSnapshotResponse, error) {
	diskName, key, err := parseID("snapshot", req.GetSnapshotId())
	if err != nil {
		return nil, err
	}
	dk, err := d.availableDisk(diskName, "snapshot", req.GetSnapshotId())
	if err != nil {
		return nil, err
	}
	snap, err := dk.backend.GetSnapshot(ctx, key)
	if err != nil {
		return nil, toStatus(fmt.Errorf("snapshot %q: %w", req.GetSnapshotId(), err))
	}
	return &csi.GetSnapshotResponse{Snapshot: d.csiSnapshot(dk, snap)}, nil
}

// DeleteSnapshot implements csi.ControllerServer; a missing snapshot is fine.
func (d *Driver) DeleteSnapshot(ctx context.Context, req *csi.DeleteSnapshotRequest) (*csi.DeleteSnapshotResponse, error) {
	dk, key, err := d.toDelete("snapshot", "VolumeSnapshotContent's deletionPolicy", req.GetSnapshotId())
	if dk == nil {
		return &csi.DeleteSnapshotResponse{}, err
	}
	unlock, err := d.locks.lock(ctx, "snapshot/"+key)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := d.snapshotStillReferred(ctx, req.GetSnapshotId()); err != nil {
		return nil, err
	}
	if err := dk.backend.DeleteSnapshot(ctx, key); err != nil {
		return nil, toStatus(fmt.Errorf("deleting snapshot %s: %w", req.GetSnapshotId(), err))
	}
	d.triggerStatus()
	return &csi.DeleteSnapshotResponse{}, nil
}

// snapshotStillReferred refuses, FailedPrecondition, to delete a snapshot
// a VolumeSnapshotContent other than those the snapshotter deletes it for
// (deletesItsSnapshot) still refers to (an admin shared it with another
// namespace through a pre-provisioned content), and calls the deletion
// off: those get deletion policy Retain, so that the snapshotter lets them
// go without deleting it (callOffWhileReferred, stillReferred's rule).
// Unavailable when it cannot tell. Without an OrphanFinder (no API
// server) it refuses nothing.
func (d *Driver) snapshotStillReferred(ctx context.Context, id string) error {
	if d.cfg.Orphans == nil {
		return nil
	}
	return callOffWhileReferred(ctx, referrers[*unstructured.Unstructured]{
		what: "snapshot", kind: "VolumeSnapshotContent", policy: "deletionPolicy Retain", list: d.cfg.Orphans.ContentsOf,
		asks: deletesItsSnapshot, name: (*unstructured.Unstructured).GetName, retain: d.cfg.Orphans.RetainContent,
	}, id)
}

// deletesItsSnapshot says that the snapshotter deletes c's snapshot, as
// external-snapshotter v8's sidecar decides (shouldDelete): c is being
// deleted with deletionPolicy Delete, and either is a pre-provisioned
// content bound to no VolumeSnapshot, or its VolumeSnapshot's deletion
// marked it (volumesnapshot-being-deleted) and it is not still being
// created. A content deleted by hand while its VolumeSnapshot exists stays,
// held by its finalizer, and usable: it keeps the snapshot.
func deletesItsSnapshot(c *unstructured.Unstructured) bool {
	policy, _, _ := unstructured.NestedString(c.Object, "spec", "deletionPolicy")
	if c.GetDeletionTimestamp() == nil || policy != "Delete" {
		return false
	}
	handle, _, _ := unstructured.NestedString(c.Object, "spec", "source", "snapshotHandle")
	bound, _, _ := unstructured.NestedString(c.Object, "spec", "volumeSnapshotRef", "uid")
	annotations := c.GetAnnotations()
	_, creating := annotations["snapshot.storage.kubernetes.io/volumesnapshot-being-created"]
	_, deleting := annotations["snapshot.storage.kubernetes.io/volumesnapshot-being-deleted"]
	return handle != "" && bound == "" || !creating && deleting
}
