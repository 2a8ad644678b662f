package driver

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/csi-driver/backend"
)

// The Controller service. This file holds the volumes: creating,
// deleting, getting and validating one, and its health; placement.go
// decides which disk a new volume goes to (and what GetCapacity reports),
// snapshots.go holds the snapshots, listing.go the paged lists of volumes,
// snapshots and volume health.

var _ csi.ControllerServer = &Driver{}

// ControllerGetCapabilities implements csi.ControllerServer. Snapshots and
// clones are advertised only when at least one disk can do them.
//
// EXPAND_VOLUME is deliberately absent, and ControllerExpandVolume is left
// to the embedded UnimplementedControllerServer: a cluster runs one
// external-resizer, connected to one node's driver, which could not grow a
// volume on another node. Without the capability the resizer only updates
// the PV and leaves the growing to NodeExpandVolume on the volume's node.
func (d *Driver) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	caps := []*csi.ControllerServiceCapability{
		controllerCap(csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME),
		controllerCap(csi.ControllerServiceCapability_RPC_LIST_VOLUMES),
		controllerCap(csi.ControllerServiceCapability_RPC_GET_CAPACITY),
		controllerCap(csi.ControllerServiceCapability_RPC_GET_VOLUME),
		controllerCap(csi.ControllerServiceCapability_RPC_GET_VOLUME_HEALTH),
		controllerCap(csi.ControllerServiceCapability_RPC_LIST_VOLUME_HEALTH),
		controllerCap(csi.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER),
	}
	if d.snapshotsSupported() {
		caps = append(caps,
			controllerCap(csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT),
			controllerCap(csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS),
			controllerCap(csi.ControllerServiceCapability_RPC_GET_SNAPSHOT),
			controllerCap(csi.ControllerServiceCapability_RPC_CLONE_VOLUME),
		)
	}
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}

func (d *Driver) snapshotsSupported() bool {
	for _, dk := range d.disks() {
		if dk.unavailable() == nil && dk.backend.SupportsSnapshots() {
			return true
		}
	}
	return false
}

// CreateVolume implements csi.ControllerServer.
func (d *Driver) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	if err := checkName("volume", req.GetName()); err != nil {
		return nil, err
	}
	if err := checkCapabilities(req.GetVolumeCapabilities()); err != nil {
		return nil, err
	}
	fsType, err := fsTypeOf(req.GetVolumeCapabilities(), req.GetParameters())
	if err != nil {
		return nil, err
	}
	// fsType is empty exactly when every capability is Block.
	size, err := volumeSize(req.GetCapacityRange(), fsType == "")
	if err != nil {
		return nil, err
	}
	if err := d.checkRequisite(req.GetAccessibilityRequirements()); err != nil {
		return nil, err
	}
	key := backend.KeyForName(req.GetName())
	unlock, err := d.locks.lock(ctx, "volume/"+key)
	if err != nil {
		return nil, err
	}
	defer unlock()

	dk, vol, err := d.findVolume(ctx, key)
	if err != nil {
		return nil, toStatus(err)
	}
	if vol != nil {
		if vol.Name != req.GetName() || !sizeFits(vol.SizeBytes, req.GetCapacityRange()) || !sameSource(dk, vol, req.GetVolumeContentSource()) {
			return nil, status.Errorf(codes.AlreadyExists, "volume %q exists with size %d bytes and another size or source than requested", req.GetName(), vol.SizeBytes)
		}
		// One name, two claims: external-provisioner's
		// --volume-name-uuid-length cuts the claim's UID in the name.
		if ns, name := req.GetParameters()[diskfit.PVCNamespaceKey], req.GetParameters()[diskfit.PVCNameKey]; vol.PVCName != "" && name != "" &&
			(vol.PVCNamespace != ns || vol.PVCName != name) {
			return nil, status.Errorf(codes.AlreadyExists, "volume %q exists for claim %s/%s, not %s/%s", req.GetName(), vol.PVCNamespace, vol.PVCName, ns, name)
		}
		// The provisioner asks again because it has no PV yet and will make one.
		if err := d.referenceComing(ctx, d.volumeRefs(), dk, key, vol.Refs); err != nil {
			return nil, toStatus(fmt.Errorf("volume %q: %w", req.GetName(), err))
		}
		return &csi.CreateVolumeResponse{Volume: d.csiVolume(dk, vol, req.GetVolumeContentSource())}, nil
	}

	creq := backend.CreateRequest{Key: key, Name: req.GetName(), SizeBytes: size,
		PVCNamespace: req.GetParameters()[diskfit.PVCNamespaceKey], PVCName: req.GetParameters()[diskfit.PVCNameKey]}
	srcDisk, unlockSource, err := d.contentSource(ctx, req.GetVolumeContentSource(), req.GetCapacityRange().GetLimitBytes(), &creq)
	if err != nil {
		return nil, err
	}
	defer unlockSource()
	// A copy may be larger than asked for: never smaller than its source.
	size = creq.SizeBytes
	target, err := d.placeVolume(ctx, req.GetParameters(), size, srcDisk)
	if err != nil {
		return nil, err
	}
	release, err := target.hold()
	if err != nil {
		return nil, err
	}
	defer release()
	vol, err = target.backend.CreateVolume(ctx, creq)
	if errors.Is(err, backend.ErrNoSpace) {
		// Another volume took the space between the check and fallocate;
		// the backend removed what it had made.
		u, _ := target.usage(ctx)
		return nil, status.Errorf(codes.ResourceExhausted, "disk %s on node %s has %d bytes free, the volume needs %d: %v", target.name, d.cfg.NodeID, u.FreeBytes, size, err)
	}
	if err != nil {
		return nil, toStatus(fmt.Errorf("creating volume %q on disk %s: %w", req.GetName(), target.name, err))
	}
	klog.FromContext(ctx).Info("Created volume", "volume", makeID(target.name, key), "name", req.GetName(), "disk", target.name, "bytes", size,
		"pvc", klog.KRef(creq.PVCNamespace, creq.PVCName))
	d.triggerStatus()
	return &csi.CreateVolumeResponse{Volume: d.csiVolume(target, vol, req.GetVolumeContentSource())}, nil
}

