package cli

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/scheduler-plugin/apis/config"
	configv1 "github.com/diskfit/diskfit/scheduler-plugin/apis/config/v1"
	"github.com/diskfit/diskfit/scheduler-plugin/apis/config/validation"
	"github.com/diskfit/diskfit/scheduler-plugin/fit"
	"github.com/diskfit/diskfit/scheduler-plugin/packing"
)

// SimulateSchemaVersion is the version of the -o json|yaml schema of
// diskfit simulate. Fields are only added within a version.
const SimulateSchemaVersion = "v1"

// ErrDoesNotFit is what diskfit simulate returns, after printing its
// result, when not every replica fits: the command's answer, not a failure
// to give one (ExitCode tells the two apart).
var ErrDoesNotFit = errors.New("not every replica fits")

// ExitCode is the process exit code for a command's error: 0 for none, 1
// when simulate's answer is "does not fit", 2 for every error.
func ExitCode(err error) int {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, ErrDoesNotFit):
		return 1
	default:
		return 2
	}
}

// SimulateReport is what diskfit simulate -o json|yaml prints.
type SimulateReport struct {
	// SchemaVersion is SimulateSchemaVersion.
	SchemaVersion string `json:"schemaVersion"`
	// Workload is what was simulated.
	Workload SimulatedWorkload `json:"workload"`
	// Strategy is the packing strategy used: MostAllocated or
	// LeastAllocated.
	Strategy string `json:"strategy"`
	// Fits is true when every replica fits.
	Fits bool `json:"fits"`
	// FittingReplicas is the number of replicas that fit.
	FittingReplicas int `json:"fittingReplicas"`
	// Replicas are in the order they were placed.
	Replicas []ReplicaReport `json:"replicas"`
}

// SimulatedWorkload names the simulated workload.
type SimulatedWorkload struct {
	// Kind is StatefulSet, PersistentVolumeClaim (claims from a file) or
	// Claims (--claims).
	Kind string `json:"kind"`
	// Namespace is the namespace of the workload's claims.
	Namespace string `json:"namespace"`
	// Name is the StatefulSet's name.
	Name string `json:"name,omitempty"`
	// SchedulerName is the StatefulSet's pod template's scheduler.
	SchedulerName string `json:"schedulerName,omitempty"`
}

// ReplicaReport is where one replica would go.
type ReplicaReport struct {
	// Name is the pod's name for a StatefulSet, else replica-<n>.
	Name string `json:"name"`
	// Fits is true when a node holds all of the replica's claims.
	Fits bool `json:"fits"`
	// Node is the node chosen; empty when the replica does not fit.
	Node string `json:"node,omitempty"`
	// Claims are in the order of the workload's claims.
	Claims []ClaimReport `json:"claims"`
	// Rejections say, per node sorted by name, why it cannot take the
	// replica; only for a replica that does not fit.
	Rejections []NodeRejection `json:"rejections,omitempty"`
}

// ClaimReport is one claim of a replica.
type ClaimReport struct {
	// Name is the PVC's name.
	Name string `json:"name"`
	// StorageClass is the claim's class, the default class filled in.
	StorageClass string `json:"storageClass"`
	// DeviceClass is the disks' device class the class asks for.
	DeviceClass string `json:"deviceClass,omitempty"`
	// SizeBytes is the space the volume takes on its disk (the request
	// rounded as the driver rounds it).
	SizeBytes int64 `json:"sizeBytes"`
	// Disk is the disk chosen, or the disk of an existing volume.
	Disk string `json:"disk,omitempty"`
	// Existing is true for a StatefulSet's PVC that already exists: its
	// place, if it has one, is kept.
	Existing bool `json:"existing,omitempty"`
	// Skipped says why diskfit does not place the claim (another
	// provisioner's class, for example).
	Skipped string `json:"skipped,omitempty"`
}

// NodeRejection is why a node cannot take a replica.
type NodeRejection struct {
	// Node is the node's name.
	Node string `json:"node"`
	// Reason is in DiskFit's per-disk terms for lack of space.
	Reason string `json:"reason"`
}

// simulateOptions are diskfit simulate's flags.
type simulateOptions struct {
	file         string
	claims       string
	replicas     int32
	replicasSet  bool
	storageClass string
	strategy     string
	strategySet  bool
	config       string
	output       string
	now          func() time.Time
}

