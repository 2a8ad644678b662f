// Package kubeminor runs diskfit-scheduler against a real kube-apiserver of
// the Kubernetes minor both are built from. `make test` runs it for the
// newest supported minor; `make test-kube-minors` builds it, with the
// plugin's unit tests, for each older one (hack/kube-minor.sh;
// docs/kubernetes-versions.md).
package kubeminor

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	apiruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2/ktesting"
	schedapp "k8s.io/kubernetes/cmd/kube-scheduler/app"
	"k8s.io/kubernetes/cmd/kube-scheduler/app/options"
	"k8s.io/utils/ptr"

	"github.com/diskfit/diskfit/apis/client/clientset/versioned"
	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
	"github.com/diskfit/diskfit/scheduler-plugin/app"
	"github.com/diskfit/diskfit/test/cluster/controlplane"
)

const gi = int64(1) << 30

// root is the repository's root, from this package's directory (where go
// test runs it).
const root = "../.."

// TestPodWithSeveralClaimsIsPlacedOnItsDisks: on the API server of this
// minor, diskfit-scheduler (the shipped configuration, run in this
// process) places a pod with three claims on the only node whose disks can
// each hold what they are given, although another node's free space adds
// up to more; every claim is written once with its node and disk together,
// and the pod is bound once its volumes are.
func TestPodWithSeveralClaimsIsPlacedOnItsDisks(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)

	dir := t.TempDir()
	cp, err := controlplane.Start(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	// Cleanups run last first: the scheduler stops before the API server.
	t.Cleanup(cp.Stop)
	if err := controlplane.InstallCRDs(ctx, cp.Config, filepath.Join(root, "manifests", "base", "crd")); err != nil {
		t.Fatal(err)
	}
	kube := cp.Client
	// Custom resources have no protobuf encoding.
	jsonConfig := rest.CopyConfig(cp.Config)
	jsonConfig.ContentType = apiruntime.ContentTypeJSON
	dn, err := versioned.NewForConfig(jsonConfig)
	if err != nil {
		t.Fatal(err)
	}

	// n1's disks hold 9+1 and 3 GiB; n2 has 16 GiB free in all but no
	// disk for 9 GiB.
	disks := map[string]map[string]int64{
		"n1": {"d0": 10 * gi, "d1": 4 * gi},
		"n2": {"d0": 8 * gi, "d1": 8 * gi},
	}
	for node, free := range disks {
		if err := createNode(ctx, kube, dn, node, free); err != nil {
			t.Fatal(err)
		}
	}
	class := &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: "diskfit"},
		Provisioner:       diskfit.DriverName,
		VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer),
	}
	if _, err := kube.StorageV1().StorageClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "app"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// Every change of the claims, from before the scheduler starts.
	claims := kube.CoreV1().PersistentVolumeClaims("app")
	w, err := claims.Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	firstPlaced := map[string]*v1.PersistentVolumeClaim{}
	sizes := map[string]int64{"data-0": 9 * gi, "data-1": 3 * gi, "data-2": 1 * gi}
	provisionErrs := make(chan error, len(sizes))
	var watching sync.WaitGroup
	watching.Go(func() {
		for ev := range w.ResultChan() {
			pvc, ok := ev.Object.(*v1.PersistentVolumeClaim)
			if !ok || ev.Type != watch.Modified || pvc.Annotations[diskfit.SelectedNodeAnnotation] == "" {
				continue
			}
			if _, seen := firstPlaced[pvc.Name]; seen {
				continue
			}
			firstPlaced[pvc.Name] = pvc
			// As external-provisioner would: the PV on the selected node,
			// bound to the claim; the PV controller completes the binding.
			if err := provision(ctx, kube, pvc); err != nil {
				provisionErrs <- err
			}
		}
	})

	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "app-0", Namespace: "app"},
		Spec: v1.PodSpec{
			SchedulerName: diskfit.SchedulerName,
			Containers:    []v1.Container{{Name: "app", Image: "app"}},
		},
	}
	for name, size := range sizes {
		pvc := &v1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "app"},
			Spec: v1.PersistentVolumeClaimSpec{
				StorageClassName: ptr.To("diskfit"),
				AccessModes:      []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
				Resources:        v1.VolumeResourceRequirements{Requests: v1.ResourceList{v1.ResourceStorage: *resource.NewQuantity(size, resource.BinarySI)}},
			},
		}
		if _, err := claims.Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pod.Spec.Volumes = append(pod.Spec.Volumes, v1.Volume{Name: name, VolumeSource: v1.VolumeSource{
			PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: name},
		}})
	}
	if _, err := kube.CoreV1().Pods("app").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	startScheduler(t, ctx, cp, dir)

	var bound *v1.Pod
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		select {
		case err := <-provisionErrs:
			return false, err
		default:
		}
		bound, err = kube.CoreV1().Pods("app").Get(ctx, pod.Name, metav1.GetOptions{})
		return err == nil && bound.Spec.NodeName != "", err
	})
	if err != nil {
		t.Fatalf("pod not bound: %v", err)
	}
	w.Stop()
	watching.Wait()
	if bound.Spec.NodeName != "n1" {
		t.Fatalf("pod bound to %s, want n1 (only n1 has a disk for 9Gi)", bound.Spec.NodeName)
	}
	used := map[string]int64{}
	for name, size := range sizes {
		pvc := firstPlaced[name]
		if pvc == nil {
			t.Fatalf("claim %s was never given a node", name)
		}
		node, disk := pvc.Annotations[diskfit.SelectedNodeAnnotation], pvc.Annotations[diskfit.SelectedDiskAnnotation]
		if node != "n1" || disk == "" {
			t.Errorf("claim %s: the write that placed it says node %q disk %q, want n1 and its disk", name, node, disk)
		}
		used[disk] += size
	}
	for disk, bytes := range used {
		if free, ok := disks["n1"][disk]; !ok || bytes > free {
			t.Errorf("disk %s of n1 was given %d GiB, it has %d GiB free", disk, bytes/gi, free/gi)
		}
	}
}

