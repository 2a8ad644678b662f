package driver

import (
	"context"
	"errors"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
)

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
	diskName, err := selectedDisk(pvc, d.cfg.NodeID)
	if err != nil {
		return "", status.Errorf(status.Code(err), "PVC %s/%s: %s", ns, name, status.Convert(err).Message())
	}
	return diskName, nil
}

// selectedDisk reads the scheduler's disk choice from a PVC
// (diskfit.SelectedLocation): "" when there is none that counts,
// InvalidArgument when the PVC is scheduled to another node. A disk name
// that is not well-formed is ResourceExhausted like an unknown disk: it
// cannot name a disk here, and that answer makes external-provisioner drop
// selected-node so the scheduler writes a fresh annotation.
func selectedDisk(pvc *corev1.PersistentVolumeClaim, nodeID string) (string, error) {
	loc, ok := diskfit.SelectedLocation(pvc)
	switch {
	case !ok:
		return "", nil
	case loc.Node != nodeID:
		return "", status.Errorf(codes.InvalidArgument, "scheduled to node %s (disk %q), not to this node %s", loc.Node, loc.Disk, nodeID)
	}
	if err := diskfit.ValidateDiskName(loc.Disk); err != nil {
		return "", status.Errorf(codes.ResourceExhausted, "disk %q chosen for the volume does not exist on node %s: %v", loc.Disk, nodeID, err)
	}
	return loc.Disk, nil
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
