package v1alpha1

import (
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
)

// Disk returns the status of the named disk, or nil.
func (s *DiskNodeStatus) Disk(name string) *DiskStatus {
	for i := range s.Disks {
		if s.Disks[i].Name == name {
			return &s.Disks[i]
		}
	}
	return nil
}

// Summarize fills the display-only totals (Capacity, Free, DiskCount,
// HealthyDisks) from Disks. Unhealthy disks are left out of the byte totals
// because no volume can be placed on them; the totals are rounded down to
// MiB so that `kubectl get disknodes` prints them readably.
func (s *DiskNodeStatus) Summarize() {
	var capacity, free int64
	var healthy int32
	for _, d := range s.Disks {
		if !d.Healthy {
			continue
		}
		healthy++
		capacity += d.CapacityBytes
		free += d.FreeBytes
	}
	const mib = 1 << 20
	s.Capacity = *resource.NewQuantity(capacity/mib*mib, resource.BinarySI)
	s.Free = *resource.NewQuantity(free/mib*mib, resource.BinarySI)
	s.DiskCount = int32(len(s.Disks))
	s.HealthyDisks = healthy
}

// Stale reports whether the status was observed more than maxAge before now.
// A status that was never observed is stale; maxAge <= 0 disables the check.
func (s *DiskNodeStatus) Stale(now time.Time, maxAge time.Duration) bool {
	if maxAge <= 0 {
		return false
	}
	if s.ObservedTime.IsZero() {
		return true
	}
	return now.Sub(s.ObservedTime.Time) > maxAge
}

// Usable reports whether new volumes may be placed on the disk: it is
// healthy and, when deviceClass is set, of that class.
func (d *DiskStatus) Usable(deviceClass string) bool {
	return d.Healthy && (deviceClass == "" || d.DeviceClass == deviceClass)
}

// Failed reports whether the disk counts as failed: it is unhealthy and
// no Reason says that this is no failure of the disk (any Reason, also
// one a newer driver sets). diskfit-controller releases claims only of
// failed disks.
func (d *DiskStatus) Failed() bool {
	return !d.Healthy && d.Reason == ""
}

// DiskUnschedulable reports whether the spec takes the named disk out of
// service for new volumes, and the admin's reason.
func (s *DiskNodeSpec) DiskUnschedulable(name string) (bool, string) {
	for _, d := range s.Disks {
		if d.Name == name && d.Unschedulable {
			return true, d.Reason
		}
	}
	if s.Unschedulable {
		return true, s.Reason
	}
	return false, ""
}

// CountUnschedulable sets UnschedulableDisks: how many of the status's
// disks spec takes out of service.
func (s *DiskNodeStatus) CountUnschedulable(spec *DiskNodeSpec) {
	s.UnschedulableDisks = 0
	for _, d := range s.Disks {
		if out, _ := spec.DiskUnschedulable(d.Name); out {
			s.UnschedulableDisks++
		}
	}
}
