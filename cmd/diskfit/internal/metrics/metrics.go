// Package metrics lists the Prometheus metrics that diskfit's components
// export and that its dashboard (manifests/observability) and docs use. A
// test checks every expression of the dashboard against this list, so a
// metric renamed here without the dashboard following, or used there
// without being listed, fails the build.
package metrics

// Component is the process that exports a metric.
type Component string

const (
	// Scheduler is diskfit-scheduler, on its secure port 10259.
	Scheduler Component = "diskfit-scheduler"
	// Driver is diskfit-csi, on each node's port 9809 (--metrics-address).
	Driver Component = "diskfit-csi"
)

// Type is a Prometheus metric type.
type Type string

// The metric types diskfit's metrics have.
const (
	Counter   Type = "counter"
	Gauge     Type = "gauge"
	Histogram Type = "histogram"
)

// Metric is one documented metric.
type Metric struct {
	// Name is the metric's name; a histogram's series add _bucket (with
	// the label le), _sum and _count.
	Name string
	// Type is counter, gauge or histogram.
	Type Type
	// Labels are the metric's own labels, without the ones Prometheus adds
	// when it scrapes (job, instance, pod, ...).
	Labels []string
	// Component exports the metric.
	Component Component
	// Origin is where the metric is defined: diskfit's code, or the
	// library or Kubernetes component that provides it.
	Origin string
	// Help says what the metric counts.
	Help string
}

// Documented is every metric the dashboard and the docs may name.
var Documented = []Metric{
	{
		Name: "diskfit_disk_capacity_bytes", Type: Gauge, Labels: []string{"node", "disk", "device_class"},
		Component: Driver, Origin: "csi-driver",
		Help: "Usable size of a disk, headroom excluded.",
	},
	{
		Name: "diskfit_disk_free_bytes", Type: Gauge, Labels: []string{"node", "disk", "device_class"},
		Component: Driver, Origin: "csi-driver",
		Help: "Free space a disk's backend reports for new volumes.",
	},
	{
		Name: "diskfit_disk_volumes", Type: Gauge, Labels: []string{"node", "disk", "device_class"},
		Component: Driver, Origin: "csi-driver",
		Help: "Volumes on a disk.",
	},
	{
		Name: "diskfit_disk_healthy", Type: Gauge, Labels: []string{"node", "disk", "device_class"},
		Component: Driver, Origin: "csi-driver",
		Help: "1 when a disk takes new volumes, 0 when not.",
	},
	{
		Name: "diskfit_orphans_removed_total", Type: Counter, Labels: []string{"kind"},
		Component: Driver, Origin: "csi-driver",
		Help: "Leftovers the driver found and removed, by kind.",
	},
	{
		Name: "csi_plugin_operations_seconds", Type: Histogram, Labels: []string{"driver_name", "method_name", "grpc_status_code"},
		Component: Driver, Origin: "github.com/kubernetes-csi/csi-lib-utils/metrics",
		Help: "Duration of every CSI call the driver serves, by method and gRPC code.",
	},
	{
		Name: "diskfit_filter_rejections_total", Type: Counter, Labels: []string{"reason"},
		Component: Scheduler, Origin: "scheduler-plugin/diskfit",
		Help: "Nodes rejected by DiskFit's Filter, by reason: no_disknode, stale_disknode, insufficient_space.",
	},
	{
		Name: "diskfit_reservations_held", Type: Gauge,
		Component: Scheduler, Origin: "scheduler-plugin/diskfit",
		Help: "Pods whose disk reservations are held in memory, not yet visible on PVCs or PVs.",
	},
	{
		Name: "diskfit_ledger_node_rebuilds_total", Type: Counter,
		Component: Scheduler, Origin: "scheduler-plugin/diskfit",
		Help: "Times a node's disk table in the ledger was rebuilt from its DiskNode.",
	},
	{
		Name: "scheduler_schedule_attempts_total", Type: Counter, Labels: []string{"result", "profile"},
		Component: Scheduler, Origin: "k8s.io/kubernetes/pkg/scheduler/metrics",
		Help: "Scheduling attempts by result (scheduled, unschedulable, error) and profile.",
	},
	{
		Name: "scheduler_scheduling_attempt_duration_seconds", Type: Histogram, Labels: []string{"result", "profile"},
		Component: Scheduler, Origin: "k8s.io/kubernetes/pkg/scheduler/metrics",
		Help: "Duration of a scheduling attempt (algorithm and binding) by result and profile.",
	},
}
