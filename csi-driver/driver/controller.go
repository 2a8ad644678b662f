package driver

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
	"github.com/diskfit/diskfit/csi-driver/backend"
)

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
	defer d.locks.lock("volume/" + key)()

	dk, vol, err := d.findVolume(ctx, key)
	if err != nil {
		return nil, toStatus(err)
	}
	if vol != nil {
		if vol.Name != req.GetName() || !sizeFits(vol.SizeBytes, req.GetCapacityRange()) || !sameSource(dk, vol, req.GetVolumeContentSource()) {
			return nil, status.Errorf(codes.AlreadyExists, "volume %q exists with size %d bytes and another size or source than requested", req.GetName(), vol.SizeBytes)
		}
		// The provisioner asks again because it has no PV yet and will make
		// one: the time without a PV starts over, so that no sweep removes
		// the volume it is about to get.
		if !vol.UnreferencedSince.IsZero() {
			err := d.changeRefs(ctx, d.volumeRefs(), dk, key, func(r backend.Refs) backend.Refs {
				r.UnreferencedSince = time.Time{}
				return r
			})
			if err != nil {
				return nil, toStatus(fmt.Errorf("volume %q: %w", req.GetName(), err))
			}
		}
		return &csi.CreateVolumeResponse{Volume: d.csiVolume(dk, vol, req.GetVolumeContentSource())}, nil
	}

	creq := backend.CreateRequest{Key: key, Name: req.GetName(), SizeBytes: size,
		PVCNamespace: req.GetParameters()[diskfit.PVCNamespaceKey], PVCName: req.GetParameters()[diskfit.PVCNameKey]}
	srcDisk, err := d.contentSource(ctx, req.GetVolumeContentSource(), req.GetCapacityRange().GetLimitBytes(), &creq)
	if err != nil {
		return nil, err
	}
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
// copies only work within one filesystem.
func (d *Driver) contentSource(ctx context.Context, src *csi.VolumeContentSource, limit int64, creq *backend.CreateRequest) (*disk, error) {
	var id, kind string
	switch {
	case src == nil:
		return nil, nil
	case src.GetSnapshot() != nil:
		id, kind = src.GetSnapshot().GetSnapshotId(), "snapshot"
	case src.GetVolume() != nil:
		id, kind = src.GetVolume().GetVolumeId(), "volume"
	default:
		return nil, status.Error(codes.InvalidArgument, "unknown volume content source")
	}
	diskName, key, err := parseID("source "+kind, id)
	if err != nil {
		return nil, err
	}
	dk, err := d.availableDisk(diskName, "source "+kind, id)
	if err != nil {
		return nil, err
	}
	if !dk.backend.SupportsSnapshots() {
		return nil, status.Errorf(codes.InvalidArgument, "disk %s cannot copy volumes (no reflink)", dk.name)
	}
	var srcSize int64
	if kind == "snapshot" {
		snap, err := dk.backend.GetSnapshot(ctx, key)
		if err != nil {
			return nil, toStatus(fmt.Errorf("source snapshot %q: %w", id, err))
		}
		srcSize, creq.FromSnapshot = snap.SizeBytes, key
	} else {
		vol, err := dk.backend.GetVolume(ctx, key)
		if err != nil {
			return nil, toStatus(fmt.Errorf("source volume %q: %w", id, err))
		}
		srcSize, creq.FromVolume = vol.SizeBytes, key
	}
	if creq.SizeBytes < srcSize {
		// A copy is never smaller than its source.
		if limit > 0 && srcSize > limit {
			return nil, status.Errorf(codes.OutOfRange, "source %s %q has %d bytes, more than the limit of %d", kind, id, srcSize, limit)
		}
		creq.SizeBytes = srcSize
	}
	return dk, nil
}