func newSimulateCommand(streams genericiooptions.IOStreams, d deps) *cobra.Command {
	o := &simulateOptions{now: d.now}
	cmd := &cobra.Command{
		Use:   "simulate (-f FILE | --claims SIZE[,SIZE...])",
		Short: "Say whether and where a workload's volumes would fit now",
		Long: "simulate places the replicas of a workload one after another on the " +
			"disks of the cluster as diskfit-scheduler would: from the DiskNodes, PVs " +
			"and PVCs its ledger is built from, on nodes that are Ready, not cordoned " +
			"and match the pod template's node selector, affinity and tolerations. " +
			"Each replica's claims go onto one node, each claim onto one disk, and " +
			"take their space before the next replica is placed. Nothing is created.\n\n" +
			"The workload is a StatefulSet (its volumeClaimTemplates times its " +
			"replicas; PVCs of it that exist keep their place), PersistentVolumeClaims " +
			"(the claims of one pod), or sizes given with --claims.\n\n" +
			"Exit status: 0 when every replica fits, 1 when one does not, 2 on error.",
		Example: "  diskfit simulate -f statefulset.yaml\n" +
			"  diskfit simulate --claims 10Gi,2Gi --replicas 3 --storage-class diskfit-nvme\n" +
			"  kubectl get pvc -n shop -o yaml | diskfit simulate -f - -o json",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.replicasSet = cmd.Flags().Changed("replicas")
			o.strategySet = cmd.Flags().Changed("strategy")
			args, err := o.validate()
			if err != nil {
				return err
			}
			c, err := d.clients()
			if err != nil {
				return err
			}
			return o.run(cmd.Context(), c, args, streams)
		},
	}
	cmd.Flags().StringVarP(&o.file, "filename", "f", "", "file with a StatefulSet or PersistentVolumeClaims (YAML or JSON); - reads stdin")
	cmd.Flags().StringVar(&o.claims, "claims", "", "comma-separated claim sizes of one replica, e.g. 10Gi,2Gi")
	cmd.Flags().Int32Var(&o.replicas, "replicas", 0, "number of replicas (default: the StatefulSet's, else 1)")
	cmd.Flags().StringVar(&o.storageClass, "storage-class", "", "StorageClass of the --claims (default: the cluster's default class)")
	cmd.Flags().StringVar(&o.strategy, "strategy", string(configv1.MostAllocated), "packing strategy: MostAllocated or LeastAllocated (default: the --config file's, else MostAllocated)")
	cmd.Flags().StringVar(&o.config, "config", "", "diskfit-scheduler's configuration file (KubeSchedulerConfiguration): place with the DiskFit args of its diskfit-scheduler profile (strategy, deviceClassWeights, maxExactClaims, maxDiskNodeAge) instead of the defaults")
	cmd.Flags().StringVarP(&o.output, "output", "o", "", "output format: json or yaml (default: a table)")
	return cmd
}

// validate checks the flags and returns the DiskFit args they ask for:
// the --config file's or the defaults, with the strategy of --strategy.
func (o *simulateOptions) validate() (*config.DiskFitArgs, error) {
	if err := checkOutputFormat(o.output); err != nil {
		return nil, err
	}
	switch {
	case o.file == "" && o.claims == "":
		return nil, errors.New("nothing to simulate: give a workload with -f FILE or --claims SIZES")
	case o.file != "" && o.claims != "":
		return nil, errors.New("-f and --claims exclude each other")
	case o.storageClass != "" && o.claims == "":
		return nil, errors.New("--storage-class goes with --claims; a file's claims name their own class")
	case o.replicasSet && o.replicas < 1:
		return nil, fmt.Errorf("--replicas %d: must be at least 1", o.replicas)
	}
	if !slices.Contains(config.ScoringStrategyTypes(), config.ScoringStrategyType(o.strategy)) {
		return nil, fmt.Errorf("unknown strategy %q: use MostAllocated or LeastAllocated", o.strategy)
	}
	args := configv1.DefaultArgs()
	if o.config != "" {
		var err error
		if args, err = readSchedulerArgs(o.config); err != nil {
			return nil, err
		}
	}
	if o.strategySet || o.config == "" {
		args.ScoringStrategy.Type = config.ScoringStrategyType(o.strategy)
	}
	return args, nil
}