// checkRequisite returns ResourceExhausted when the requisite topology
// leaves out this node: a volume can only be made where the driver runs.
func (d *Driver) checkRequisite(ar *csi.TopologyRequirement) error {
	if len(ar.GetRequisite()) == 0 {
		return nil
	}
	for _, t := range ar.GetRequisite() {
		if v, ok := t.GetSegments()[diskfit.TopologyKey]; !ok || v == d.cfg.NodeID {
			return nil
		}
	}
	return status.Errorf(codes.ResourceExhausted, "the requisite topology does not include node %s", d.cfg.NodeID)
}

// findVolume looks for key on every healthy disk; nil volume means none
// has it. Unhealthy disks are skipped: their volumes cannot be served, and
// a disk whose tools fail must not block creation on the others.
func (d *Driver) findVolume(ctx context.Context, key string) (*disk, *backend.Volume, error) {
	for _, dk := range d.disks() {
		if dk.health(ctx) != nil {
			continue
		}
		vol, err := dk.backend.GetVolume(ctx, key)
		if errors.Is(err, backend.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, nil, fmt.Errorf("looking for volume on disk %s: %w", dk.name, err)
		}
		return dk, vol, nil
	}
	return nil, nil, nil
}

func sameSource(dk *disk, vol *backend.Volume, src *csi.VolumeContentSource) bool {
	switch {
	case src.GetSnapshot() != nil:
		return src.GetSnapshot().GetSnapshotId() == makeID(dk.name, vol.SourceSnapshot)
	case src.GetVolume() != nil:
		return src.GetVolume().GetVolumeId() == makeID(dk.name, vol.SourceVolume)
	}
	return vol.SourceSnapshot == "" && vol.SourceVolume == ""
}