// startScheduler runs diskfit-scheduler in this process with the shipped
// configuration, as kube-scheduler's command would, until the test ends.
func startScheduler(t *testing.T, ctx context.Context, cp *controlplane.ControlPlane, dir string) {
	ctx, cancel := context.WithCancel(ctx)
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := controlplane.WriteKubeconfig(cp.Config, kubeconfig); err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(dir, "scheduler-config.yaml")
	if err := controlplane.WriteSchedulerConfig(config, root, kubeconfig); err != nil {
		t.Fatal(err)
	}
	opts := options.NewOptions()
	opts.ConfigFile = config
	opts.SecureServing.BindPort = 0 // no HTTPS endpoint
	cc, sched, err := schedapp.Setup(ctx, opts, app.Options()...)
	if err != nil {
		t.Fatalf("setting up diskfit-scheduler: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- schedapp.Run(ctx, cc, sched) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("diskfit-scheduler did not stop")
		}
	})
}

// createNode creates a ready node with its DiskNode, whose disks are
// healthy and have the given free space, as the node plugin reports them.
func createNode(ctx context.Context, kube kubernetes.Interface, dn versioned.Interface, name string, free map[string]int64) error {
	if err := controlplane.CreateReadyNode(ctx, kube, name); err != nil {
		return err
	}
	d, err := dn.DiskfitV1alpha1().DiskNodes().Create(ctx, &v1alpha1.DiskNode{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating DiskNode %s: %w", name, err)
	}
	for disk, bytes := range free {
		d.Status.Disks = append(d.Status.Disks, v1alpha1.DiskStatus{
			Name: disk, Backend: v1alpha1.BackendFile, CapacityBytes: bytes, FreeBytes: bytes, Healthy: true,
		})
	}
	d.Status.ObservedTime = metav1.Now()
	d.Status.Summarize()
	if _, err := dn.DiskfitV1alpha1().DiskNodes().UpdateStatus(ctx, d, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("reporting disks of DiskNode %s: %w", name, err)
	}
	return nil
}

// provision creates the claim's PV on its selected node and disk, bound to
// the claim, as external-provisioner does with the driver's answer.
func provision(ctx context.Context, kube kubernetes.Interface, pvc *v1.PersistentVolumeClaim) error {
	node := pvc.Annotations[diskfit.SelectedNodeAnnotation]
	pv := &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{
			Name:        "pvc-" + string(pvc.UID),
			Annotations: map[string]string{"pv.kubernetes.io/provisioned-by": diskfit.DriverName},
		},
		Spec: v1.PersistentVolumeSpec{
			Capacity:                      pvc.Spec.Resources.Requests,
			AccessModes:                   pvc.Spec.AccessModes,
			PersistentVolumeReclaimPolicy: v1.PersistentVolumeReclaimDelete,
			StorageClassName:              *pvc.Spec.StorageClassName,
			PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{
				Driver:           diskfit.DriverName,
				VolumeHandle:     pvc.Annotations[diskfit.SelectedDiskAnnotation] + ":" + pvc.Name,
				VolumeAttributes: map[string]string{diskfit.VolumeContextDiskKey: pvc.Annotations[diskfit.SelectedDiskAnnotation]},
			}},
			ClaimRef: &v1.ObjectReference{
				Kind: "PersistentVolumeClaim", APIVersion: "v1",
				Namespace: pvc.Namespace, Name: pvc.Name, UID: pvc.UID,
			},
			NodeAffinity: &v1.VolumeNodeAffinity{Required: &v1.NodeSelector{
				NodeSelectorTerms: []v1.NodeSelectorTerm{{MatchExpressions: []v1.NodeSelectorRequirement{{
					Key: diskfit.TopologyKey, Operator: v1.NodeSelectorOpIn, Values: []string{node},
				}}}},
			}},
		},
	}
	if _, err := kube.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("provisioning %s: %w", pvc.Name, err)
	}
	return nil
}
