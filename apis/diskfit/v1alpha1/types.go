package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Backend says how a disk stores volumes.
// +kubebuilder:validation:Enum=file;lvm
type Backend string

const (
	// BackendFile keeps each volume as a preallocated file on the disk's
	// mounted filesystem, attached to a loop device.
	BackendFile Backend = "file"
	// BackendLVM keeps each volume as a logical volume in the disk's volume group.
	BackendLVM Backend = "lvm"
)

// DiskNode is the disk inventory of one node, published by the diskfit CSI
// driver on that node. Its name is the node's name and it is owned by the
// Node, so it goes away with the Node.
//
// +genclient
// +genclient:nonNamespaced
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=dn
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Disks",type=integer,JSONPath=`.status.diskCount`
// +kubebuilder:printcolumn:name="Healthy",type=integer,JSONPath=`.status.healthyDisks`
// +kubebuilder:printcolumn:name="Unschedulable",type=integer,JSONPath=`.status.unschedulableDisks`
// +kubebuilder:printcolumn:name="Total",type=string,JSONPath=`.status.capacity`
// +kubebuilder:printcolumn:name="Free",type=string,JSONPath=`.status.free`
// +kubebuilder:printcolumn:name="Observed",type=date,JSONPath=`.status.observedTime`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type DiskNode struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is what an admin asks of the node's disks. The driver never
	// writes it; it reads it before placing a volume.
	// +optional
	Spec DiskNodeSpec `json:"spec,omitempty"`

	// Status is what the node's driver last observed.
	// +optional
	Status DiskNodeStatus `json:"status,omitempty"`
}

// DiskNodeSpec takes disks out of service for new volumes, the way
// `kubectl cordon` does for a node's pods: volumes already on them stay and
// keep working, no new volume is placed there (DiskFit's Filter skips
// them, the driver refuses them with ResourceExhausted so the scheduler
// chooses again). `diskfit drain` sets it.
type DiskNodeSpec struct {
	// Unschedulable takes every disk of the node out of service.
	// +optional
	Unschedulable bool `json:"unschedulable,omitempty"`

	// Reason says why the node's disks are out of service, for people.
	// +kubebuilder:validation:MaxLength=256
	// +optional
	Reason string `json:"reason,omitempty"`

	// Disks takes single disks out of service, keyed by name. A disk the
	// node does not have is ignored.
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=64
	// +optional
	Disks []DiskSpec `json:"disks,omitempty"`
}

// DiskSpec is what an admin asks of one disk.
type DiskSpec struct {
	// Name is the disk's name, as in the status.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([a-z0-9._-]*[a-z0-9])?$`
	Name string `json:"name"`

	// Unschedulable takes the disk out of service for new volumes.
	// +optional
	Unschedulable bool `json:"unschedulable,omitempty"`

	// Reason says why, for people.
	// +kubebuilder:validation:MaxLength=256
	// +optional
	Reason string `json:"reason,omitempty"`
}

// DiskNodeStatus is the observed state of a node's disks.
type DiskNodeStatus struct {
	// Disks has one entry per configured disk, keyed by name.
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=64
	// +optional
	Disks []DiskStatus `json:"disks,omitempty"`

	// ObservedTime is when the driver last refreshed this status. The
	// scheduler rejects nodes whose status is older than its configured
	// maximum age.
	// +optional
	ObservedTime metav1.Time `json:"observedTime,omitempty"`

	// Capacity is the sum of the healthy disks' capacities in whole MiB, for
	// display only: volumes cannot span disks, so the scheduler never uses it.
	// +optional
	Capacity resource.Quantity `json:"capacity,omitempty"`

	// Free is the sum of the healthy disks' free space in whole MiB, for
	// display only.
	// +optional
	Free resource.Quantity `json:"free,omitempty"`

	// DiskCount is the number of disks, healthy or not.
	// +kubebuilder:validation:Minimum=0
	// +optional
	DiskCount int32 `json:"diskCount,omitempty"`

	// HealthyDisks counts the disks that work.
	// +kubebuilder:validation:Minimum=0
	// +optional
	HealthyDisks int32 `json:"healthyDisks,omitempty"`

	// UnschedulableDisks counts the disks the spec took out of service
	// when the driver last refreshed this status, for display only: the
	// scheduler and the driver read the spec itself.
	// +kubebuilder:validation:Minimum=0
	// +optional
	UnschedulableDisks int32 `json:"unschedulableDisks,omitempty"`
}

