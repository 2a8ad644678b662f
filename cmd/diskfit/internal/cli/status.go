package cli

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
	"github.com/diskfit/diskfit/scheduler-plugin/packing"
)

// StatusSchemaVersion is the version of the -o json|yaml schema of diskfit
// status. Fields are only added within a version; a rename or removal bumps it.
const StatusSchemaVersion = "v1"

// StatusReport is what diskfit status -o json|yaml prints.
type StatusReport struct {
	// SchemaVersion is StatusSchemaVersion.
	SchemaVersion string `json:"schemaVersion"`
	// Nodes are sorted by name.
	Nodes []NodeReport `json:"nodes"`
}

// NodeReport is one node's DiskNode.
type NodeReport struct {
	// Name is the node's name.
	Name string `json:"name"`
	// ObservedTime is when the node's driver last refreshed its DiskNode
	// (RFC 3339); absent when it never did.
	ObservedTime *metav1.Time `json:"observedTime,omitempty"`
	// Disks are in the order of the node's config.
	Disks []DiskReport `json:"disks"`
}

// DiskReport is one disk of a node.
type DiskReport struct {
	// Name is the disk's name in the node config and in PVC annotations.
	Name string `json:"name"`
	// Backend is "file" or "lvm".
	Backend string `json:"backend"`
	// DeviceClass is the disk's device class; empty when it has none.
	DeviceClass string `json:"deviceClass"`
	// CapacityBytes is what the disk offers volumes, headroom excluded.
	CapacityBytes int64 `json:"capacityBytes"`
	// UsedBytes is CapacityBytes minus FreeBytes.
	UsedBytes int64 `json:"usedBytes"`
	// FreeBytes is what the disk's backend reports free.
	FreeBytes int64 `json:"freeBytes"`
	// VolumeCount is the number of volumes on the disk.
	VolumeCount int32 `json:"volumeCount"`
	// Healthy is false when the disk takes no new volumes.
	Healthy bool `json:"healthy"`
	// Message explains the disk's health.
	Message string `json:"message,omitempty"`
	// Unschedulable is true when the DiskNode's spec takes the disk out
	// of service for new volumes (diskfit cordon), the disk itself or its
	// whole node; UnschedulableReason is the admin's reason.
	Unschedulable       bool   `json:"unschedulable"`
	UnschedulableReason string `json:"unschedulableReason,omitempty"`
	// VolumesWithoutPV and BytesWithoutPV count the disk's volumes that no
	// PersistentVolume refers to; WithoutPV lists them (at most 32, the
	// longest without a PV first).
	VolumesWithoutPV int32                      `json:"volumesWithoutPV"`
	BytesWithoutPV   int64                      `json:"bytesWithoutPV"`
	WithoutPV        []v1alpha1.VolumeWithoutPV `json:"withoutPV,omitempty"`
	// Claims are the bound claims on an unhealthy or unschedulable disk,
	// sorted by namespace and name; absent on other disks.
	Claims []DiskClaimReport `json:"claims,omitempty"`
}

// DiskClaimReport is a claim on an unhealthy or unschedulable disk.
type DiskClaimReport struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// PV is the claim's PersistentVolume.
	PV string `json:"pv"`
	// ReleaseOnDiskLoss is true when the claim (or its StorageClass)
	// asked to be released when its disk is lost: diskfit-controller
	// releases it when the disk fails for good, diskfit drain --release
	// when an admin drains it. Otherwise it stays.
	ReleaseOnDiskLoss bool `json:"releaseOnDiskLoss"`
	// BeingDeleted is true when the claim is being deleted while a pod
	// still uses its volume.
	BeingDeleted bool `json:"beingDeleted,omitempty"`
}

// statusOptions are diskfit status's flags and arguments.
type statusOptions struct {
	output string
	nodes  []string
	now    func() time.Time
}

func newStatusCommand(streams genericiooptions.IOStreams, d deps) *cobra.Command {
	o := &statusOptions{now: d.now}
	cmd := &cobra.Command{
		Use:   "status [NODE...]",
		Short: "Show capacity, use and health of every diskfit disk",
		Long: "status prints, per node and disk, the capacity, the space used and " +
			"free, the number of volumes and the health the node's diskfit driver " +
			"last reported in its DiskNode, whether the disk is cordoned (diskfit cordon), " +
			"the claims on unhealthy or cordoned disks and the volumes that no " +
			"PersistentVolume refers to. With node names, only those nodes.",
		Example: "  diskfit status\n  diskfit status node-a -o yaml",
		RunE: func(cmd *cobra.Command, args []string) error {
			o.nodes = args
			if err := o.validate(); err != nil {
				return err
			}
			c, err := d.clients()
			if err != nil {
				return err
			}
			return o.run(cmd.Context(), c, streams)
		},
	}
	cmd.Flags().StringVarP(&o.output, "output", "o", "", "output format: json or yaml (default: a table)")
	return cmd
}

