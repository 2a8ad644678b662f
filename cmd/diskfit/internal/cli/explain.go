package cli

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/scheduler-plugin/packing"
)

type explainOptions struct {
	now func() time.Time
}

func newExplainCommand(streams genericiooptions.IOStreams, d deps) *cobra.Command {
	o := &explainOptions{now: d.now}
	return &cobra.Command{
		Use:   "explain POD",
		Short: "Say why a pod is Pending, disk by disk",
		Long: "explain prints a pod's claims with the node and disk chosen for each, " +
			"and, from the pod's latest FailedScheduling event, the reason each node " +
			"was rejected (for diskfit-scheduler: which disk is short and by how much).",
		Example: "  diskfit explain web-0 -n shop",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := d.clients()
			if err != nil {
				return err
			}
			return o.run(cmd.Context(), c, args[0], streams.Out)
		},
	}
}

// claimRow is one of the pod's claims as explain prints it.
type claimRow struct {
	name, class, size, phase, node, disk string
}

func (o *explainOptions) run(ctx context.Context, c *Clients, name string, out io.Writer) error {
	ns := cmp.Or(c.Namespace, metav1.NamespaceDefault)
	pod, err := c.Kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reading pod %s/%s: %w", ns, name, err)
	}

	state := string(pod.Status.Phase)
	if pod.Spec.NodeName != "" {
		state += " on node " + pod.Spec.NodeName
	}
	fmt.Fprintf(out, "Pod %s/%s: %s, scheduler %s\n", ns, name, state, cmp.Or(pod.Spec.SchedulerName, corev1.DefaultSchedulerName))
	if pod.Spec.SchedulerName != diskfit.SchedulerName {
		fmt.Fprintf(out, "  (not %s: its claims are placed per node, not per disk)\n", diskfit.SchedulerName)
	}

	rows, err := o.claims(ctx, c, pod)
	if err != nil {
		return err
	}
	if len(rows) > 0 {
		fmt.Fprintln(out, "\nClaims:")
		w := tabwriter.NewWriter(out, 0, 8, 2, ' ', 0)
		fmt.Fprintln(w, "  CLAIM\tCLASS\tSIZE\tPHASE\tNODE\tDISK")
		for _, r := range rows {
			fmt.Fprintf(w, "  %s\t%s\t%s\t%s\t%s\t%s\n", r.name, r.class, r.size, r.phase, r.node, r.disk)
		}
		if err := w.Flush(); err != nil {
			return err
		}
	}

	if pod.Spec.NodeName != "" {
		return nil
	}
	ev, err := latestFailedScheduling(ctx, c, pod)
	if err != nil {
		return err
	}
	if ev == nil {
		_, err := fmt.Fprintln(out, "\nNo FailedScheduling event: the pod has not been tried yet, or its events expired.")
		return err
	}
	count := ev.Count
	if ev.Series != nil {
		// kube-scheduler writes events.k8s.io events: repeats are counted
		// in the series.
		count = ev.Series.Count
	}
	fmt.Fprintf(out, "\nWhy no node fits (FailedScheduling %s ago, %d time(s)):\n",
		duration.HumanDuration(o.now().Sub(eventTime(ev))), max(count, 1))
	reasons := ParseSchedulingMessage(ev.Message)
	if len(reasons) == 0 {
		_, err := fmt.Fprintf(out, "  %s\n", ev.Message)
		return err
	}
	w := tabwriter.NewWriter(out, 0, 8, 2, ' ', 0)
	fmt.Fprintln(w, "  NODE\tREASON")
	for _, r := range reasons {
		node := r.Node
		if node == "" {
			node = fmt.Sprintf("(%d nodes)", r.Count)
			if r.Count == 1 {
				node = "(1 node)"
			}
		}
		fmt.Fprintf(w, "  %s\t%s\n", node, r.Reason)
	}
	return w.Flush()
}

// claims reads the pod's PVCs and their PVs.
func (o *explainOptions) claims(ctx context.Context, c *Clients, pod *corev1.Pod) ([]claimRow, error) {
	var rows []claimRow
	for _, v := range pod.Spec.Volumes {
		claimName := ""
		switch {
		case v.PersistentVolumeClaim != nil:
			claimName = v.PersistentVolumeClaim.ClaimName
		case v.Ephemeral != nil:
			claimName = pod.Name + "-" + v.Name
		default:
			continue
		}
		r := claimRow{name: claimName, class: "-", size: "-", phase: "-", node: "-", disk: "-"}
		pvc, err := c.Kube.CoreV1().PersistentVolumeClaims(pod.Namespace).Get(ctx, claimName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			r.phase = "missing"
			rows = append(rows, r)
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading PVC %s/%s: %w", pod.Namespace, claimName, err)
		}
		r.class = cmp.Or(diskfit.ClaimClass(pvc, ""), "-")
		if q, ok := pvc.Spec.Resources.Requests[corev1.ResourceStorage]; ok {
			r.size = packing.FormatBytes(q.Value())
		}
		r.phase = string(pvc.Status.Phase)
		r.node = cmp.Or(pvc.Annotations[diskfit.SelectedNodeAnnotation], "-")
		r.disk = cmp.Or(pvc.Annotations[diskfit.SelectedDiskAnnotation], "-")
		if pvc.Spec.VolumeName != "" {
			pv, err := c.Kube.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
			if err != nil && !apierrors.IsNotFound(err) {
				return nil, fmt.Errorf("reading PV %s: %w", pvc.Spec.VolumeName, err)
			}
			if pv != nil && pv.Spec.CSI != nil {
				// A bound volume's disk is where it is, whatever the
				// annotation said.
				r.disk = cmp.Or(pv.Spec.CSI.VolumeAttributes[diskfit.VolumeContextDiskKey], r.disk)
			}
		}
		rows = append(rows, r)
	}
	return rows, nil
}