// DiskStatus is the observed state of one disk.
// +kubebuilder:validation:XValidation:rule="self.freeBytes <= self.capacityBytes",message="freeBytes must not exceed capacityBytes"
type DiskStatus struct {
	// Name identifies the disk on its node; PVC annotations and PV volume
	// contexts refer to it.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([a-z0-9._-]*[a-z0-9])?$`
	Name string `json:"name"`

	// Backend is how the disk stores volumes.
	Backend Backend `json:"backend"`

	// DeviceClass groups disks of one kind (nvme, ssd, hdd); StorageClasses
	// select it with the diskfit.io/device-class parameter.
	// +kubebuilder:validation:MaxLength=63
	// +optional
	DeviceClass string `json:"deviceClass,omitempty"`

	// CapacityBytes is what the disk offers volumes: free space plus the
	// space its volumes with a PV take, headroom excluded (a volume kept
	// without a PV is not room anyone can have). Space the filesystem keeps
	// for itself, or that something other than a volume holds, is not part
	// of it, so CapacityBytes minus the volumes is what is free.
	// +kubebuilder:validation:Minimum=0
	CapacityBytes int64 `json:"capacityBytes"`

	// FreeBytes is what the backend really reports free, headroom excluded.
	// +kubebuilder:validation:Minimum=0
	FreeBytes int64 `json:"freeBytes"`

	// VolumeCount is the number of volumes on the disk.
	// +kubebuilder:validation:Minimum=0
	// +optional
	VolumeCount int32 `json:"volumeCount,omitempty"`

	// VolumesWithoutPV counts the disk's volumes that no PersistentVolume
	// refers to: their PV was deleted with reclaim policy Retain, or lost
	// (a control plane restored from an older backup), or, for a moment,
	// is still being made. The driver never removes a volume that once had
	// a PV: it keeps its data until an admin re-creates a PV for it or
	// reclaims it (diskfit reclaim). A volume that never had one (its
	// claim went away while it was provisioned) is counted until the driver
	// removes it after the orphan grace period.
	// +kubebuilder:validation:Minimum=0
	// +optional
	VolumesWithoutPV int32 `json:"volumesWithoutPV,omitempty"`

	// BytesWithoutPV is the size of those volumes together.
	// +kubebuilder:validation:Minimum=0
	// +optional
	BytesWithoutPV int64 `json:"bytesWithoutPV,omitempty"`

	// WithoutPV lists those volumes, the longest without a PV first, at
	// most MaxWithoutPV of them.
	// +kubebuilder:validation:MaxItems=32
	// +listType=atomic
	// +optional
	WithoutPV []VolumeWithoutPV `json:"withoutPV,omitempty"`

	// Healthy is false when the disk cannot take new volumes; Message says why.
	Healthy bool `json:"healthy"`

	// Message explains the disk's health in words.
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Message string `json:"message,omitempty"`

	// Reason says, for an unhealthy disk, why in one word when it is not
	// a failure of the disk: NotConfigured is a disk this node's
	// PersistentVolumes are on that the node config does not name (an
	// admin's change); AtAnotherPath is a disk whose filesystem is
	// mounted at another disk's path of this node (mounts mixed up, the
	// data intact); Unsupported is a disk the node cannot serve safely
	// (its kernel would give volumes' space back to the disk), its data
	// intact; ServedByAnotherProcess is a disk another process on the node
	// serves (a driver pod still terminating), which answers reads;
	// DuplicateVolumeGroup is an lvm disk whose volume group lvm2 finds
	// more than once under its name (a disk moved from another node).
	// diskfit-controller releases no claim of a disk with a reason. Empty
	// otherwise.
	// +kubebuilder:validation:MaxLength=63
	// +optional
	Reason DiskReason `json:"reason,omitempty"`
}

// DiskReason is why a disk is unhealthy, when it is not a failure.
type DiskReason string

const (
	// DiskNotConfigured is a disk this node's PersistentVolumes are on
	// that the node config, which discovers no disks, does not name, or
	// that discovery found mounted but did not take (its device class
	// file is not one word).
	DiskNotConfigured DiskReason = "NotConfigured"
	// DiskAtAnotherPath is a disk whose state directory the driver found
	// at another disk's path of this node: its filesystem is mounted
	// there (say by device names a boot handed out in another order), so
	// its data is intact though the disk cannot be served at its own path.
	DiskAtAnotherPath DiskReason = "AtAnotherPath"
	// DiskUnsupported is a disk the driver refuses to serve on this node
	// although nothing is wrong with it or its data: a file disk on a
	// kernel whose loop devices give a volume's space back to the disk on
	// discard (before Linux 5.19).
	DiskUnsupported DiskReason = "Unsupported"
	// DiskServedByAnotherProcess is a disk that another process on the
	// node serves, holding its lock (a driver pod force-deleted or still
	// terminating while its replacement starts, or a second installation):
	// this driver serves it once that process is gone. Its filesystem or
	// volume group answers reads; one that does not is a failure.
	DiskServedByAnotherProcess DiskReason = "ServedByAnotherProcess"
	// DiskDuplicateVolumeGroup is an lvm disk whose volume group lvm2
	// finds more than once under its name and so refuses: another device
	// carries a group of that name (a disk moved from another node, or a
	// block volume of another driver written to), the group's own device
	// not lost.
	DiskDuplicateVolumeGroup DiskReason = "DuplicateVolumeGroup"
)

// MaxWithoutPV is how many volumes without a PV a DiskStatus lists.
const MaxWithoutPV = 32

// VolumeWithoutPV is a volume on a disk that no PersistentVolume refers to.
type VolumeWithoutPV struct {
	// VolumeHandle is the volume's CSI volume handle, what a PV's
	// spec.csi.volumeHandle names.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	VolumeHandle string `json:"volumeHandle"`

	// SizeBytes is the volume's size.
	// +kubebuilder:validation:Minimum=0
	SizeBytes int64 `json:"sizeBytes"`

	// Claim is the namespace/name of the claim the volume was made for.
	// +kubebuilder:validation:MaxLength=320
	// +optional
	Claim string `json:"claim,omitempty"`

	// Since is when the driver first found no PV for it.
	Since metav1.Time `json:"since"`

	// NeverHadPV is true when no PV was ever seen for the volume: the
	// driver removes it once it has been without one for the orphan grace
	// period, unless the claim it was made for still waits for it.
	// Otherwise the driver keeps it until it is reclaimed.
	// +optional
	NeverHadPV bool `json:"neverHadPV,omitempty"`
}

// DiskNodeList is a list of DiskNodes.
// +kubebuilder:object:root=true
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type DiskNodeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`

	// Items are the DiskNodes.
	Items []DiskNode `json:"items"`
}
