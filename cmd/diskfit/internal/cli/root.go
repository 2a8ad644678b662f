// Package cli implements the diskfit command: its cobra commands, the
// clients they use and their output.
package cli

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/kubernetes"

	"github.com/diskfit/diskfit/apis/client/clientset/versioned"
)

// Clients are the API clients and the namespace a command works with.
type Clients struct {
	Kube      kubernetes.Interface
	DiskFit   versioned.Interface
	Namespace string
}

// ClientsFunc returns the clients for the cluster the flags chose. It is
// called when a command runs, after flag parsing; tests return fakes.
type ClientsFunc func() (*Clients, error)

// NewCommand returns the diskfit root command with kubectl's cluster flags
// (--kubeconfig, --context, -n, ...).
func NewCommand(streams genericiooptions.IOStreams) *cobra.Command {
	flags := genericclioptions.NewConfigFlags(true)
	cmd := newRootCommand(streams, deps{
		clients: func() (*Clients, error) { return clientsFromFlags(flags) },
		now:     time.Now,
		poll:    2 * time.Second,
	})
	flags.AddFlags(cmd.PersistentFlags())
	return cmd
}

// deps are what the commands take from outside: clients, the clock and
// how often a command that waits looks again.
type deps struct {
	clients ClientsFunc
	now     func() time.Time
	poll    time.Duration
}

func newRootCommand(streams genericiooptions.IOStreams, d deps) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "diskfit",
		Short: "Show how diskfit places local-disk volumes",
		Long: "diskfit shows the disks diskfit manages on each node, why pods " +
			"that use them are placed where they are, or not at all, and whether " +
			"a workload would fit before it is created, and takes disks out of service.",
		SilenceUsage: true,
		// main prints errors, except simulate's "does not fit" answer.
		SilenceErrors: true,
	}
	cmd.SetIn(streams.In)
	cmd.SetOut(streams.Out)
	cmd.SetErr(streams.ErrOut)
	cmd.AddCommand(newStatusCommand(streams, d))
	cmd.AddCommand(newExplainCommand(streams, d))
	cmd.AddCommand(newSimulateCommand(streams, d))
	cmd.AddCommand(newReclaimCommand(streams, d))
	cmd.AddCommand(newCordonCommand(streams, d))
	cmd.AddCommand(newUncordonCommand(streams, d))
	cmd.AddCommand(newDrainCommand(streams, d))
	return cmd
}

func clientsFromFlags(flags *genericclioptions.ConfigFlags) (*Clients, error) {
	cfg, err := flags.ToRESTConfig()
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig: %w", err)
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating Kubernetes client: %w", err)
	}
	df, err := versioned.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating DiskNode client: %w", err)
	}
	ns, _, err := flags.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return nil, fmt.Errorf("reading namespace: %w", err)
	}
	return &Clients{Kube: kube, DiskFit: df, Namespace: ns}, nil
}