// contentSource resolves a snapshot or volume source into creq and returns
// the disk holding it, which is where the new volume must go: reflink
// copies only work within one filesystem. The source's lock is held
// from before its size is read until unlock, which the caller calls once
// the copy is made: no stage gives a source volume to a pod meanwhile (an
// LVM clone copies the live source block by block, and refuses one in
// use only when it starts), no expansion grows it past the size read, no
// deletion removes a volume or snapshot mid-copy. The lock is taken only
// for a source that exists and is not the volume being made (see
// keyLocks).
func (d *Driver) contentSource(ctx context.Context, src *csi.VolumeContentSource, limit int64, creq *backend.CreateRequest) (_ *disk, unlock func(), err error) {
	unlock = func() {}
	defer func() {
		if err != nil {
			unlock()
		}
	}()
	var id, kind string
	switch {
	case src == nil:
		return nil, unlock, nil
	case src.GetSnapshot() != nil:
		id, kind = src.GetSnapshot().GetSnapshotId(), "snapshot"
	case src.GetVolume() != nil:
		id, kind = src.GetVolume().GetVolumeId(), "volume"
	default:
		return nil, unlock, status.Error(codes.InvalidArgument, "unknown volume content source")
	}
	diskName, key, err := parseID("source "+kind, id)
	if err != nil {
		return nil, unlock, err
	}
	dk, err := d.availableDisk(diskName, "source "+kind, id)
	if err != nil {
		return nil, unlock, err
	}
	if !dk.backend.SupportsSnapshots() {
		return nil, unlock, status.Errorf(codes.InvalidArgument, "disk %s cannot copy volumes (no reflink)", dk.name)
	}
	// The source is seen ready before its lock is waited for, and read
	// again under it. Its lock is held until the copy is made: no
	// deletion of a snapshot (whose LV the wiper would zero under the
	// copy), and no stage, expansion or deletion of a volume, runs
	// meanwhile.
	var srcSize int64
	if kind == "snapshot" {
		if _, err := dk.backend.GetSnapshot(ctx, key); err != nil {
			return nil, unlock, toStatus(fmt.Errorf("source snapshot %q: %w", id, err))
		}
		if unlock, err = d.locks.lock(ctx, "snapshot/"+key); err != nil {
			return nil, func() {}, err
		}
		snap, err := dk.backend.GetSnapshot(ctx, key)
		if err != nil {
			return nil, unlock, toStatus(fmt.Errorf("source snapshot %q: %w", id, err))
		}
		srcSize, creq.FromSnapshot = snap.SizeBytes, key
	} else {
		if _, err := dk.backend.GetVolume(ctx, key); err != nil {
			return nil, unlock, toStatus(fmt.Errorf("source volume %q: %w", id, err))
		}
		if key == creq.Key {
			// Only when the lookup of the new volume missed it (its disk
			// unhealthy a moment before): its lock is held already.
			return nil, unlock, status.Errorf(codes.InvalidArgument, "volume %q cannot be its own source", creq.Name)
		}
		if unlock, err = d.locks.lock(ctx, "volume/"+key); err != nil {
			return nil, func() {}, err
		}
		vol, err := dk.backend.GetVolume(ctx, key)
		if err != nil {
			return nil, unlock, toStatus(fmt.Errorf("source volume %q: %w", id, err))
		}
		srcSize, creq.FromVolume = vol.SizeBytes, key
	}
	if creq.SizeBytes < srcSize {
		// A copy is never smaller than its source.
		if limit > 0 && srcSize > limit {
			return nil, unlock, status.Errorf(codes.OutOfRange, "source %s %q has %d bytes, more than the limit of %d", kind, id, srcSize, limit)
		}
		creq.SizeBytes = srcSize
	}
	return dk, unlock, nil
}

// csiVolume describes vol for CSI.
func (d *Driver) csiVolume(dk *disk, vol *backend.Volume, src *csi.VolumeContentSource) *csi.Volume {
	return &csi.Volume{
		VolumeId:           makeID(dk.name, vol.Key),
		CapacityBytes:      vol.SizeBytes,
		VolumeContext:      map[string]string{diskfit.VolumeContextDiskKey: dk.name},
		ContentSource:      src,
		AccessibleTopology: []*csi.Topology{d.topology()},
	}
}

func (d *Driver) topology() *csi.Topology {
	return &csi.Topology{Segments: map[string]string{diskfit.TopologyKey: d.cfg.NodeID}}
}