// schedulerConfiguration is the part of a KubeSchedulerConfiguration that
// simulate reads.
type schedulerConfiguration struct {
	Profiles []struct {
		SchedulerName string `json:"schedulerName"`
		PluginConfig  []struct {
			Name string          `json:"name"`
			Args json.RawMessage `json:"args"`
		} `json:"pluginConfig"`
	} `json:"profiles"`
}

// readSchedulerArgs returns the DiskFit args of the diskfit-scheduler
// profile in a scheduler configuration file, defaulted and validated as the
// scheduler does.
func readSchedulerArgs(path string) (*config.DiskFitArgs, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var file schedulerConfiguration
	if err := yaml.Unmarshal(data, &file); err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	for _, p := range file.Profiles {
		if p.SchedulerName != diskfit.SchedulerName {
			continue
		}
		v := &configv1.DiskFitArgs{}
		for _, pc := range p.PluginConfig {
			if pc.Name == diskfit.PluginName && len(pc.Args) > 0 {
				if err := json.Unmarshal(pc.Args, v); err != nil {
					return nil, fmt.Errorf("reading the %s args in %s: %w", diskfit.PluginName, path, err)
				}
			}
		}
		args, err := configv1.InternalArgs(v)
		if err != nil {
			return nil, err
		}
		if err := validation.ValidateDiskFitArgs(field.NewPath("args"), args); err != nil {
			return nil, fmt.Errorf("invalid %s args in %s: %w", diskfit.PluginName, path, err)
		}
		return args, nil
	}
	return nil, fmt.Errorf("%s has no profile with schedulerName %s", path, diskfit.SchedulerName)
}