// placeVolume chooses the disk for a new volume. A disk named by the PVC's
// annotation (written by the DiskFit scheduler together with selected-node)
// is used exactly or not at all: if it cannot take the volume the answer is
// ResourceExhausted, which makes external-provisioner drop selected-node so
// the scheduler chooses again with fresh data. Without an annotation the
// driver picks the best-fitting disk itself. Neither way places a volume
// on a disk the DiskNode spec takes out of service.
func (d *Driver) placeVolume(ctx context.Context, params map[string]string, size int64, forced *disk) (*disk, error) {
	class := params[diskfit.DeviceClassParameter]
	annotated, err := d.annotatedDisk(ctx, params)
	if err != nil {
		return nil, err
	}
	spec, err := d.spec(ctx)
	if err != nil {
		return nil, err
	}
	if forced != nil && annotated != "" && annotated != forced.name {
		return nil, status.Errorf(codes.InvalidArgument, "the PVC's disk annotation names %s but the content source is on disk %s", annotated, forced.name)
	}
	if forced != nil {
		annotated = forced.name
	}
	if annotated != "" {
		dk := d.disk(annotated)
		if dk == nil {
			return nil, status.Errorf(codes.ResourceExhausted, "disk %q chosen for the volume does not exist on node %s", annotated, d.cfg.NodeID)
		}
		if err := dk.health(ctx); err != nil {
			return nil, status.Errorf(codes.ResourceExhausted, "disk %s on node %s is unhealthy: %v", dk.name, d.cfg.NodeID, err)
		}
		if out, reason := spec.DiskUnschedulable(dk.name); out {
			return nil, status.Errorf(codes.ResourceExhausted, "disk %s on node %s is unschedulable (taken out of service in its DiskNode spec: %q)", dk.name, d.cfg.NodeID, reason)
		}
		if class != "" && dk.class() != class {
			return nil, status.Errorf(codes.ResourceExhausted, "disk %s on node %s has device class %q, the StorageClass asks for %q", dk.name, d.cfg.NodeID, dk.class(), class)
		}
		u, err := dk.usage(ctx)
		if errors.Is(err, errNotAnswering) {
			return nil, status.Errorf(codes.ResourceExhausted, "disk %s on node %s is unhealthy: %v", dk.name, d.cfg.NodeID, err)
		}
		if err != nil {
			return nil, toStatus(err)
		}
		if u.FreeBytes < size {
			return nil, status.Errorf(codes.ResourceExhausted, "disk %s on node %s has %d bytes free, the volume needs %d", dk.name, d.cfg.NodeID, u.FreeBytes, size)
		}
		return dk, nil
	}
	// health and usage are bounded (see bounded.go): a disk that hangs
	// costs this loop the disk timeout once, and is then skipped at once
	// until its call returns, instead of hanging the RPC (and the
	// volume's lock) for as long as the device hangs.
	var best *disk
	var bestFree, largest int64
	largestName := ""
	for _, dk := range d.disks() {
		if out, _ := spec.DiskUnschedulable(dk.name); out || (class != "" && dk.class() != class) || dk.health(ctx) != nil {
			continue
		}
		u, err := dk.usage(ctx)
		if err != nil {
			continue
		}
		if u.FreeBytes > largest || largestName == "" {
			largest, largestName = u.FreeBytes, dk.name
		}
		if u.FreeBytes >= size && (best == nil || u.FreeBytes < bestFree) {
			best, bestFree = dk, u.FreeBytes
		}
	}
	if best == nil {
		if largestName == "" {
			return nil, status.Errorf(codes.ResourceExhausted, "node %s has no healthy disk of device class %q in service", d.cfg.NodeID, class)
		}
		return nil, status.Errorf(codes.ResourceExhausted, "no disk on node %s can hold %d bytes: the largest free disk %s has %d bytes", d.cfg.NodeID, size, largestName, largest)
	}
	return best, nil
}

// spec reads which disks an admin took out of service. Without an answer
// no volume is placed: a disk being emptied must not fill up again.
func (d *Driver) spec(ctx context.Context) (*v1alpha1.DiskNodeSpec, error) {
	if d.cfg.Spec == nil {
		return &v1alpha1.DiskNodeSpec{}, nil
	}
	spec, err := d.cfg.Spec.Spec(ctx)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "reading DiskNode %s for disks out of service: %v", d.cfg.NodeID, err)
	}
	return spec, nil
}

