// Command diskfit shows what diskfit is doing on a cluster: per-disk
// capacity and free space (diskfit status), why a pod is Pending in
// per-disk terms (diskfit explain) and whether a workload would fit now
// (diskfit simulate), and takes disks out of service and moves the claims
// off them (diskfit cordon, uncordon, drain). It follows kubectl's
// conventions for choosing the cluster (--kubeconfig, --context, -n).
//
// It exits 0 on success, 1 when simulate finds that a workload does not
// fit, and 2 on any error.
package main

import (
	"errors"
	"fmt"
	"os"

	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/diskfit/diskfit/cmd/diskfit/internal/cli"
)

func main() {
	cmd := cli.NewCommand(genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr})
	err := cmd.Execute()
	if err != nil && !errors.Is(err, cli.ErrDoesNotFit) {
		fmt.Fprintln(os.Stderr, "error:", err)
	}
	os.Exit(cli.ExitCode(err))
}