// readWorkload reads the workload the flags name.
func (o *simulateOptions) readWorkload(in io.Reader, namespace string) (*workload, error) {
	replicas := int32(-1)
	if o.replicasSet {
		replicas = o.replicas
	}
	if o.claims != "" {
		return claimsWorkload(o.claims, o.storageClass, namespace, replicas)
	}
	if o.file == "-" {
		return readWorkload(in, "stdin", namespace, replicas)
	}
	f, err := os.Open(o.file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readWorkload(f, o.file, namespace, replicas)
}

func (o *simulateOptions) run(ctx context.Context, c *Clients, args *config.DiskFitArgs, streams genericiooptions.IOStreams) error {
	w, err := o.readWorkload(streams.In, c.Namespace)
	if err != nil {
		return err
	}
	for _, doc := range w.ignored {
		fmt.Fprintf(streams.ErrOut, "Ignoring %s: simulate reads StatefulSets and PersistentVolumeClaims.\n", doc)
	}
	report, err := simulate(ctx, c, w, args, o.now())
	if err != nil {
		return err
	}
	if o.output != "" {
		err = printEncoded(streams.Out, o.output, report)
	} else {
		err = PrintSimulateTable(streams.Out, report)
	}
	if err != nil {
		return err
	}
	if !report.Fits {
		return ErrDoesNotFit
	}
	return nil
}

// simulate places the workload's replicas on the cluster the clients
// reach, one after another, as diskfit-scheduler with args would now.
func simulate(ctx context.Context, c *Clients, w *workload, args *config.DiskFitArgs, now time.Time) (SimulateReport, error) {
	report := SimulateReport{
		SchemaVersion: SimulateSchemaVersion,
		Workload:      SimulatedWorkload{Kind: w.kind, Namespace: w.namespace, Name: w.name, SchedulerName: w.schedulerName},
		Strategy:      string(args.ScoringStrategy.Type),
		Replicas:      []ReplicaReport{},
	}
	cl, err := loadCluster(ctx, c)
	if err != nil {
		return report, err
	}
	planned := make([]*plannedReplica, 0, len(w.replicas))
	var skipped []string
	diskfitClaims := 0
	for _, r := range w.replicas {
		p, err := cl.plan(w, r)
		if err != nil {
			return report, err
		}
		for _, c := range p.report.Claims {
			if c.Skipped == "" {
				diskfitClaims++
			} else {
				skipped = append(skipped, c.Name+": "+c.Skipped)
			}
		}
		planned = append(planned, p)
	}
	if diskfitClaims == 0 {
		msg := "none of the claims is diskfit's (" + strings.Join(skipped, "; ") + ")"
		if w.kind == "Claims" {
			msg += ": name a StorageClass of " + diskfit.DriverName + " with --storage-class"
		}
		return report, errors.New(msg)
	}
	excluded, err := cl.nodeExclusions(klog.FromContext(ctx), w)
	if err != nil {
		return report, err
	}
	ev := fit.New(cl.ledger, args, func() time.Time { return now })
	for _, p := range planned {
		if err := cl.place(p, excluded, ev); err != nil {
			return report, err
		}
		if p.report.Fits {
			report.FittingReplicas++
		}
		report.Replicas = append(report.Replicas, p.report)
	}
	report.Fits = report.FittingReplicas == len(report.Replicas)
	return report, nil
}

// PrintSimulateTable writes the report as a table, one row per claim, then
// the claims diskfit does not place, why each replica that does not fit
// fits nowhere (replicas failing alike together), and the count.
func PrintSimulateTable(out io.Writer, r SimulateReport) error {
	what := fmt.Sprintf("claims in namespace %s", r.Workload.Namespace)
	switch r.Workload.Kind {
	case "StatefulSet":
		what = fmt.Sprintf("StatefulSet %s/%s", r.Workload.Namespace, r.Workload.Name)
	case "PersistentVolumeClaim":
		what = fmt.Sprintf("PersistentVolumeClaims in namespace %s", r.Workload.Namespace)
	}
	fmt.Fprintf(out, "%s, %d replica(s), strategy %s\n", what, len(r.Replicas), r.Strategy)
	if s := r.Workload.SchedulerName; s != "" && s != diskfit.SchedulerName {
		fmt.Fprintf(out, "Its pods use %s, which places claims per node, not per disk: this is where %s would put them.\n", s, diskfit.SchedulerName)
	}
	fmt.Fprintln(out)

	var buf bytes.Buffer
	w := tabwriter.NewWriter(&buf, 0, 8, 2, ' ', 0)
	fmt.Fprintln(w, "REPLICA\tNODE\tCLAIM\tCLASS\tSIZE\tDISK")
	var skipped []string
	for _, rep := range r.Replicas {
		for i, c := range rep.Claims {
			replica, node := "", ""
			if i == 0 {
				replica, node = rep.Name, "-"
				if rep.Fits {
					node = rep.Node
				}
			}
			disk := "-"
			switch {
			case c.Skipped != "":
				disk = "(not diskfit's)"
				skipped = append(skipped, c.Name+": "+c.Skipped)
			case c.Disk != "" && c.Existing:
				disk = c.Disk + " (existing)"
			case c.Disk != "":
				disk = c.Disk
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", replica, node, c.Name, cmp.Or(c.StorageClass, "-"), packing.FormatBytes(c.SizeBytes), disk)
		}
	}
	if err := flushTrimmed(w, &buf, out); err != nil {
		return err
	}
	if len(skipped) > 0 {
		fmt.Fprintf(out, "\nNot placed by diskfit:\n  %s\n", strings.Join(skipped, "\n  "))
	}

	// Replicas that fail for the same reasons are listed together.
	type group struct {
		names      []string
		rejections []NodeRejection
	}
	var groups []*group
	byReasons := map[string]*group{}
	for _, rep := range r.Replicas {
		if rep.Fits {
			continue
		}
		key := joinRejections(rep.Rejections)
		g := byReasons[key]
		if g == nil {
			g = &group{rejections: rep.Rejections}
			byReasons[key] = g
			groups = append(groups, g)
		}
		g.names = append(g.names, rep.Name)
	}
	for _, g := range groups {
		verb := "does"
		if len(g.names) > 1 {
			verb = "do"
		}
		fmt.Fprintf(out, "\n%s %s not fit:\n", strings.Join(g.names, ", "), verb)
		if len(g.rejections) == 0 {
			fmt.Fprintln(out, "  no nodes")
		}
		for _, rej := range g.rejections {
			fmt.Fprintf(out, "  %s: %s\n", rej.Node, rej.Reason)
		}
	}
	_, err := fmt.Fprintf(out, "\nfits: %d/%d replicas\n", r.FittingReplicas, len(r.Replicas))
	return err
}
