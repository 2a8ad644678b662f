// Package diskfit holds the names that the DiskFit scheduler plugin and the
// diskfit CSI driver share. Change one only everywhere at once.
package diskfit

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

	// FSTypeKey is the StorageClass parameter for the filesystem type.
	FSTypeKey = "csi.storage.k8s.io/fstype"
)
