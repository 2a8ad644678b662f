package driver

import (
	"sync"

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

	// mu guards seen: the label values set by the last observe, so that
	// the series of a disk no longer served, or of a device class it no
	// longer has, are dropped.
	mu   sync.Mutex
	seen map[[3]string]bool
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
	m.mu.Lock()
	defer m.mu.Unlock()
	seen := map[[3]string]bool{}
	for _, dk := range st.Disks {
		seen[[3]string{node, dk.Name, dk.DeviceClass}] = true
		healthy := 0.0
		if dk.Healthy {
			healthy = 1
		}
		m.capacity.WithLabelValues(node, dk.Name, dk.DeviceClass).Set(float64(dk.CapacityBytes))
		m.free.WithLabelValues(node, dk.Name, dk.DeviceClass).Set(float64(dk.FreeBytes))
		m.volumes.WithLabelValues(node, dk.Name, dk.DeviceClass).Set(float64(dk.VolumeCount))
		m.healthy.WithLabelValues(node, dk.Name, dk.DeviceClass).Set(healthy)
	}
	for l := range m.seen {
		if !seen[l] {
			for _, g := range []*metrics.GaugeVec{m.capacity, m.free, m.volumes, m.healthy} {
				g.DeleteLabelValues(l[:]...)
			}
		}
	}
	m.seen = seen
}
