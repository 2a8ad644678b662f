package diskfit

import (
	"sync"

	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
)

const metricsSubsystem = "diskfit"

// Filter rejection reasons, the values of the "reason" label.
const (
	reasonNoDiskNode    = "no_disknode"
	reasonStaleDiskNode = "stale_disknode"
	reasonNoSpace       = "insufficient_space"
)

// Metrics are process-wide, like all scheduler metrics: two profiles
// running DiskFit add to the same series.
var (
	filterRejections = metrics.NewCounterVec(&metrics.CounterOpts{
		Subsystem:      metricsSubsystem,
		Name:           "filter_rejections_total",
		Help:           "Nodes rejected by DiskFit's Filter, by reason.",
		StabilityLevel: metrics.ALPHA,
	}, []string{"reason"})

	reservationsHeld = metrics.NewGauge(&metrics.GaugeOpts{
		Subsystem:      metricsSubsystem,
		Name:           "reservations_held",
		Help:           "Pods whose disk reservations are held in memory, not yet visible on PVCs or PVs.",
		StabilityLevel: metrics.ALPHA,
	})

	ledgerRebuilds = metrics.NewCounter(&metrics.CounterOpts{
		Subsystem:      metricsSubsystem,
		Name:           "ledger_node_rebuilds_total",
		Help:           "Times a node's disk table in the ledger was rebuilt from its DiskNode.",
		StabilityLevel: metrics.ALPHA,
	})

	registerMetricsOnce sync.Once
)

// registerMetrics registers the metrics once per process; every plugin
// instance calls it.
func registerMetrics() {
	registerMetricsOnce.Do(func() {
		legacyregistry.MustRegister(filterRejections, reservationsHeld, ledgerRebuilds)
	})
}
