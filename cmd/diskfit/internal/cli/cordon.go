package cli

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/util/retry"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
)

// target is what cordon, uncordon and drain act on: one disk of a node,
// or every disk of it when disk is empty.
type target struct {
	node, disk string
}

// parseTarget reads NODE or NODE/DISK.
func parseTarget(arg string) (target, error) {
	node, disk, hasDisk := strings.Cut(arg, "/")
	if node == "" {
		return target{}, fmt.Errorf("%q names no node: use NODE or NODE/DISK", arg)
	}
	if hasDisk {
		if err := diskfit.ValidateDiskName(disk); err != nil {
			return target{}, err
		}
	}
	return target{node: node, disk: disk}, nil
}

func (t target) String() string {
	if t.disk == "" {
		return "node " + t.node
	}
	return "disk " + t.arg()
}

// arg is the target as the commands take it: NODE or NODE/DISK.
func (t target) arg() string {
	if t.disk == "" {
		return t.node
	}
	return t.node + "/" + t.disk
}

// has reports whether loc is one of the target's disks.
func (t target) has(loc diskfit.Location) bool {
	return loc.Node == t.node && (t.disk == "" || loc.Disk == t.disk)
}

// checkDisk returns an error when the target names a disk dn neither
// reports nor has a spec entry for.
func (t target) checkDisk(dn *v1alpha1.DiskNode) error {
	if t.disk == "" || dn.Status.Disk(t.disk) != nil || slices.ContainsFunc(dn.Spec.Disks, func(d v1alpha1.DiskSpec) bool { return d.Name == t.disk }) {
		return nil
	}
	names := make([]string, 0, len(dn.Status.Disks))
	for _, d := range dn.Status.Disks {
		names = append(names, d.Name)
	}
	if len(names) == 0 {
		return fmt.Errorf("node %s has no disk %s: its DiskNode reports no disks", t.node, t.disk)
	}
	return fmt.Errorf("node %s has no disk %s: its disks are %s", t.node, t.disk, strings.Join(names, ", "))
}

// getDiskNode reads the target's DiskNode and checks its disk.
func (t target) getDiskNode(ctx context.Context, c *Clients) (*v1alpha1.DiskNode, error) {
	dn, err := c.DiskFit.DiskfitV1alpha1().DiskNodes().Get(ctx, t.node, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading DiskNode %s: %w", t.node, err)
	}
	return dn, t.checkDisk(dn)
}

// cordonOptions are the flags and argument of cordon and uncordon.
type cordonOptions struct {
	target target
	reason string
}

func newCordonCommand(streams genericiooptions.IOStreams, d deps) *cobra.Command {
	o := &cordonOptions{}
	cmd := &cobra.Command{
		Use:   "cordon NODE[/DISK]",
		Short: "Take a disk, or every disk of a node, out of service for new volumes",
		Long: "cordon marks a disk (NODE/DISK) or all disks of a node (NODE) unschedulable in " +
			"the node's DiskNode spec: diskfit-scheduler and the driver place no new volume there. " +
			"Volumes already on it stay and keep working; diskfit drain lists them and can move " +
			"them. It needs the right to update DiskNodes.",
		Example: "  diskfit cordon node-a/nvme0 --reason 'SMART errors, replace on Friday'\n  diskfit cordon node-a",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if o.target, err = parseTarget(args[0]); err != nil {
				return err
			}
			c, err := d.clients()
			if err != nil {
				return err
			}
			_, err = setUnschedulable(cmd.Context(), c, o.target, true, o.reason, streams.Out)
			return err
		},
	}
	cmd.Flags().StringVar(&o.reason, "reason", "", "why, for people (kept when not given)")
	return cmd
}

func newUncordonCommand(streams genericiooptions.IOStreams, d deps) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "uncordon NODE[/DISK]",
		Short: "Put a disk, or a node's disks, back into service for new volumes",
		Long: "uncordon undoes cordon: for NODE/DISK it removes the disk's entry from the " +
			"DiskNode spec, for NODE it clears the node-wide mark (entries of single disks stay).",
		Example: "  diskfit uncordon node-a/nvme0\n  diskfit uncordon node-a",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			t, err := parseTarget(args[0])
			if err != nil {
				return err
			}
			c, err := d.clients()
			if err != nil {
				return err
			}
			_, err = setUnschedulable(cmd.Context(), c, t, false, "", streams.Out)
			return err
		},
	}
	return cmd
}

