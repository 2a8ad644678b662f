// Package cluster runs a whole diskfit cluster on one machine without Docker:
// embedded etcd, a real kube-apiserver and the controllers that PVC binding,
// StatefulSets and garbage collection need (in this process), the real
// diskfit scheduler and controller, external-resizer and
// snapshot-controller, and per node a kubelet and the real diskfit-csi
// driver, external-provisioner and csi-snapshotter (child processes) on
// loop-mounted disk images.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/test/cluster/controlplane"
)

// NodeSpec describes one simulated node.
type NodeSpec struct {
	Name  string
	Disks []DiskSpec
}

// Options configure a cluster.
type Options struct {
	// RepoRoot is the repository checkout (manifests are read from it).
	RepoRoot string
	// BinDir holds diskfit-csi, diskfit-scheduler and the CSI sidecars
	// that 'make tools' builds: csi-provisioner, csi-resizer,
	// csi-snapshotter and snapshot-controller.
	BinDir string
	// Self is a binary that runs RunKubelet when its first argument is
	// KubeletCommand (the localcluster binary): one kubelet process per node.
	Self string
	// Nodes are the simulated nodes.
	Nodes []NodeSpec
	// LogDir receives the components' logs; empty keeps them with the run's
	// other files, which Stop removes.
	LogDir string
	// CapacityPollInterval is how often external-provisioner refreshes
	// CSIStorageCapacity (its own default is one minute); 0 means 5s.
	CapacityPollInterval time.Duration
}

// Cluster is a running local cluster.
type Cluster struct {
	// Config is an admin client configuration for the API server.
	Config *rest.Config
	// Client is an admin clientset.
	Client kubernetes.Interface
	// Kubeconfig is the path of an admin kubeconfig file.
	Kubeconfig string
	// Dir holds everything of this run: disks, sockets, logs, configs.
	Dir string
	// Nodes are the running nodes, by name.
	Nodes map[string]*Node
	// LogDir holds one log file per component.
	LogDir string

	opts Options
	// Kubeconfigs of the manifests' ServiceAccounts (rbac.go).
	schedulerKubeconfig, controllerKubeconfig, snapshotControllerKubeconfig string

	cp                 *controlplane.ControlPlane
	proxy              *apiProxy
	scheduler          *supervisor
	controller         *supervisor
	resizer            *process
	snapshotController *process
}

// Start brings a cluster up. On error everything started so far is stopped.
func Start(ctx context.Context, opts Options) (c *Cluster, err error) {
	logger := klog.FromContext(ctx)
	if err := SweepLeftovers(); err != nil {
		logger.Error(err, "Sweeping leftovers of earlier runs")
	}
	c = &Cluster{
		opts:  opts,
		Dir:   filepath.Join(BaseDir, strconv.Itoa(os.Getpid())),
		Nodes: map[string]*Node{},
	}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	c.LogDir = opts.LogDir
	if c.LogDir == "" {
		c.LogDir = filepath.Join(c.Dir, "logs")
	}
	if err := os.MkdirAll(c.LogDir, 0o755); err != nil {
		return c, err
	}

	start := time.Now()
	if c.cp, err = controlplane.Start(ctx, c.Dir); err != nil {
		return c, err
	}
	c.Config, c.Client = c.cp.Config, c.cp.Client
	logger.Info("Control plane ready", "elapsed", time.Since(start).Round(time.Millisecond))
	if c.proxy, err = startAPIProxy(c.Config.Host[len("https://"):]); err != nil {
		return c, err
	}
	c.Kubeconfig = filepath.Join(c.Dir, "kubeconfig")
	if err := controlplane.WriteKubeconfig(c.Config, c.Kubeconfig); err != nil {
		return c, err
	}
	for _, dir := range []string{"base/crd", "snapshot/crd"} {
		if err := controlplane.InstallCRDs(ctx, c.Config, filepath.Join(opts.RepoRoot, "manifests", dir)); err != nil {
			return c, err
		}
	}
	if err := c.createCSIDriver(ctx); err != nil {
		return c, err
	}
	if err := applyRBAC(ctx, c); err != nil {
		return c, err
	}
	for sa, path := range map[serviceAccount]*string{
		schedulerAccount:          &c.schedulerKubeconfig,
		controllerAccount:         &c.controllerKubeconfig,
		snapshotControllerAccount: &c.snapshotControllerKubeconfig,
	} {
		if *path, err = c.kubeconfigFor(ctx, sa); err != nil {
			return c, err
		}
	}
	if err := c.startScheduler(); err != nil {
		return c, err
	}
	if err := c.startController(); err != nil {
		return c, err
	}
	for _, spec := range opts.Nodes {
		n, err := c.startNode(ctx, spec)
		if n != nil {
			c.Nodes[spec.Name] = n
		}
		if err != nil {
			return c, fmt.Errorf("node %s: %w", spec.Name, err)
		}
	}
	if err := c.startResizer(ctx); err != nil {
		return c, err
	}
	if err := c.startSnapshotController(ctx); err != nil {
		return c, err
	}
	logger.Info("Cluster ready", "nodes", len(c.Nodes), "elapsed", time.Since(start).Round(time.Millisecond), "kubeconfig", c.Kubeconfig)
	return c, nil
}