func (o *statusOptions) validate() error {
	return checkOutputFormat(o.output)
}

func (o *statusOptions) run(ctx context.Context, c *Clients, streams genericiooptions.IOStreams) error {
	var items []v1alpha1.DiskNode
	if len(o.nodes) == 0 {
		list, err := c.DiskFit.DiskfitV1alpha1().DiskNodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return fmt.Errorf("listing DiskNodes: %w", err)
		}
		items = list.Items
	} else {
		for _, name := range o.nodes {
			dn, err := c.DiskFit.DiskfitV1alpha1().DiskNodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return fmt.Errorf("reading DiskNode %s: %w", name, err)
			}
			items = append(items, *dn)
		}
	}
	report := NewStatusReport(items)
	if err := report.addClaims(ctx, c); err != nil {
		fmt.Fprintf(streams.ErrOut, "Warning: the claims on unhealthy or cordoned disks are not shown: %v\n", err)
	}
	if o.output != "" {
		return printEncoded(streams.Out, o.output, report)
	}
	if len(report.Nodes) == 0 {
		_, err := fmt.Fprintln(streams.ErrOut, "No DiskNodes found: the diskfit node plugin has not reported any node.")
		return err
	}
	return PrintStatusTable(streams.Out, report, o.now())
}

// NewStatusReport turns DiskNodes into the status report, nodes sorted by
// name.
func NewStatusReport(items []v1alpha1.DiskNode) StatusReport {
	r := StatusReport{SchemaVersion: StatusSchemaVersion, Nodes: make([]NodeReport, 0, len(items))}
	for i := range items {
		dn := &items[i]
		n := NodeReport{Name: dn.Name, Disks: make([]DiskReport, 0, len(dn.Status.Disks))}
		if !dn.Status.ObservedTime.IsZero() {
			t := dn.Status.ObservedTime
			n.ObservedTime = &t
		}
		for _, d := range dn.Status.Disks {
			unschedulable, reason := dn.Spec.DiskUnschedulable(d.Name)
			n.Disks = append(n.Disks, DiskReport{
				Name:          d.Name,
				Backend:       string(d.Backend),
				DeviceClass:   d.DeviceClass,
				CapacityBytes: d.CapacityBytes,
				UsedBytes:     max(d.CapacityBytes-d.FreeBytes, 0),
				FreeBytes:     d.FreeBytes,
				VolumeCount:   d.VolumeCount,
				Healthy:       d.Healthy,
				Message:       d.Message,

				Unschedulable:       unschedulable,
				UnschedulableReason: reason,

				VolumesWithoutPV: d.VolumesWithoutPV,
				BytesWithoutPV:   d.BytesWithoutPV,
				WithoutPV:        d.WithoutPV,
			})
		}
		r.Nodes = append(r.Nodes, n)
	}
	slices.SortFunc(r.Nodes, func(a, b NodeReport) int { return cmp.Compare(a.Name, b.Name) })
	return r
}

// addClaims fills in the claims of the unhealthy and unschedulable
// disks.
func (r *StatusReport) addClaims(ctx context.Context, c *Clients) error {
	affected := map[diskfit.Location]*DiskReport{}
	for i := range r.Nodes {
		for j := range r.Nodes[i].Disks {
			if d := &r.Nodes[i].Disks[j]; !d.Healthy || d.Unschedulable {
				affected[diskfit.Location{Node: r.Nodes[i].Name, Disk: d.Name}] = d
			}
		}
	}
	if len(affected) == 0 {
		return nil
	}
	claims, err := claimsOn(ctx, c, func(loc diskfit.Location) bool { return affected[loc] != nil })
	if err != nil {
		return err
	}
	for _, cl := range claims {
		d := affected[cl.loc]
		d.Claims = append(d.Claims, DiskClaimReport{Namespace: cl.PVC.Namespace, Name: cl.PVC.Name, PV: cl.PV.Name, ReleaseOnDiskLoss: cl.release, BeingDeleted: cl.deleting})
	}
	return nil
}

// barWidth is the number of cells of a usage bar.
const barWidth = 20

