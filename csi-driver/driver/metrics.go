package driver

import (
	"k8s.io/component-base/metrics"

	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
)

// Orphan kinds, the values of diskfit_orphans_removed_total's kind label.
const (
	orphanVolume   = "volume"
	orphanSnapshot = "snapshot"
)

// diskMetrics are the driver's own metrics, served on /metrics from the
// registry that also holds csi-lib-utils' csi_plugin_operations_seconds.
// Dashboards use these names; they must not change.
type diskMetrics struct {
	capacity       *metrics.GaugeVec
	free           *metrics.GaugeVec
	volumes        *metrics.GaugeVec
	healthy        *metrics.GaugeVec
	orphansRemoved *metrics.CounterVec
}

func newDiskMetrics(reg metrics.KubeRegistry) *diskMetrics {
	labels := []string{"node", "disk", "device_class"}
	gauge := func(name, help string) *metrics.GaugeVec {
		return metrics.NewGaugeVec(&metrics.GaugeOpts{Namespace: "diskfit", Subsystem: "disk", Name: name, Help: help, StabilityLevel: metrics.ALPHA}, labels)
	}
	m := &diskMetrics{
		capacity: gauge("capacity_bytes", "Bytes the disk offers volumes: its free bytes plus the bytes of its volumes, as in the DiskNode status."),
		free:     gauge("free_bytes", "Free bytes of the disk less its reserve, as in the DiskNode status."),
		volumes:  gauge("volumes", "Volumes on the disk."),
		healthy:  gauge("healthy", "1 when the disk can take new volumes, 0 when it is unhealthy (see the DiskNode message)."),
		orphansRemoved: metrics.NewCounterVec(&metrics.CounterOpts{Namespace: "diskfit", Name: "orphans_removed_total",
			Help: "Volumes and snapshots removed because no PersistentVolume or VolumeSnapshotContent referred to them for the grace period.", StabilityLevel: metrics.ALPHA},
			[]string{"kind"}),
	}
	reg.MustRegister(m.capacity, m.free, m.volumes, m.healthy, m.orphansRemoved)
	// Both series exist from the start, so a dashboard's rate() sees the
	// first removal.
	m.orphansRemoved.WithLabelValues(orphanVolume).Add(0)
	m.orphansRemoved.WithLabelValues(orphanSnapshot).Add(0)
	return m
}

// observe sets the gauges from a freshly observed DiskNode status.
func (m *diskMetrics) observe(node string, st *v1alpha1.DiskNodeStatus) {
	for _, dk := range st.Disks {
		healthy := 0.0
		if dk.Healthy {
			healthy = 1
		}
		m.capacity.WithLabelValues(node, dk.Name, dk.DeviceClass).Set(float64(dk.CapacityBytes))
		m.free.WithLabelValues(node, dk.Name, dk.DeviceClass).Set(float64(dk.FreeBytes))
		m.volumes.WithLabelValues(node, dk.Name, dk.DeviceClass).Set(float64(dk.VolumeCount))
		m.healthy.WithLabelValues(node, dk.Name, dk.DeviceClass).Set(healthy)
	}
}