// annotatedDisk returns the disk named by the PVC's annotation when the
// PVC is scheduled to this node, "" when there is no usable annotation.
func (d *Driver) annotatedDisk(ctx context.Context, params map[string]string) (string, error) {
	ns, name := params[diskfit.PVCNamespaceKey], params[diskfit.PVCNameKey]
	if d.cfg.PVCs == nil || ns == "" || name == "" {
		return "", nil
	}
	pvc, err := d.cfg.PVCs.GetPVC(ctx, ns, name)
	if apierrors.IsNotFound(err) {
		klog.FromContext(ctx).Info("PVC not found, placing the volume without its annotation", "pvc", klog.KRef(ns, name))
		return "", nil
	}
	if err != nil {
		return "", status.Errorf(codes.Unavailable, "reading PVC %s/%s: %v", ns, name, err)
	}
	diskName, err := selectedDisk(pvc.Annotations, d.cfg.NodeID)
	if err != nil {
		return "", status.Errorf(status.Code(err), "PVC %s/%s: %s", ns, name, status.Convert(err).Message())
	}
	return diskName, nil
}

// selectedDisk reads the scheduler's disk choice from a PVC's annotations:
// "" when there is none that counts, InvalidArgument when the PVC is
// scheduled to another node. A disk name that is not well-formed is
// ResourceExhausted like an unknown disk: it cannot name a disk here, and
// that answer makes external-provisioner drop selected-node so the
// scheduler writes a fresh annotation.
func selectedDisk(annotations map[string]string, nodeID string) (string, error) {
	diskName := annotations[diskfit.SelectedDiskAnnotation]
	node := annotations[diskfit.SelectedNodeAnnotation]
	switch {
	case diskName == "":
		return "", nil
	case node == "":
		// Left over from before a reschedule, which removed selected-node:
		// the design says such an annotation no longer counts.
		return "", nil
	case node != nodeID:
		return "", status.Errorf(codes.InvalidArgument, "scheduled to node %s (disk %q), not to this node %s", node, diskName, nodeID)
	}
	if err := diskfit.ValidateDiskName(diskName); err != nil {
		return "", status.Errorf(codes.ResourceExhausted, "disk %q chosen for the volume does not exist on node %s: %v", diskName, nodeID, err)
	}
	return diskName, nil
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

// volumeOf resolves a volume ID to its disk and key; the disk must be
// available.
func (d *Driver) volumeOf(id string) (*disk, string, error) {
	diskName, key, err := parseID("volume", id)
	if err != nil {
		return nil, "", err
	}
	dk, err := d.availableDisk(diskName, "volume", id)
	return dk, key, err
}

// diskOf resolves a volume ID to its configured disk and key, whether or
// not the disk is available: unpublish and unstage work from the mount
// table, so that pods can stop while a disk is down.
func (d *Driver) diskOf(id string) (*disk, string, error) {
	diskName, key, err := parseID("volume", id)
	if err != nil {
		return nil, "", err
	}
	dk := d.disk(diskName)
	if dk == nil {
		return nil, "", status.Errorf(codes.NotFound, "volume %q does not exist: no disk %s", id, diskName)
	}
	return dk, key, nil
}

// availableDisk returns the named disk for a volume or snapshot ID on it:
// NotFound when no such disk is configured (no such ID can exist), and
// Unavailable when it is configured but its backend has not started. A
// disk that is down is never reported as "volume gone": DeleteVolume and
// DeleteSnapshot would then succeed, the PV or content would be deleted
// and the data left on the disk with nothing tracking it.
func (d *Driver) availableDisk(diskName, kind, id string) (*disk, error) {
	dk := d.disk(diskName)
	if dk == nil {
		return nil, status.Errorf(codes.NotFound, "%s %q does not exist: no disk %s", kind, id, diskName)
	}
	if err := dk.unavailable(); err != nil {
		return nil, status.Errorf(codes.Unavailable, "%s %q: disk %s on node %s is not available: %v", kind, id, diskName, d.cfg.NodeID, err)
	}
	return dk, nil
}

// DeleteVolume implements csi.ControllerServer; deleting a volume that does
// not exist succeeds.
func (d *Driver) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	dk, key, err := d.volumeOf(req.GetVolumeId())
	if status.Code(err) == codes.NotFound {
		return &csi.DeleteVolumeResponse{}, nil
	}
	if err != nil {
		return nil, err
	}
	defer d.locks.lock("volume/" + key)()
	if err := dk.backend.DeleteVolume(ctx, key); err != nil {
		return nil, toStatus(fmt.Errorf("deleting volume %s: %w", req.GetVolumeId(), err))
	}
	klog.FromContext(ctx).Info("Deleted volume", "volume", req.GetVolumeId())
	d.triggerStatus()
	return &csi.DeleteVolumeResponse{}, nil
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

// ListVolumes implements csi.ControllerServer. The token is the ID of the
// first volume of the next page, so volumes added or deleted between pages
// do not shift the pages.
func (d *Driver) ListVolumes(ctx context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	if err := d.checkList(req.GetMaxEntries(), req.GetStartingToken()); err != nil {
		return nil, err
	}
	var entries []*csi.ListVolumesResponse_Entry
	for _, dk := range d.disks() {
		if dk.health(ctx) != nil {
			continue
		}
		vols, err := dk.backend.ListVolumes(ctx)
		if err != nil {
			return nil, toStatus(fmt.Errorf("listing volumes of disk %s: %w", dk.name, err))
		}
		for i := range vols {
			entries = append(entries, &csi.ListVolumesResponse_Entry{Volume: d.csiVolume(dk, &vols[i], nil)})
		}
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Volume.VolumeId < entries[j].Volume.VolumeId })
	page, next := paginate(len(entries), func(i int) string { return entries[i].Volume.VolumeId }, req.GetStartingToken(), req.GetMaxEntries())
	return &csi.ListVolumesResponse{Entries: entries[page[0]:page[1]], NextToken: next}, nil
}

