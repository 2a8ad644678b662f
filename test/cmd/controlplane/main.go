// Command controlplane runs the tests' control plane (test/cluster/
// controlplane: embedded etcd, kube-apiserver, the PV controller and the
// other controllers PVC binding needs) until it is interrupted, and writes
// an administrator's kubeconfig. Built for an older Kubernetes minor
// (make test-kube-minors), it is that minor's API server for test/skew,
// whose clients are the newest minor's.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/diskfit/diskfit/test/cluster/controlplane"
)

func main() {
	dir := flag.String("dir", "", "directory for etcd's data and the kubeconfig (required)")
	crds := flag.String("crds", "", "directory of CustomResourceDefinitions to install, e.g. manifests/base/crd")
	flag.Parse()
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "controlplane: -dir is required")
		os.Exit(2)
	}
	if err := run(*dir, *crds); err != nil {
		fmt.Fprintln(os.Stderr, "controlplane:", err)
		os.Exit(1)
	}
}

func run(dir, crds string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cp, err := controlplane.Start(ctx, dir)
	if err != nil {
		return err
	}
	defer cp.Stop()
	if crds != "" {
		if err := controlplane.InstallCRDs(ctx, cp.Config, crds); err != nil {
			return err
		}
	}
	// Written last: its presence says the API server is ready.
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := controlplane.WriteKubeconfig(cp.Config, kubeconfig+".tmp"); err != nil {
		return err
	}
	if err := os.Rename(kubeconfig+".tmp", kubeconfig); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}
