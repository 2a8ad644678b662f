// Command diskfit-csi is the diskfit CSI driver: one per node, serving the
// Identity, Controller and Node services on one unix socket, with
// external-provisioner beside it in --node-deployment mode.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/diskfit/diskfit/apis/client/clientset/versioned"
	"github.com/diskfit/diskfit/cmd/internal/command"
	"github.com/diskfit/diskfit/csi-driver/config"
	"github.com/diskfit/diskfit/csi-driver/driver"
	"github.com/diskfit/diskfit/csi-driver/fault"
	"github.com/diskfit/diskfit/csi-driver/kube"
)

type options struct {
	endpoint       string
	nodeID         string
	configPath     string
	kubeconfig     string
	kubeletDir     string
	lockDir        string
	metricsAddress string
	resync         time.Duration
	orphanGrace    time.Duration
	reload         time.Duration
	diskTimeout    time.Duration
}

func main() {
	o := options{}
	fs := pflag.NewFlagSet("diskfit-csi", pflag.ExitOnError)
	fs.StringVar(&o.endpoint, "endpoint", "unix:///csi/csi.sock", "CSI endpoint (unix socket)")
	fs.StringVar(&o.nodeID, "node-id", os.Getenv("NODE_NAME"), "this node's name (default $NODE_NAME)")
	fs.StringVar(&o.configPath, "config", "/etc/diskfit/node.yaml", "node config file listing the node's disks")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file; empty means in-cluster config")
	fs.StringVar(&o.kubeletDir, "kubelet-dir", "/var/lib/kubelet", "kubelet root directory; stage and publish paths must be below it")
	fs.StringVar(&o.lockDir, "lock-dir", "/run/lock/diskfit",
		"host directory for the locks that make one driver at a time serve each lvm disk; every diskfit driver on the node (a terminating pod and its replacement, a second installation) must see the same directory")
	fs.StringVar(&o.metricsAddress, "metrics-address", "", "address to serve /metrics on (e.g. :9808); empty disables it")
	fs.DurationVar(&o.resync, "disknode-resync", 30*time.Second, "how often the DiskNode status is refreshed")
	fs.DurationVar(&o.orphanGrace, "orphan-grace-period", 10*time.Minute,
		"remove a volume that never had a PersistentVolume (a snapshot that never had a VolumeSnapshotContent) once it has been without one this long; 0 removes nothing. Whatever once had one is never removed by the driver")
	fs.DurationVar(&o.reload, "config-reload-interval", 10*time.Second,
		"how often the node config file and the mounts below its discover paths are read again; new disks and changed reserves and device classes apply live")
	fs.DurationVar(&o.diskTimeout, "disk-status-timeout", driver.DefaultDiskStatusTimeout,
		"how long each disk may take to answer a DiskNode refresh (and the health and space checks of CSI calls); a disk that does not answer in time, its device hanging, is reported unhealthy and the other disks are published on time")
	command.Run("diskfit-csi", fs, func(ctx context.Context) error { return run(ctx, o) })
}

func run(ctx context.Context, o options) error {
	// Crash tests only: see package fault.
	faults, err := fault.FromEnv()
	if err != nil {
		return err
	}
	if faults != nil {
		klog.FromContext(ctx).Info("WARNING: test-only fault injection is on, the driver will kill itself", "env", fault.EnvVar, "step", faults.Step())
	}
	restCfg, err := restConfig(o.kubeconfig)
	if err != nil {
		return err
	}
	kc, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("creating Kubernetes client: %w", err)
	}
	dc, err := versioned.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("creating DiskNode client: %w", err)
	}
	src := &config.Source{Path: o.configPath, NodeName: o.nodeID, Labels: kube.NodeLabels{Client: kc, NodeName: o.nodeID}.Get}
	nodeCfg, err := src.Load(ctx)
	var noDisks error
	if errors.Is(err, config.ErrNoSection) {
		// Not a crash loop: the driver runs without disks, says why, and
		// takes the config once a section selects the node.
		klog.FromContext(ctx).Error(err, "This node has no disks until the node config selects it")
		nodeCfg, noDisks = &config.NodeConfig{}, err
	} else if err != nil {
		return err
	}
	events := kube.NewDiskNodeEvents(ctx, kc, dc, o.nodeID)
	defer events.Shutdown()
	if noDisks != nil {
		events.Event(ctx, corev1.EventTypeWarning, driver.ReasonInvalidConfig, noDisks.Error())
	}
	diskNode := kube.DiskNodePublisher{Kube: kc, DiskFit: dc, NodeName: o.nodeID}
	cfg := driver.Config{
		Endpoint:          o.endpoint,
		NodeID:            o.nodeID,
		Node:              nodeCfg,
		KubeletDir:        o.kubeletDir,
		LockDir:           o.lockDir,
		MetricsAddress:    o.metricsAddress,
		StatusInterval:    o.resync,
		DiskStatusTimeout: o.diskTimeout,
		PVCs:              kube.PVCGetter{Client: kc},
		Status:            diskNode,
		Spec:              diskNode,
		OrphanGracePeriod: o.orphanGrace,
		Faults:            faults,
		Source:            src,
		ReloadInterval:    o.reload,
		Events:            events,
		NoDisksReason:     noDisks,
	}
	// The PV and VolumeSnapshotContent informers stop (Shutdown and Wait
	// wait for them) when run returns, whyever it does.
	factory := informers.NewSharedInformerFactory(kc, 0)
	defer factory.Shutdown()
	var contents sync.WaitGroup
	defer contents.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	dyn, err := dynamic.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("creating dynamic client: %w", err)
	}
	orphans, err := kube.NewOrphanFinder(kc, dyn, factory, o.nodeID)
	if err != nil {
		return err
	}
	cfg.Orphans = orphans
	d, err := driver.New(cfg)
	if err != nil {
		return err
	}
	if err := orphans.OnVolumeHandle(func(handle string) { d.VolumeReferenced(ctx, handle) }); err != nil {
		return err
	}
	if err := orphans.OnSnapshotHandle(func(handle string) { d.SnapshotReferenced(ctx, handle) }); err != nil {
		return err
	}
	factory.Start(ctx.Done())
	contents.Go(func() { orphans.RunContentInformer(ctx) })
	return d.Run(ctx)
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("in-cluster config (pass --kubeconfig outside a cluster): %w", err)
		}
		return cfg, nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig: %w", err)
	}
	return cfg, nil
}