// PrintStatusTable writes the report as a table, one row per disk, the
// node's name and the age of its report on its first row, then the
// reasons of unhealthy and cordoned disks, the claims on them and the
// volumes without a PV.
func PrintStatusTable(out io.Writer, r StatusReport, now time.Time) error {
	var buf bytes.Buffer
	w := tabwriter.NewWriter(&buf, 0, 8, 2, ' ', 0)
	fmt.Fprintln(w, "NODE\tDISK\tCLASS\tBACKEND\tCAPACITY\tUSED\tFREE\tVOLUMES\tHEALTH\tUSAGE\tOBSERVED")
	var problems, cordoned, claims, withoutPV []string
	for _, n := range r.Nodes {
		observed := "never"
		if n.ObservedTime != nil {
			observed = duration.HumanDuration(now.Sub(n.ObservedTime.Time)) + " ago"
		}
		if len(n.Disks) == 0 {
			fmt.Fprintf(w, "%s\t-\t-\t-\t-\t-\t-\t-\tno disks\t\t%s\n", n.Name, observed)
			continue
		}
		for i, d := range n.Disks {
			node := ""
			age := ""
			if i == 0 {
				node, age = n.Name, observed
			}
			health := "ok"
			if !d.Healthy {
				health = "UNHEALTHY"
				problems = append(problems, fmt.Sprintf("%s/%s: %s", n.Name, d.Name, cmp.Or(d.Message, "no reason given")))
			}
			if d.Unschedulable {
				health += ",cordoned"
				cordoned = append(cordoned, fmt.Sprintf("%s/%s: %s", n.Name, d.Name, cmp.Or(d.UnschedulableReason, "no reason given")))
			}
			for _, cl := range d.Claims {
				claims = append(claims, fmt.Sprintf("%s/%s: %s/%s (%s)", n.Name, d.Name, cl.Namespace, cl.Name, onDiskLoss(cl.ReleaseOnDiskLoss, cl.BeingDeleted)))
			}
			withoutPV = append(withoutPV, describeWithoutPV(n.Name, d, now)...)
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n",
				node, d.Name, cmp.Or(d.DeviceClass, "-"), d.Backend,
				packing.FormatBytes(d.CapacityBytes), packing.FormatBytes(d.UsedBytes), packing.FormatBytes(d.FreeBytes),
				d.VolumeCount, health, usageBar(d.UsedBytes, d.CapacityBytes), age)
		}
	}
	if err := flushTrimmed(w, &buf, out); err != nil {
		return err
	}
	if len(problems) > 0 {
		if _, err := fmt.Fprintf(out, "\nUnhealthy disks:\n  %s\n", strings.Join(problems, "\n  ")); err != nil {
			return err
		}
	}
	if len(cordoned) > 0 {
		if _, err := fmt.Fprintf(out, "\nCordoned disks (no new volumes; diskfit uncordon NODE[/DISK] puts them back):\n  %s\n", strings.Join(cordoned, "\n  ")); err != nil {
			return err
		}
	}
	if len(claims) > 0 {
		if _, err := fmt.Fprintf(out, "\nClaims on unhealthy or cordoned disks (release: moved off by diskfit drain --release, or when the disk fails for good; keep: stays):\n  %s\n",
			strings.Join(claims, "\n  ")); err != nil {
			return err
		}
	}
	if len(withoutPV) > 0 {
		if _, err := fmt.Fprintf(out, "\nVolumes without a PersistentVolume (kept with their data; re-create a PV for one, or remove it with diskfit reclaim NODE VOLUME):\n  %s\n",
			strings.Join(withoutPV, "\n  ")); err != nil {
			return err
		}
	}
	return nil
}

// describeWithoutPV is a line per volume of d without a PV, and one for
// those the DiskNode does not list.
func describeWithoutPV(node string, d DiskReport, now time.Time) []string {
	var lines []string
	for _, v := range d.WithoutPV {
		line := fmt.Sprintf("%s %s %s, claim %s, without a PV for %s", node, v.VolumeHandle, packing.FormatBytes(v.SizeBytes),
			cmp.Or(v.Claim, "-"), duration.HumanDuration(now.Sub(v.Since.Time)))
		if v.NeverHadPV {
			line += " (never had one: removed by the driver after the orphan grace period, unless its claim still waits for it)"
		}
		lines = append(lines, line)
	}
	if more := int(d.VolumesWithoutPV) - len(d.WithoutPV); more > 0 {
		lines = append(lines, fmt.Sprintf("%s/%s: %d more", node, d.Name, more))
	}
	return lines
}

// usageBar draws used/capacity as "[#####...............]  25%"; cells
// round down so a bar is only full when the disk is.
func usageBar(used, capacity int64) string {
	if capacity <= 0 {
		return "[" + strings.Repeat(" ", barWidth) + "]    -"
	}
	used = min(max(used, 0), capacity)
	cells := int(used * barWidth / capacity)
	pct := int(used * 100 / capacity)
	return fmt.Sprintf("[%s%s] %3d%%", strings.Repeat("#", cells), strings.Repeat(".", barWidth-cells), pct)
}

// flushTrimmed flushes w, which writes to buf, and copies buf to out
// without the padding tabwriter leaves after a row's last non-empty cell.
func flushTrimmed(w *tabwriter.Writer, buf *bytes.Buffer, out io.Writer) error {
	if err := w.Flush(); err != nil {
		return err
	}
	lines := strings.SplitAfter(buf.String(), "\n")
	var b strings.Builder
	for _, l := range lines {
		if strings.HasSuffix(l, "\n") {
			b.WriteString(strings.TrimRight(l, " \n"))
			b.WriteString("\n")
		} else {
			b.WriteString(l)
		}
	}
	_, err := io.WriteString(out, b.String())
	return err
}