// DeleteVolume implements csi.ControllerServer; deleting a volume that does
// not exist succeeds.
//
// A volume another PV still refers to is not deleted: two PVs can name one
// volume (an admin moved it to another claim with a second PV and left
// the first one's reclaim policy at Delete), and deleting the first
// claim's would take the data from under the second. Only PVs Kubernetes
// deletes the volume for (Released or Failed, reclaim policy Delete) let
// it go. The deletion is then called off for good: the PVs that asked for
// it get reclaim policy Retain, so that the provisioner's retries stop
// and none succeeds later, once the other PV is gone (an admin giving the
// volume to yet another claim deletes it first).
func (d *Driver) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	dk, key, err := d.toDelete("volume", "PV's reclaim policy", req.GetVolumeId())
	if dk == nil {
		return &csi.DeleteVolumeResponse{}, err
	}
	unlock, err := d.locks.lock(ctx, "volume/"+key)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := d.stillReferred(ctx, req.GetVolumeId()); err != nil {
		return nil, err
	}
	if err := dk.backend.DeleteVolume(ctx, key); err != nil {
		return nil, toStatus(fmt.Errorf("deleting volume %s: %w", req.GetVolumeId(), err))
	}
	klog.FromContext(ctx).Info("Deleted volume", "volume", req.GetVolumeId())
	d.triggerStatus()
	return &csi.DeleteVolumeResponse{}, nil
}

// stillReferred refuses, FailedPrecondition, to delete a volume a PV other
// than those Kubernetes deletes it for (deletesItsVolume) still refers to,
// and calls the deletion off: those get reclaim policy Retain. Unavailable
// when it cannot tell. Without an OrphanFinder (no API server) it refuses
// nothing.
func (d *Driver) stillReferred(ctx context.Context, id string) error {
	if d.cfg.Orphans == nil {
		return nil
	}
	return callOffWhileReferred(ctx, referrers[*corev1.PersistentVolume]{
		what: "volume", kind: "PersistentVolume", policy: "reclaim policy Retain", list: d.cfg.Orphans.PVsOf,
		asks: deletesItsVolume, name: func(pv *corev1.PersistentVolume) string { return pv.Name }, retain: d.cfg.Orphans.Retain,
	}, id)
}

// referrers is what may refer to a volume or a snapshot (PVs,
// VolumeSnapshotContents) for callOffWhileReferred: what is deleted, the
// objects' kind, the policy that calls a deletion off, how to list the
// objects that refer to it, which ask for the deletion, their names and
// how to set that policy.
type referrers[T any] struct {
	what, kind, policy string
	list               func(context.Context, string) ([]T, error)
	asks               func(T) bool
	name               func(T) string
	retain             func(context.Context, T) error
}

// callOffWhileReferred is the rule of DeleteVolume and DeleteSnapshot: the
// deletion goes on (nil) when every object that refers to id asks for it;
// otherwise it is refused, FailedPrecondition naming the others, and
// called off for good: those that asked get the policy that keeps the
// volume or snapshot (r.retain), so that no retry deletes it once the
// others are gone. Unavailable when it cannot tell.
func callOffWhileReferred[T any](ctx context.Context, r referrers[T], id string) error {
	objs, err := r.list(ctx, id)
	if err != nil {
		return status.Errorf(codes.Unavailable, "%s %s not deleted: cannot tell whether another %s refers to it: %v", r.what, id, r.kind, err)
	}
	var keeping, deleting []T
	for _, o := range objs {
		if r.asks(o) {
			deleting = append(deleting, o)
		} else {
			keeping = append(keeping, o)
		}
	}
	if len(keeping) == 0 {
		return nil
	}
	names := func(objs []T) string {
		out := make([]string, len(objs))
		for i, o := range objs {
			out[i] = r.name(o)
		}
		slices.Sort(out)
		return strings.Join(out, ", ")
	}
	msg := fmt.Sprintf("%s %s not deleted: %s %s also refers to it and would lose its data", r.what, id, r.kind, names(keeping))
	var retained []T
	var errs []error
	for _, o := range deleting {
		if err := r.retain(ctx, o); err != nil {
			errs = append(errs, err)
		} else {
			retained = append(retained, o)
		}
	}
	if len(retained) > 0 {
		msg += fmt.Sprintf("; the deletion is called off: %s %s now has %s, delete it when it is not needed", r.kind, names(retained), r.policy)
	}
	if err := errors.Join(errs...); err != nil {
		klog.FromContext(ctx).Error(err, "Calling off the deletion of a "+r.what+" another "+r.kind+" refers to", r.what, id)
		msg += fmt.Sprintf("; to call the deletion off, set the deleted %s to %s (%v)", r.kind, r.policy, err)
	}
	return status.Error(codes.FailedPrecondition, msg)
}

