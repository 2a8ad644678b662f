// Command localcluster runs a whole diskfit cluster on this machine without
// Docker (see package test/cluster).
//
//	localcluster up [--kubeconfig-out PATH]   run until interrupted
//	localcluster demo [--keep]                the README's demo
//	localcluster bench                        time to bind, diskfit vs default
//	localcluster load [--waves N] [--per-wave N] [--size Q]
//	                                          waves of claims and pods; checks
//	                                          for overbooking, leftovers, leaks
//	localcluster sweep                        clean up after killed runs
//
// `up` prints the admin kubeconfig path once every node is ready. SIGINT or
// SIGTERM stop either command and remove every mount, loop device and file
// it made. While `up` runs, SIGUSR1 starts an API server outage for the
// diskfit components and sidecars and SIGUSR2 ends it (the fault tests).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"k8s.io/klog/v2"

	"github.com/diskfit/diskfit/test/cluster"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == cluster.KubeletCommand {
		runKubelet()
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "sweep" {
		if err := cluster.SweepLeftovers(); err != nil {
			fmt.Fprintln(os.Stderr, "localcluster sweep:", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) < 2 || (os.Args[1] != "up" && os.Args[1] != "demo" && os.Args[1] != "bench" && os.Args[1] != "load") {
		fmt.Fprintln(os.Stderr, "usage: localcluster up|demo|bench|load|sweep [flags]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	repo := fs.String("repo", "", "repository root (default: found from the working directory)")
	binDir := fs.String("bin-dir", "", "directory with diskfit-csi, diskfit-scheduler and csi-provisioner (default: <repo>/bin)")
	kubeconfigOut := fs.String("kubeconfig-out", "", "also copy the admin kubeconfig here")
	logDir := fs.String("log-dir", "", "write component logs here and keep them (default: removed on exit)")
	keep := fs.Bool("keep", os.Getenv("KEEP") == "1", "demo: leave the cluster running at the end (default $KEEP=1)")
	loadCfg := addLoadFlags(fs)
	klog.InitFlags(fs)
	_ = fs.Parse(os.Args[2:])

	if os.Args[1] != "up" {
		// demo, bench and load print tables for people: the in-process API
		// server's and controllers' logs go to a file instead.
		path := filepath.Join(os.TempDir(), "localcluster-"+os.Args[1]+".log")
		logFile, err := os.Create(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, "localcluster:", err)
			os.Exit(1)
		}
		defer logFile.Close()
		klog.LogToStderr(false)
		// klog copies errors to stderr too unless the threshold is above them.
		_ = fs.Set("stderrthreshold", "FATAL")
		klog.SetOutput(logFile)
		fmt.Printf("(logs of this process: %s)\n", path)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	opts := cluster.Options{RepoRoot: *repo, BinDir: *binDir, Nodes: cluster.DefaultNodes(), LogDir: *logDir}
	var err error
	if opts.RepoRoot == "" {
		opts.RepoRoot, err = findRepo()
	}
	if opts.BinDir == "" {
		opts.BinDir = filepath.Join(opts.RepoRoot, "bin")
	}
	if err == nil {
		opts.Self, err = os.Executable()
	}
	if err == nil {
		switch os.Args[1] {
		case "demo":
			err = demo(ctx, opts, *keep)
		case "bench":
			err = bench(ctx, opts)
		case "load":
			err = load(ctx, opts, *loadCfg)
		default:
			err = up(ctx, opts, *kubeconfigOut)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "localcluster:", err)
		os.Exit(1)
	}
}

func up(ctx context.Context, opts cluster.Options, kubeconfigOut string) error {
	c, err := cluster.Start(ctx, opts)
	if err != nil {
		return err
	}
	defer c.Stop()
	if kubeconfigOut != "" {
		raw, err := os.ReadFile(c.Kubeconfig)
		if err != nil {
			return err
		}
		if err := os.WriteFile(kubeconfigOut+".tmp", raw, 0o600); err != nil {
			return err
		}
		// Renamed into place so a reader never sees half a file.
		if err := os.Rename(kubeconfigOut+".tmp", kubeconfigOut); err != nil {
			return err
		}
	}
	fmt.Printf("cluster ready; kubeconfig: %s\nlogs: %s\n", c.Kubeconfig, c.LogDir)
	outage := make(chan os.Signal, 1)
	signal.Notify(outage, syscall.SIGUSR1, syscall.SIGUSR2)
	defer signal.Stop(outage)
	for {
		select {
		case <-ctx.Done():
			return nil
		case sig := <-outage:
			c.SetAPIServerDown(sig == syscall.SIGUSR1)
		}
	}
}

func findRepo() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			if _, err := os.Stat(filepath.Join(dir, "manifests")); err == nil {
				return dir, nil
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("repository root not found; pass --repo")
		}
		dir = parent
	}
}

// runKubelet is one node's kubelet, started by the cluster in this binary.
func runKubelet() {
	fs := flag.NewFlagSet(cluster.KubeletCommand, flag.ContinueOnError)
	klog.InitFlags(fs)
	_ = fs.Set("v", "2")
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := cluster.RunKubelet(ctx, os.Args[2:]); err != nil {
		fmt.Fprintln(os.Stderr, "kubelet:", err)
		os.Exit(1)
	}
}
