// Package diskfit holds the names that the DiskFit scheduler plugin and the
// diskfit CSI driver share. Change one only everywhere at once.
package diskfit

import "math"

const (
	// GroupName is the API group of diskfit's own objects (DiskNode).
	GroupName = "diskfit.io"

	// DriverName is the CSI driver name, also the StorageClass provisioner.
	DriverName = "local.diskfit.io"

	// TopologyKey is the node topology key the driver reports in
	// NodeGetInfo and in every volume's accessible topology.
	TopologyKey = "topology.diskfit.io/node"

	// SelectedDiskAnnotation on a PVC names the disk the scheduler chose.
	// It is written in the same update that sets SelectedNodeAnnotation.
	SelectedDiskAnnotation = "diskfit.io/selected-disk"

	// ReleaseOnNodeDeletionAnnotation on a PVC (value "true") lets
	// diskfit-controller delete the claim when the Node its volume lives on
	// is deleted and stays deleted for --node-loss-grace (two minutes), so
	// that a StatefulSet recreates it and its pod elsewhere. A claim that
	// asks to be released on disk loss (OnDiskLossAnnotation) is released
	// on node loss too: a deleted node's disks are all lost.
	// The data is lost with the node; without the annotation the claim
	// stays and its pod waits for the node.
	ReleaseOnNodeDeletionAnnotation = "diskfit.io/release-on-node-deletion"

	// OnDiskLossAnnotation on a PVC, or the same key as a StorageClass
	// parameter for all of the class's claims, says what becomes of a
	// claim whose disk is lost: the disk stayed unhealthy for
	// diskfit-controller's --disk-failure-grace, or its node was deleted.
	// OnDiskLossRelease deletes the claim and its pod, so that a
	// StatefulSet recreates both and the new volume lands on a working
	// disk; the old volume's PV is kept with reclaim policy Retain, so
	// whatever the disk still holds is deleted only by an admin.
	// OnDiskLossKeep, the default, leaves the claim waiting for its disk.
	// A PVC's annotation overrides its class's parameter.
	OnDiskLossAnnotation = "diskfit.io/on-disk-loss"
	OnDiskLossRelease    = "release"
	OnDiskLossKeep       = "keep"

	// ReleasesAnnotation on a PV lists, comma-separated, the releases of
	// its claim (diskfit-controller's, `diskfit drain --release`'s) that
	// made the PV Retain and have not backed out: those under way, those
	// that deleted the claim, and those cut short.
	// ReclaimPolicyBeforeReleaseAnnotation keeps the reclaim policy the PV
	// had before the first of them. A release whose claim stays (changed
	// since it was read) takes itself off the list, and puts that policy
	// back only when it was the last: another release of the claim, which
	// may be deleting it now, is never undone. The list counts only while
	// the PV is Retain: an admin who sets the named policy back (once no
	// release runs) voids it.
	ReleasesAnnotation                   = "diskfit.io/releases"
	ReclaimPolicyBeforeReleaseAnnotation = "diskfit.io/reclaim-policy-before-release"

	// DeviceClassParameter is the optional StorageClass parameter that
	// restricts a volume to disks of one deviceClass.
	DeviceClassParameter = "diskfit.io/device-class"

	// VolumeContextDiskKey is the volume context key on PVs naming the disk
	// that holds the volume.
	VolumeContextDiskKey = "diskfit.io/disk"

	// SchedulerName is the scheduler profile name used in examples and
	// manifests; pods select it with spec.schedulerName.
	SchedulerName = "diskfit-scheduler"

	// PluginName is the name of the scheduler plugin.
	PluginName = "DiskFit"
)

// Well-known Kubernetes keys that both halves read.
const (
	// SelectedNodeAnnotation is set on a WaitForFirstConsumer PVC by the
	// scheduler and removed by external-provisioner to ask for a reschedule.
	SelectedNodeAnnotation = "volume.kubernetes.io/selected-node"

	// PVCNameKey, PVCNamespaceKey and PVNameKey are the CreateVolume
	// parameters external-provisioner adds with --extra-create-metadata.
	PVCNameKey      = "csi.storage.k8s.io/pvc/name"
	PVCNamespaceKey = "csi.storage.k8s.io/pvc/namespace"
	PVNameKey       = "csi.storage.k8s.io/pv/name"
	// SnapshotContentNameKey is the CreateSnapshot parameter
	// csi-snapshotter adds with --extra-create-metadata: the name of the
	// VolumeSnapshotContent, snapcontent-<VolumeSnapshot UID>.
	SnapshotContentNameKey = "csi.storage.k8s.io/volumesnapshotcontent/name"

	// FSTypeKey is the StorageClass parameter for the filesystem type.
	FSTypeKey = "csi.storage.k8s.io/fstype"
)

// Volume sizes. The driver allocates exactly VolumeBytes for a request and
// the scheduler books exactly VolumeBytes for a claim, so the two never
// disagree about how much of a disk a volume takes.
const (
	// VolumeAlignmentBytes is the granularity of volume sizes.
	VolumeAlignmentBytes = 1 << 20
	// MinFilesystemVolumeBytes is the smallest Filesystem volume: mkfs.xfs
	// refuses smaller filesystems, and one floor for every filesystem keeps
	// the scheduler's arithmetic independent of the filesystem type.
	MinFilesystemVolumeBytes = 300 << 20
	// MinBlockVolumeBytes is the smallest Block volume.
	MinBlockVolumeBytes = VolumeAlignmentBytes
)

// VolumeBytes is the space a volume takes on its disk when requested bytes
// are asked for: rounded up to VolumeAlignmentBytes and at least the minimum
// for its volume mode. A request too large to round up gives MaxInt64,
// which no disk holds, rather than a wrapped-around small size.
func VolumeBytes(requested int64, block bool) int64 {
	floor := int64(MinFilesystemVolumeBytes)
	if block {
		floor = MinBlockVolumeBytes
	}
	if requested > math.MaxInt64-(VolumeAlignmentBytes-1) {
		return math.MaxInt64
	}
	aligned := (requested + VolumeAlignmentBytes - 1) / VolumeAlignmentBytes * VolumeAlignmentBytes
	return max(aligned, floor)
}