// checkList validates a list request's paging: a negative maximum is
// InvalidArgument, a token this driver cannot have issued Aborted.
func (d *Driver) checkList(maxEntries int32, token string) error {
	if maxEntries < 0 {
		return status.Errorf(codes.InvalidArgument, "max_entries %d is negative", maxEntries)
	}
	if token == "" {
		return nil
	}
	if _, _, err := parseID("token", token); err != nil {
		return status.Errorf(codes.Aborted, "invalid starting token %q", token)
	}
	return nil
}

// paginate returns the [from, to) range of a sorted list after token and
// the token of the next page.
func paginate(n int, id func(int) string, token string, maxEntries int32) ([2]int, string) {
	from := sort.Search(n, func(i int) bool { return id(i) >= token })
	to := n
	if maxEntries > 0 && from+int(maxEntries) < n {
		to = from + int(maxEntries)
	}
	next := ""
	if to < n {
		next = id(to)
	}
	return [2]int{from, to}, next
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

// ControllerListVolumeHealth implements csi.ControllerServer, paged like
// ListVolumes.
func (d *Driver) ControllerListVolumeHealth(ctx context.Context, req *csi.ControllerListVolumeHealthRequest) (*csi.ControllerListVolumeHealthResponse, error) {
	vols, err := d.ListVolumes(ctx, &csi.ListVolumesRequest{MaxEntries: req.GetMaxEntries(), StartingToken: req.GetStartingToken()})
	if err != nil {
		return nil, err
	}
	resp := &csi.ControllerListVolumeHealthResponse{NextToken: vols.GetNextToken()}
	for _, e := range vols.GetEntries() {
		dk, key, err := d.volumeOf(e.GetVolume().GetVolumeId())
		if err != nil {
			return nil, err
		}
		resp.Entries = append(resp.Entries, d.volumeHealth(ctx, dk, key))
	}
	return resp, nil
}

// GetCapacity implements csi.ControllerServer: available_capacity is the
// free space of all matching healthy disks in service together, maximum_volume_size
// the largest single disk's, because a volume cannot span disks.
func (d *Driver) GetCapacity(ctx context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	empty := &csi.GetCapacityResponse{MaximumVolumeSize: wrapperspb.Int64(0)}
	for _, c := range req.GetVolumeCapabilities() {
		if checkCapability(c) != nil {
			return empty, nil
		}
	}
	if seg := req.GetAccessibleTopology().GetSegments(); seg != nil {
		if v, ok := seg[diskfit.TopologyKey]; ok && v != d.cfg.NodeID {
			return empty, nil
		}
	}
	spec, err := d.spec(ctx)
	if err != nil {
		return nil, err
	}
	class := req.GetParameters()[diskfit.DeviceClassParameter]
	var total, largest int64
	for _, dk := range d.disks() {
		if out, _ := spec.DiskUnschedulable(dk.name); out || (class != "" && dk.class() != class) || dk.health(ctx) != nil {
			continue
		}
		u, err := dk.usage(ctx)
		if err != nil {
			klog.FromContext(ctx).Error(err, "Reading disk usage", "disk", dk.name)
			continue
		}
		total += u.FreeBytes
		largest = max(largest, u.FreeBytes)
	}
	return &csi.GetCapacityResponse{AvailableCapacity: total, MaximumVolumeSize: wrapperspb.Int64(largest)}, nil
}

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
	defer d.locks.lock("snapshot/" + key)()
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
	snap, err := dk.backend.CreateSnapshot(ctx, key, req.GetName(), srcKey)
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
	diskName, key, err := parseID("snapshot", req.GetSnapshotId())
	if status.Code(err) == codes.NotFound {
		return &csi.DeleteSnapshotResponse{}, nil
	}
	if err != nil {
		return nil, err
	}
	dk, err := d.availableDisk(diskName, "snapshot", req.GetSnapshotId())
	if status.Code(err) == codes.NotFound {
		return &csi.DeleteSnapshotResponse{}, nil
	}
	if err != nil {
		return nil, err
	}
	defer d.locks.lock("snapshot/" + key)()
	if err := dk.backend.DeleteSnapshot(ctx, key); err != nil {
		return nil, toStatus(fmt.Errorf("deleting snapshot %s: %w", req.GetSnapshotId(), err))
	}
	d.triggerStatus()
	return &csi.DeleteSnapshotResponse{}, nil
}