// createCSIDriver registers the driver the way the deployment manifests do.
func (c *Cluster) createCSIDriver(ctx context.Context) error {
	driver := &storagev1.CSIDriver{
		ObjectMeta: metav1.ObjectMeta{Name: diskfit.DriverName},
		Spec: storagev1.CSIDriverSpec{
			AttachRequired:  ptr.To(false),
			PodInfoOnMount:  ptr.To(true),
			StorageCapacity: ptr.To(true),
			VolumeLifecycleModes: []storagev1.VolumeLifecycleMode{
				storagev1.VolumeLifecyclePersistent,
			},
		},
	}
	_, err := c.Client.StorageV1().CSIDrivers().Create(ctx, driver, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// startResizer runs one external-resizer for the cluster. Expansion is
// node-only (the kubelet calls NodeExpandVolume on the volume's node), so the
// resizer only needs some driver to learn the capabilities from: the first
// node's. In a real cluster it runs leader-elected in every node's pod.
func (c *Cluster) startResizer(ctx context.Context) error {
	if len(c.opts.Nodes) == 0 {
		return nil
	}
	bin, err := c.binary("csi-resizer")
	if err != nil {
		return err
	}
	first := c.Nodes[c.opts.Nodes[0].Name]
	kubeconfig, err := first.kubeconfig(ctx)
	if err != nil {
		return err
	}
	c.resizer, err = startProcess("csi-resizer", c.LogDir, bin, []string{
		"--csi-address=" + first.Socket,
		"--kubeconfig=" + kubeconfig,
		"--leader-election=false",
		"--timeout=60s",
		"-v=4",
	}, nil)
	return err
}

// startSnapshotController runs snapshot-controller in the distributed mode
// that node-local drivers need (manifests/snapshot) and creates the
// manifests' VolumeSnapshotClass.
func (c *Cluster) startSnapshotController(ctx context.Context) error {
	bin, err := c.binary("snapshot-controller")
	if err != nil {
		return err
	}
	c.snapshotController, err = startProcess("snapshot-controller", c.LogDir, bin, []string{
		"--kubeconfig=" + c.snapshotControllerKubeconfig,
		"--leader-election=false",
		"--enable-distributed-snapshotting",
		"--retry-interval-start=500ms",
		"--retry-interval-max=5s",
		"-v=4",
	}, nil)
	if err != nil {
		return err
	}
	class := schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshotclasses"}
	return createFromFile(ctx, c.Config, class, filepath.Join(c.opts.RepoRoot, "manifests", "snapshot", "volumesnapshotclass.yaml"))
}

// createFromFile creates the cluster-scoped object of resource gvr that file
// holds, unless it exists.
func createFromFile(ctx context.Context, config *rest.Config, gvr schema.GroupVersionResource, file string) error {
	raw, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	obj := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(raw, &obj.Object); err != nil {
		return fmt.Errorf("parsing %s: %w", file, err)
	}
	client, err := dynamic.NewForConfig(config)
	if err != nil {
		return err
	}
	_, err = client.Resource(gvr).Create(ctx, obj, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating %s from %s: %w", gvr.Resource, file, err)
	}
	return nil
}

// SetAPIServerDown starts or ends an API server outage for the diskfit
// components and sidecars (their connections go through a proxy); the
// kubelets, the controllers and the admin kubeconfig keep reaching it.
func (c *Cluster) SetAPIServerDown(down bool) { c.proxy.SetDown(down) }

// Stop ends every component and removes every mount, loop device and file
// of this run.
func (c *Cluster) Stop() {
	for _, n := range c.Nodes {
		n.stop()
	}
	if c.resizer != nil {
		c.resizer.stop(5 * time.Second)
	}
	if c.snapshotController != nil {
		c.snapshotController.stop(5 * time.Second)
	}
	if c.scheduler != nil {
		c.scheduler.stop(10 * time.Second)
	}
	if c.controller != nil {
		c.controller.stop(10 * time.Second)
	}
	if c.proxy != nil {
		c.proxy.close()
	}
	if c.cp != nil {
		c.cp.Stop()
	}
	if err := cleanHostState(c.Dir); err != nil {
		klog.Background().Error(err, "Cleaning up", "dir", c.Dir)
	}
}

// Logs returns the path of a component's log file.
func (c *Cluster) Logs(component string) string {
	return filepath.Join(c.LogDir, component+".log")
}

var errBinaryMissing = errors.New("binary missing; run 'make build tools'")

func (c *Cluster) binary(name string) (string, error) {
	path := filepath.Join(c.opts.BinDir, name)
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("%s: %w", path, errBinaryMissing)
	}
	return path, nil
}
