// Command diskfit shows what diskfit is doing on a cluster: per-disk
// capacity and free space (diskfit status) and why a pod is Pending in
// per-disk terms (diskfit explain). It follows kubectl's conventions for
// choosing the cluster (--kubeconfig, --context, -n).
package main

import (
	"os"

	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/diskfit/diskfit/cmd/diskfit/internal/cli"
)

func main() {
	cmd := cli.NewCommand(genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr})
	if err := cmd.Execute(); err != nil {
		os.Exit(1)
	}
}