// ListSnapshots implements csi.ControllerServer, with the same paging as
// ListVolumes.
func (d *Driver) ListSnapshots(ctx context.Context, req *csi.ListSnapshotsRequest) (*csi.ListSnapshotsResponse, error) {
	if err := d.checkList(req.GetMaxEntries(), req.GetStartingToken()); err != nil {
		return nil, err
	}
	var entries []*csi.ListSnapshotsResponse_Entry
	for _, dk := range d.disks() {
		if dk.health(ctx) != nil {
			continue
		}
		snaps, err := dk.backend.ListSnapshots(ctx)
		if err != nil {
			return nil, toStatus(fmt.Errorf("listing snapshots of disk %s: %w", dk.name, err))
		}
		for i := range snaps {
			s := d.csiSnapshot(dk, &snaps[i])
			if (req.GetSnapshotId() != "" && s.SnapshotId != req.GetSnapshotId()) ||
				(req.GetSourceVolumeId() != "" && s.SourceVolumeId != req.GetSourceVolumeId()) {
				continue
			}
			entries = append(entries, &csi.ListSnapshotsResponse_Entry{Snapshot: s})
		}
	}
	sort.Slice(entries, func(i, j int) bool {
		return strings.Compare(entries[i].Snapshot.SnapshotId, entries[j].Snapshot.SnapshotId) < 0
	})
	page, next := paginate(len(entries), func(i int) string { return entries[i].Snapshot.SnapshotId }, req.GetStartingToken(), req.GetMaxEntries())
	return &csi.ListSnapshotsResponse{Entries: entries[page[0]:page[1]], NextToken: next}, nil
}