// latestFailedScheduling returns the pod's newest FailedScheduling event,
// or nil.
func latestFailedScheduling(ctx context.Context, c *Clients, pod *corev1.Pod) (*corev1.Event, error) {
	latest, err := latestEvent(ctx, c, pod.Namespace, "Pod", pod.Name, ",reason=FailedScheduling", func(e *corev1.Event) bool {
		// An old pod of the same name has another UID.
		return e.Reason == "FailedScheduling" && (e.InvolvedObject.UID == "" || e.InvolvedObject.UID == pod.UID)
	})
	if err != nil {
		return nil, fmt.Errorf("listing events of pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return latest, nil
}

// latestEvent returns the newest event in namespace about the object kind
// name that match accepts, or nil; selector narrows the list further
// (",reason=..."). The involved object is checked here as well: a field
// selector is a server-side filter the server may not apply.
func latestEvent(ctx context.Context, c *Clients, namespace, kind, name, selector string, match func(*corev1.Event) bool) (*corev1.Event, error) {
	list, err := c.Kube.CoreV1().Events(namespace).List(ctx, metav1.ListOptions{
		FieldSelector: "involvedObject.kind=" + kind + ",involvedObject.name=" + name + selector,
	})
	if err != nil {
		return nil, err
	}
	var latest *corev1.Event
	for i := range list.Items {
		e := &list.Items[i]
		if e.InvolvedObject.Kind != kind || e.InvolvedObject.Name != name || !match(e) {
			continue
		}
		if latest == nil || eventTime(e).After(eventTime(latest)) {
			latest = e
		}
	}
	return latest, nil
}

// eventTime is when an event last happened, whichever API wrote it.
func eventTime(e *corev1.Event) time.Time {
	var series time.Time
	if e.Series != nil {
		series = e.Series.LastObservedTime.Time
	}
	for _, t := range []time.Time{series, e.LastTimestamp.Time, e.EventTime.Time, e.FirstTimestamp.Time} {
		if !t.IsZero() {
			return t
		}
	}
	return e.CreationTimestamp.Time
}

// NodeReason is one reason of a FailedScheduling message: for a reason
// that names its node (DiskFit's "node n1: ..."), Node is that node.
type NodeReason struct {
	Node   string
	Count  int
	Reason string
}

var (
	// reasonStart finds where each "<count> <reason>" of kube-scheduler's
	// "0/3 nodes are available: 1 node n1: ..., 2 node(s) had ..." begins.
	// Only a count followed by "node " qualifies, so commas inside a reason
	// ("has 9Gi, pod needs 10Gi") do not split it.
	reasonStart = regexp.MustCompile(`(?:^|: |, )(\d+) (node(?:\(s\))? )`)
	// nodeReason is DiskFit's per-node form: "node <name>: <text>".
	nodeReason = regexp.MustCompile(`^node ([a-z0-9][a-z0-9.-]*): (.*)$`)
)

// ParseSchedulingMessage splits kube-scheduler's FailedScheduling message
// into its reasons, in the message's order, dropping the preemption part.
// It returns nil when the message does not have kube-scheduler's form.
func ParseSchedulingMessage(msg string) []NodeReason {
	const prefix = " nodes are available: "
	i := strings.Index(msg, prefix)
	if i < 0 {
		return nil
	}
	body := msg[i+len(prefix):]
	if j := strings.Index(body, " preemption: "); j >= 0 {
		body = body[:j]
	}
	body = strings.TrimSuffix(strings.TrimSpace(body), ".")
	starts := reasonStart.FindAllStringSubmatchIndex(body, -1)
	var out []NodeReason
	for k, m := range starts {
		end := len(body)
		if k+1 < len(starts) {
			end = starts[k+1][0]
		}
		count := 0
		fmt.Sscanf(body[m[2]:m[3]], "%d", &count)
		text := strings.TrimSpace(body[m[4]:end])
		r := NodeReason{Count: count, Reason: text}
		if nm := nodeReason.FindStringSubmatch(text); nm != nil {
			r.Node, r.Reason = nm[1], nm[2]
		}
		out = append(out, r)
	}
	slices.SortStableFunc(out, func(a, b NodeReason) int {
		// Per-node reasons first, by node; then the counted ones.
		if (a.Node == "") != (b.Node == "") {
			if a.Node == "" {
				return 1
			}
			return -1
		}
		return cmp.Compare(a.Node, b.Node)
	})
	return out
}