// setUnschedulable marks the target unschedulable (on) or takes the mark
// off, and says on out what it did. It re-reads and updates the DiskNode
// until no one else has changed it in between, so no concurrent change of
// the spec is lost. It returns the DiskNode as written (or as read when
// nothing had to change).
func setUnschedulable(ctx context.Context, c *Clients, t target, on bool, reason string, out io.Writer) (*v1alpha1.DiskNode, error) {
	var dn *v1alpha1.DiskNode
	var changed bool
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var err error
		if dn, err = t.getDiskNode(ctx, c); err != nil {
			return err
		}
		changed = applyUnschedulable(&dn.Spec, t.disk, on, reason)
		if !changed {
			return nil
		}
		if dn, err = c.DiskFit.DiskfitV1alpha1().DiskNodes().Update(ctx, dn, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("updating DiskNode %s: %w", t.node, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return dn, describeUnschedulable(out, dn, t, on, changed)
}

// applyUnschedulable changes spec so that the disk (the whole node when
// disk is empty) is unschedulable or not, keeping the other disks'
// entries, and reports whether anything changed. An empty reason keeps the
// one set before.
func applyUnschedulable(spec *v1alpha1.DiskNodeSpec, disk string, on bool, reason string) bool {
	if disk == "" {
		before := *spec
		spec.Unschedulable = on
		switch {
		case !on:
			spec.Reason = ""
		case reason != "":
			spec.Reason = reason
		}
		return before.Unschedulable != spec.Unschedulable || before.Reason != spec.Reason
	}
	i := slices.IndexFunc(spec.Disks, func(d v1alpha1.DiskSpec) bool { return d.Name == disk })
	if !on {
		if i < 0 {
			return false
		}
		spec.Disks = slices.Delete(spec.Disks, i, i+1)
		return true
	}
	if i < 0 {
		spec.Disks = append(spec.Disks, v1alpha1.DiskSpec{Name: disk, Unschedulable: true, Reason: reason})
		return true
	}
	d := &spec.Disks[i]
	before := *d
	d.Unschedulable = true
	if reason != "" {
		d.Reason = reason
	}
	return before != *d
}

// describeUnschedulable says what setUnschedulable did, kubectl cordon's
// way, and what still keeps the target's disks out of service after an
// uncordon.
func describeUnschedulable(out io.Writer, dn *v1alpha1.DiskNode, t target, on, changed bool) error {
	var b strings.Builder
	done := "cordoned"
	if !on {
		done = "uncordoned"
	}
	if !changed {
		done = "already " + done
	}
	fmt.Fprintf(&b, "%s %s", t, done)
	switch {
	case on && t.disk == "":
		b.WriteString(": no new volume is placed on any of its disks; the volumes on them stay")
	case on:
		b.WriteString(": no new volume is placed on it; the volumes on it stay")
	}
	if reason := unschedulableReason(&dn.Spec, t.disk); on && reason != "" {
		fmt.Fprintf(&b, " (reason: %s)", reason)
	}
	b.WriteString("\n")
	if !on && t.disk != "" && dn.Spec.Unschedulable {
		fmt.Fprintf(&b, "The whole node %s stays cordoned: diskfit uncordon %s puts its disks back.\n", t.node, t.node)
	}
	if !on && t.disk == "" {
		var still []string
		for _, d := range dn.Spec.Disks {
			if d.Unschedulable {
				still = append(still, d.Name)
			}
		}
		if len(still) > 0 {
			fmt.Fprintf(&b, "Disks cordoned on their own stay so: %s (diskfit uncordon %s/DISK).\n", strings.Join(still, ", "), t.node)
		}
	}
	_, err := io.WriteString(out, b.String())
	return err
}

// unschedulableReason is the reason the spec gives for the disk (the
// node's when disk is empty).
func unschedulableReason(spec *v1alpha1.DiskNodeSpec, disk string) string {
	if disk == "" {
		return spec.Reason
	}
	_, reason := spec.DiskUnschedulable(disk)
	return reason
}
