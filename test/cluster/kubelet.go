package cluster

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	remote "k8s.io/cri-client/pkg"
	"k8s.io/cri-client/pkg/fake"
	kubeletapp "k8s.io/kubernetes/cmd/kubelet/app"
	"k8s.io/kubernetes/cmd/kubelet/app/options"
	"k8s.io/kubernetes/pkg/kubelet/cadvisor/testing"
	"k8s.io/kubernetes/pkg/kubelet/cm"
	"k8s.io/kubernetes/pkg/kubemark"
	"k8s.io/kubernetes/pkg/volume/util/hostutil"
	"k8s.io/mount-utils"
)

// KubeletCommand is the argument that makes the localcluster binary run one
// node's kubelet (RunKubelet) instead of a cluster. The kubelet keeps
// package-level state and registers metrics once per process, so each node's
// kubelet runs in a process of its own.
const KubeletCommand = "kubelet"

// RunKubelet runs the kubelet's own code for one node, with a fake container
// runtime (no containers run) but the real volume manager, CSI volume plugin
// and mounter, until ctx ends. args are the flags the cluster passes.
func RunKubelet(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet(KubeletCommand, flag.ContinueOnError)
	node := fs.String("node", "", "node name")
	root := fs.String("root-dir", "", "kubelet root directory")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *node == "" || *root == "" || *kubeconfig == "" {
		return errors.New("kubelet needs --node, --root-dir and --kubeconfig")
	}
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return err
	}
	config.UserAgent = "kubelet/" + *node
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return err
	}
	heartbeat := *config
	heartbeat.Timeout = 10 * time.Second
	heartbeatClient, err := kubernetes.NewForConfig(&heartbeat)
	if err != nil {
		return err
	}

	flags, cfg := kubemark.GetHollowKubeletConfig(&kubemark.HollowKubeletOptions{NodeName: *node, MaxPods: 110})
	// GetHollowKubeletConfig always makes a directory in the system temp
	// dir; everything of this node lives under root instead.
	_ = os.RemoveAll(flags.RootDirectory)
	flags.RootDirectory = *root
	cfg.StaticPodPath = filepath.Join(*root, "static-pods")
	cfg.PodLogsDir = filepath.Join(*root, "pod-logs")
	for _, dir := range []string{cfg.StaticPodPath, cfg.PodLogsDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return err
		}
	}
	cfg.EnableServer = false
	cfg.ReadOnlyPort = 0
	cfg.FailCgroupV1 = false
	// NodeGetVolumeStats shows up in the kubelet's metrics this often.
	cfg.VolumeStatsAggPeriod.Duration = 10 * time.Second
	cfg.NodeStatusUpdateFrequency.Duration = 5 * time.Second
	cfg.SyncFrequency.Duration = 5 * time.Second

	runtimeEndpoint := "unix://" + filepath.Join(*root, "cri.sock")
	runtime := fake.NewFakeRemoteRuntime()
	if err := runtime.Start(runtimeEndpoint); err != nil {
		return fmt.Errorf("fake container runtime: %w", err)
	}
	defer runtime.Stop()
	runtimeService, err := remote.NewRemoteRuntimeServiceBuilder().WithEndpoint(runtimeEndpoint).WithConnectionTimeout(15 * time.Second).Build(ctx)
	if err != nil {
		return err
	}

	hollow := kubemark.NewHollowKubelet(flags, cfg, client, heartbeatClient, &testing.Fake{NodeName: *node},
		runtime.ImageService, runtimeService, cm.NewStubContainerManager())
	// The real mounter: the CSI volume plugin then stages, publishes and
	// unpublishes for real through the driver.
	hollow.KubeletDeps.Mounter = mount.New("")
	hollow.KubeletDeps.HostUtil = hostutil.NewHostUtil()
	if err := kubeletapp.RunKubelet(ctx, &options.KubeletServer{
		KubeletFlags:         *hollow.KubeletFlags,
		KubeletConfiguration: *hollow.KubeletConfiguration,
	}, hollow.KubeletDeps); err != nil {
		return fmt.Errorf("running kubelet: %w", err)
	}
	<-ctx.Done()
	return nil
}