// deletesItsVolume says that Kubernetes deletes pv's volume: it is
// Released or Failed with reclaim policy Delete.
func deletesItsVolume(pv *corev1.PersistentVolume) bool {
	released := pv.Status.Phase == corev1.VolumeReleased || pv.Status.Phase == corev1.VolumeFailed
	return released && pv.Spec.PersistentVolumeReclaimPolicy == corev1.PersistentVolumeReclaimDelete
}

// getVolume returns a ready volume or NotFound.
func (d *Driver) getVolume(ctx context.Context, id string) (*disk, *backend.Volume, error) {
	dk, key, err := d.volumeOf(id)
	if err != nil {
		return nil, nil, err
	}
	vol, err := dk.backend.GetVolume(ctx, key)
	if err != nil {
		return nil, nil, toStatus(fmt.Errorf("volume %q on disk %s: %w", id, dk.name, err))
	}
	return dk, vol, nil
}

// ValidateVolumeCapabilities implements csi.ControllerServer.
func (d *Driver) ValidateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	if _, _, err := parseID("volume", req.GetVolumeId()); status.Code(err) == codes.InvalidArgument {
		return nil, err
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "volume capabilities are missing")
	}
	if _, _, err := d.getVolume(ctx, req.GetVolumeId()); err != nil {
		return nil, err
	}
	if err := checkCapabilities(req.GetVolumeCapabilities()); err != nil {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: status.Convert(err).Message()}, nil
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
	}}, nil
}

// volumeHealth reports whether a volume's data is reachable. CSI 1.13
// replaced the volume condition with these health entries; an empty list
// means healthy.
func (d *Driver) volumeHealth(ctx context.Context, dk *disk, key string) *csi.VolumeHealth {
	h := &csi.VolumeHealth{VolumeId: makeID(dk.name, key)}
	inaccessible := func(reason, msg string) {
		h.HealthStatuses = []*csi.VolumeHealth_VolumeHealthEntry{{Status: csi.VolumeHealthErrorType_INACCESSIBLE, Reason: reason, Message: msg}}
	}
	if err := dk.health(ctx); err != nil {
		inaccessible("DiskUnhealthy", fmt.Sprintf("disk %s on node %s is unhealthy: %v", dk.name, d.cfg.NodeID, err))
	} else if err := dk.backend.VolumeHealth(ctx, key); err != nil {
		inaccessible("BackingStorageMissing", err.Error())
	}
	return h
}

// healthOf answers the health RPCs for one volume ID. A volume on an
// unhealthy disk is INACCESSIBLE: its record cannot be read to tell
// whether it exists, and the CO asks only about volumes it knows.
func (d *Driver) healthOf(ctx context.Context, id string) (*csi.VolumeHealth, error) {
	dk, key, err := d.volumeOf(id)
	if err != nil {
		return nil, err
	}
	if dk.health(ctx) == nil {
		if _, _, err := d.getVolume(ctx, id); err != nil {
			return nil, err
		}
	}
	return d.volumeHealth(ctx, dk, key), nil
}

// ControllerGetVolume implements csi.ControllerServer.
func (d *Driver) ControllerGetVolume(ctx context.Context, req *csi.ControllerGetVolumeRequest) (*csi.ControllerGetVolumeResponse, error) {
	dk, vol, err := d.getVolume(ctx, req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	return &csi.ControllerGetVolumeResponse{
		Volume: d.csiVolume(dk, vol, nil),
		Status: &csi.ControllerGetVolumeResponse_VolumeStatus{},
	}, nil
}

// ControllerGetVolumeHealth implements csi.ControllerServer: a volume whose
// backing file or disk is gone is INACCESSIBLE.
func (d *Driver) ControllerGetVolumeHealth(ctx context.Context, req *csi.ControllerGetVolumeHealthRequest) (*csi.ControllerGetVolumeHealthResponse, error) {
	h, err := d.healthOf(ctx, req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	return &csi.ControllerGetVolumeHealthResponse{VolumeHealth: h}, nil
}
