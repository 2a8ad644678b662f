package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"

	"github.com/diskfit/diskfit/apis/client/clientset/versioned"
	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/test/registrar"
)

// Node is one simulated node: its disks and its driver and provisioner processes.
type Node struct {
	Name string
	// Dir holds the node's disks, sockets and config.
	Dir string
	// Disks are the node's mounted disks, by name.
	Disks map[string]*disk
	// Socket is the driver's CSI endpoint.
	Socket string
	// KubeletDir is the node's kubelet root directory.
	KubeletDir string

	cluster     *Cluster
	kubelet     *process
	driver      *process
	provisioner *process
	snapshotter *process
	registrar   *registrar.Registrar
}

// DiskPath returns where the named disk is mounted on the host.
func (n *Node) DiskPath(name string) string { return n.Disks[name].Path }

func (c *Cluster) startNode(ctx context.Context, spec NodeSpec) (n *Node, err error) {
	n = &Node{
		Name:    spec.Name,
		Dir:     filepath.Join(c.Dir, "nodes", spec.Name),
		Disks:   map[string]*disk{},
		cluster: c,
	}
	n.Socket = filepath.Join(n.Dir, "csi.sock")
	n.KubeletDir = filepath.Join(n.Dir, "kubelet")
	if err := os.MkdirAll(n.KubeletDir, 0o750); err != nil {
		return n, err
	}
	for _, ds := range spec.Disks {
		d, err := makeDisk(ds, filepath.Join(n.Dir, "disks", ds.Name))
		if d != nil && d.loop != "" {
			n.Disks[ds.Name] = d
		}
		if err != nil {
			return n, fmt.Errorf("disk %s: %w", ds.Name, err)
		}
	}
	if err := n.startKubelet(ctx); err != nil {
		return n, err
	}
	if err := n.startDriver(ctx); err != nil {
		return n, err
	}
	if err := n.waitForDiskNode(ctx); err != nil {
		return n, err
	}
	// The kubelet and the driver run on the host: both see the socket at
	// the same path.
	registry := filepath.Join(n.KubeletDir, "plugins_registry")
	if err := os.MkdirAll(registry, 0o750); err != nil {
		return n, err
	}
	if n.registrar, err = registrar.Start(ctx, registrar.Config{
		CSIAddress:              n.Socket,
		KubeletRegistrationPath: n.Socket,
		PluginRegistrationDir:   registry,
	}); err != nil {
		return n, err
	}
	if err := n.waitForCSINode(ctx); err != nil {
		return n, err
	}
	if err := n.startProvisioner(ctx); err != nil {
		return n, err
	}
	if err := n.startSnapshotter(ctx); err != nil {
		return n, err
	}
	return n, nil
}

// writeConfig writes the driver's node config listing the node's disks.
func (n *Node) writeConfig() (string, error) {
	type diskConfig struct {
		Name        string `json:"name"`
		Backend     string `json:"backend"`
		DeviceClass string `json:"deviceClass,omitempty"`
		Path        string `json:"path"`
	}
	var cfg struct {
		Disks []diskConfig `json:"disks"`
	}
	for _, d := range n.Disks {
		cfg.Disks = append(cfg.Disks, diskConfig{Name: d.Name, Backend: "file", DeviceClass: d.DeviceClass, Path: d.Path})
	}
	raw, err := yaml.Marshal(cfg)
	if err != nil {
		return "", err
	}
	path := filepath.Join(n.Dir, "node.yaml")
	return path, os.WriteFile(path, raw, 0o644)
}

func (n *Node) startDriver(ctx context.Context) error {
	bin, err := n.cluster.binary("diskfit-csi")
	if err != nil {
		return err
	}
	kubeconfig, err := n.kubeconfig(ctx)
	if err != nil {
		return err
	}
	cfg, err := n.writeConfig()
	if err != nil {
		return err
	}
	n.driver, err = startProcess("diskfit-csi-"+n.Name, n.cluster.LogDir, bin, []string{
		"--endpoint=unix://" + n.Socket,
		"--node-id=" + n.Name,
		"--config=" + cfg,
		"--kubeconfig=" + kubeconfig,
		"--kubelet-dir=" + n.KubeletDir,
		"--disknode-resync=5s",
		// Short, so that the e2e suite sees several orphan sweeps (every
		// 10s) in a test.
		"--orphan-grace-period=20s",
		"-v=4",
	}, nil)
	return err
}

// RestartDriver kills the node's driver as a crash would and starts it again.
func (n *Node) RestartDriver() error {
	n.driver.kill()
	return n.startDriver(context.Background())
}

// kubeconfig is the node's driver pod's: the driver's and its sidecars'
// token is bound to the Node, as a DaemonSet pod's is bound to its pod on
// the node, and carries the node's name, which the manifests' admission
// policies check.
func (n *Node) kubeconfig(ctx context.Context) (string, error) {
	return n.cluster.kubeconfigForNode(ctx, nodeAccount, n.Name)
}

