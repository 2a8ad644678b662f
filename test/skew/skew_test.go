// Package skew checks that diskfit's one build of the driver, the
// controller and the CLI (client-go of the newest supported minor) works
// against the API server of every older supported minor. Only
// diskfit-scheduler is built per minor (docs/kubernetes-versions.md).
package skew

import (
	"context"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	apiruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/diskfit/diskfit/apis/client/clientset/versioned"
	dfinformers "github.com/diskfit/diskfit/apis/client/informers/externalversions"
	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
	"github.com/diskfit/diskfit/csi-driver/kube"
	"github.com/diskfit/diskfit/csi-driver/lifecycle"
	"github.com/diskfit/diskfit/test/cluster/controlplane"
)

var controlPlane = flag.String("controlplane", "", "a test/cmd/controlplane binary built for an older Kubernetes minor (make test-kube-minors passes it)")

const gi = int64(1) << 30

// root is the repository's root, from this package's directory (where go
// test runs it).
const root = "../.."

// startControlPlane runs the -controlplane binary until the test ends and
// returns an administrator's client configuration.
func startControlPlane(t *testing.T) *rest.Config {
	if *controlPlane == "" {
		t.Skip("needs -controlplane, the API server of an older Kubernetes minor: make test-kube-minors builds one per minor and runs this test against it")
	}
	dir := t.TempDir()
	log, err := os.Create(filepath.Join(dir, "controlplane.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(*controlPlane, "-dir", dir, "-crds", filepath.Join(root, "manifests", "base", "crd"))
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(time.Minute):
			_ = cmd.Process.Kill()
			t.Error("the control plane did not stop within a minute")
		}
		log.Close()
	})
	kubeconfig := filepath.Join(dir, "kubeconfig")
	deadline := time.After(3 * time.Minute)
	for {
		if _, err := os.Stat(kubeconfig); err == nil {
			break
		}
		select {
		case err := <-exited:
			raw, _ := os.ReadFile(log.Name())
			t.Fatalf("the control plane exited (%v):\n%s", err, tail(string(raw), 40))
		case <-deadline:
			t.Fatal("the control plane was not ready within 3 minutes")
		case <-time.After(200 * time.Millisecond):
		}
	}
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	return config
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// TestNewestClientsOnAnOlderAPIServer: against an older minor's API server,
// the driver's API side publishes its DiskNode (owned by the Node) and
// reads its spec and the node's labels, the CLI reports the disks, and
// diskfit-controller's informers sync and it releases the opted-in claim
// of a node that is gone (PV finalizer patch and deletes).
func TestNewestClientsOnAnOlderAPIServer(t *testing.T) {
	config := startControlPlane(t)
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	kubeClient, err := kubernetes.NewForConfig(config)
	if err != nil {
		t.Fatal(err)
	}
	version, err := kubeClient.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("API server reports %s (emulating %s.%s)", version.GitVersion, version.Major, version.Minor)
	// Custom resources have no protobuf encoding.
	jsonConfig := rest.CopyConfig(config)
	jsonConfig.ContentType = apiruntime.ContentTypeJSON
	df, err := versioned.NewForConfig(jsonConfig)
	if err != nil {
		t.Fatal(err)
	}

	// The driver's side: its DiskNode, created owned by the Node.
	if err := controlplane.CreateReadyNode(ctx, kubeClient, "n1"); err != nil {
		t.Fatal(err)
	}
	publisher := kube.DiskNodePublisher{Kube: kubeClient, DiskFit: df, NodeName: "n1"}
	status := &v1alpha1.DiskNodeStatus{
		ObservedTime: metav1.Now(),
		Disks:        []v1alpha1.DiskStatus{{Name: "d0", Backend: v1alpha1.BackendFile, CapacityBytes: 10 * gi, FreeBytes: 7 * gi, Healthy: true}},
	}
	status.Summarize()
	if err := publisher.Publish(ctx, status); err != nil {
		t.Fatalf("publishing the DiskNode: %v", err)
	}
	dn, err := df.DiskfitV1alpha1().DiskNodes().Get(ctx, "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(dn.OwnerReferences) != 0 || len(dn.Status.Disks) != 1 || dn.Status.Disks[0].FreeBytes != 7*gi {
		t.Errorf("DiskNode as published: owners %v, disks %+v", dn.OwnerReferences, dn.Status.Disks)
	}
	if _, err := publisher.Spec(ctx); err != nil {
		t.Errorf("reading the DiskNode's spec: %v", err)
	}
	labels, err := kube.NodeLabels{Client: kubeClient, NodeName: "n1"}.Get(ctx)
	if err != nil || labels[diskfit.TopologyKey] != "n1" {
		t.Errorf("node labels %v, %v", labels, err)
	}

	// The CLI, as an admin runs it.
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := controlplane.WriteKubeconfig(config, kubeconfig); err != nil {
		t.Fatal(err)
	}
	cli := filepath.Join(dir, "diskfit")
	build := exec.Command("go", "build", "-o", cli, "./cmd/diskfit")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the CLI: %v\n%s", err, out)
	}
	out, err := exec.Command(cli, "--kubeconfig", kubeconfig, "status").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "n1") || !strings.Contains(string(out), "d0") {
		t.Errorf("diskfit status: %v\n%s", err, out)
	}

	// diskfit-controller: a claim that opted in to release when its node
	// is deleted, on a node that is gone.
	if _, err := kubeClient.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "app"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	class := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "diskfit"}, Provisioner: diskfit.DriverName,
		VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer)}
	if _, err := kubeClient.StorageV1().StorageClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pvc, err := kubeClient.CoreV1().PersistentVolumeClaims("app").Create(ctx, &v1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "data-0", Annotations: map[string]string{diskfit.ReleaseOnNodeDeletionAnnotation: "true"}},
		Spec: v1.PersistentVolumeClaimSpec{
			StorageClassName: &class.Name,
			AccessModes:      []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			Resources:        v1.VolumeResourceRequirements{Requests: v1.ResourceList{v1.ResourceStorage: *resource.NewQuantity(gi, resource.BinarySI)}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pv := &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "pv-data-0"},
		Spec: v1.PersistentVolumeSpec{
			Capacity:                      pvc.Spec.Resources.Requests,
			AccessModes:                   pvc.Spec.AccessModes,
			PersistentVolumeReclaimPolicy: v1.PersistentVolumeReclaimDelete,
			StorageClassName:              class.Name,
			ClaimRef:                      &v1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: "app", Name: pvc.Name, UID: pvc.UID},
			PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{
				Driver: diskfit.DriverName, VolumeHandle: "d0:data-0", VolumeAttributes: map[string]string{diskfit.VolumeContextDiskKey: "d0"},
			}},
			NodeAffinity: &v1.VolumeNodeAffinity{Required: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
				MatchExpressions: []v1.NodeSelectorRequirement{{Key: diskfit.TopologyKey, Operator: v1.NodeSelectorOpIn, Values: []string{"gone"}}},
			}}}},
		},
	}
	if _, err := kubeClient.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The older PV controller binds the two.
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		got, err := kubeClient.CoreV1().PersistentVolumeClaims("app").Get(ctx, pvc.Name, metav1.GetOptions{})
		return err == nil && got.Status.Phase == v1.ClaimBound, err
	})
	if err != nil {
		t.Fatalf("claim not bound: %v", err)
	}

	factory := informers.NewSharedInformerFactory(kubeClient, 0)
	dfFactory := dfinformers.NewSharedInformerFactory(df, 0)
	controller, err := lifecycle.New(kubeClient, df, factory, dfFactory, events.NewFakeRecorder(100), lifecycle.Options{
		NodeLossGrace: time.Second, DiskFailureGrace: time.Minute, StatusMaxAge: time.Minute, Interval: 500 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	factory.Start(ctx.Done())
	dfFactory.Start(ctx.Done())
	done := make(chan error, 1)
	go func() { done <- controller.Run(ctx) }()
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := kubeClient.CoreV1().PersistentVolumeClaims("app").Get(ctx, pvc.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	})
	if err != nil {
		t.Fatalf("the claim of the gone node was not released: %v", err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("controller: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Error("the controller did not stop")
	}
}