func (n *Node) startProvisioner(ctx context.Context) error {
	bin, err := n.cluster.binary("csi-provisioner")
	if err != nil {
		return err
	}
	kubeconfig, err := n.kubeconfig(ctx)
	if err != nil {
		return err
	}
	n.provisioner, err = startProcess("csi-provisioner-"+n.Name, n.cluster.LogDir, bin, []string{
		"--csi-address=" + n.Socket,
		"--kubeconfig=" + kubeconfig,
		"--node-deployment",
		"--node-deployment-immediate-binding=false",
		"--extra-create-metadata",
		"--enable-capacity",
		// No pod owns the CSIStorageCapacity objects here.
		"--capacity-ownerref-level=-1",
		"--capacity-poll-interval=" + n.cluster.capacityPollInterval().String(),
		"--retry-interval-start=500ms",
		"--retry-interval-max=5s",
		"--timeout=60s",
		"-v=4",
	}, []string{"NODE_NAME=" + n.Name, "NAMESPACE=" + nodeAccount.namespace})
	return err
}

// startSnapshotter runs csi-snapshotter for the node's own volumes: with
// --node-deployment it only takes VolumeSnapshotContents that the
// snapshot-controller labelled with this node.
func (n *Node) startSnapshotter(ctx context.Context) error {
	bin, err := n.cluster.binary("csi-snapshotter")
	if err != nil {
		return err
	}
	kubeconfig, err := n.kubeconfig(ctx)
	if err != nil {
		return err
	}
	n.snapshotter, err = startProcess("csi-snapshotter-"+n.Name, n.cluster.LogDir, bin, []string{
		"--csi-address=" + n.Socket,
		"--kubeconfig=" + kubeconfig,
		"--node-deployment",
		"--leader-election=false",
		"--extra-create-metadata",
		"--retry-interval-start=500ms",
		"--retry-interval-max=5s",
		"--timeout=60s",
		"-v=4",
	}, []string{"NODE_NAME=" + n.Name})
	return err
}

// waitForDiskNode waits until the driver has published the node's disks.
func (n *Node) waitForDiskNode(ctx context.Context) error {
	client, err := versioned.NewForConfig(n.cluster.Config)
	if err != nil {
		return err
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		if n.driver.exited() {
			return false, n.driver.failure()
		}
		dn, err := client.DiskfitV1alpha1().DiskNodes().Get(ctx, n.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil && len(dn.Status.Disks) == len(n.Disks), err
	})
	if err != nil {
		return fmt.Errorf("waiting for DiskNode %s: %w", n.Name, err)
	}
	return nil
}

// startKubelet runs the node's kubelet (RunKubelet) in a child process and
// waits until it has registered the Node and reports it Ready.
func (n *Node) startKubelet(ctx context.Context) error {
	var err error
	n.kubelet, err = startProcess("kubelet-"+n.Name, n.cluster.LogDir, n.cluster.opts.Self, []string{
		KubeletCommand, "--node=" + n.Name, "--root-dir=" + n.KubeletDir, "--kubeconfig=" + n.cluster.Kubeconfig,
	}, nil)
	if err != nil {
		return err
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		if n.kubelet.exited() {
			return false, n.kubelet.failure()
		}
		node, err := n.cluster.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		for _, c := range node.Status.Conditions {
			if c.Type == v1.NodeReady {
				return c.Status == v1.ConditionTrue, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for kubelet to register node %s: %w", n.Name, err)
	}
	return nil
}

// waitForCSINode waits until the kubelet has registered the driver: the
// CSINode lists it and the Node carries its topology label.
func (n *Node) waitForCSINode(ctx context.Context) error {
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		csiNode, err := n.cluster.Client.StorageV1().CSINodes().Get(ctx, n.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		registered := false
		for _, d := range csiNode.Spec.Drivers {
			registered = registered || d.Name == diskfit.DriverName
		}
		if !registered {
			return false, nil
		}
		node, err := n.cluster.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		return err == nil && node.Labels[diskfit.TopologyKey] == n.Name, err
	})
	if err != nil {
		return fmt.Errorf("waiting for the kubelet to register the driver on %s: %w", n.Name, err)
	}
	return nil
}

func (c *Cluster) capacityPollInterval() time.Duration {
	if c.opts.CapacityPollInterval > 0 {
		return c.opts.CapacityPollInterval
	}
	return 5 * time.Second
}

func (n *Node) stop() {
	if n.snapshotter != nil {
		n.snapshotter.stop(5 * time.Second)
	}
	if n.provisioner != nil {
		n.provisioner.stop(5 * time.Second)
	}
	if n.kubelet != nil {
		n.kubelet.stop(10 * time.Second)
	}
	if n.registrar != nil {
		n.registrar.Stop()
	}
	if n.driver != nil {
		n.driver.stop(10 * time.Second)
	}
}
