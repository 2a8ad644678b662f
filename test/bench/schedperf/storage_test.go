package schedperf

import (
	"context"
	"fmt"
	"hash/fnv"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	perf "k8s.io/kubernetes/test/integration/scheduler_perf"
	"k8s.io/kubernetes/test/utils/client-go/ktesting"

	"github.com/diskfit/diskfit/apis/client/clientset/versioned"
	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
	"github.com/diskfit/diskfit/scheduler-plugin/app"
	diskfitplugin "github.com/diskfit/diskfit/scheduler-plugin/diskfit"
	"github.com/diskfit/diskfit/test/cluster/controlplane"
)

const (
	// crdDir holds the DiskNode CRD, relative to this package.
	crdDir = "../../../manifests/base/crd"
	// disksPerNode and diskBytes shape every node: large enough that no
	// workload fills a disk, so every pod is placed on its first attempt.
	disksPerNode = 4
	diskBytes    = int64(1) << 40
	// parallelism of the object creation and binding done here.
	workers = 16
	// Annotations the PV controller sets on a claim it binds.
	annBindCompleted      = "pv.kubernetes.io/bind-completed"
	annBoundByController  = "pv.kubernetes.io/bound-by-controller"
	annProvisionedBy      = "pv.kubernetes.io/provisioned-by"
	annStorageProvisioner = "volume.kubernetes.io/storage-provisioner"
)

// registry is DiskFit's out-of-tree registry with the CRD installed first:
// the plugin waits in New until its DiskNode informer syncs, and
// scheduler_perf builds the scheduler right after the API server starts,
// before any hook of ours runs.
func registry() frameworkruntime.Registry {
	r := app.Registry()
	newDiskFit := r[diskfitplugin.Name]
	r[diskfitplugin.Name] = func(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
		if err := controlplane.InstallCRDs(ctx, h.KubeConfig(), crdDir); err != nil {
			return nil, err
		}
		return newDiskFit(ctx, obj, h)
	}
	return r
}

// prepareStorage runs before each workload: the CRD (the default profile
// does not build DiskFit, but its workloads create the same DiskNodes) and
// the stand-in for external-provisioner and the PV controller.
func prepareStorage(tCtx ktesting.TContext) error {
	if err := controlplane.InstallCRDs(tCtx, tCtx.RESTConfig(), crdDir); err != nil {
		return err
	}
	return startProvisioner(tCtx)
}

// addDiskNodes runs after createNodes: each node gets the driver's
// topology label (kubelet's CSI registration would add it) and a DiskNode
// with disksPerNode empty disks (the driver's node plugin would report it).
func addDiskNodes(tCtx ktesting.TContext, _ *scheduler.Scheduler, _ *perf.Workload, nodes *v1.NodeList) error {
	// The harness's config asks for protobuf, which custom resources lack.
	config := rest.CopyConfig(tCtx.RESTConfig())
	config.ContentType = runtime.ContentTypeJSON
	client, err := versioned.NewForConfig(config)
	if err != nil {
		return err
	}
	kube := tCtx.Client()
	var (
		mu       sync.Mutex
		firstErr error
	)
	workqueue.ParallelizeUntil(tCtx, workers, len(nodes.Items), func(i int) {
		if err := addDiskNode(tCtx, kube, client, &nodes.Items[i]); err != nil {
			mu.Lock()
			if firstErr == nil {
				firstErr = err
			}
			mu.Unlock()
		}
	})
	return firstErr
}

func addDiskNode(ctx context.Context, kube kubernetes.Interface, client versioned.Interface, node *v1.Node) error {
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, diskfit.TopologyKey, node.Name)
	if _, err := kube.CoreV1().Nodes().Patch(ctx, node.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("labelling node %s: %w", node.Name, err)
	}
	return createDiskNode(ctx, client, node.Name, disksPerNode)
}

// createDiskNode creates the DiskNode of a node with the given number of
// healthy, empty disks, as the node plugin reports them.
func createDiskNode(ctx context.Context, client versioned.Interface, name string, disks int) error {
	dn := &v1alpha1.DiskNode{ObjectMeta: metav1.ObjectMeta{Name: name}}
	created, err := client.DiskfitV1alpha1().DiskNodes().Create(ctx, dn, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating DiskNode %s: %w", name, err)
	}
	for d := range disks {
		created.Status.Disks = append(created.Status.Disks, v1alpha1.DiskStatus{
			Name:          fmt.Sprintf("disk-%d", d),
			Backend:       v1alpha1.BackendFile,
			CapacityBytes: diskBytes,
			FreeBytes:     diskBytes,
			Healthy:       true,
		})
	}
	created.Status.ObservedTime = metav1.Now()
	created.Status.Summarize()
	if _, err := client.DiskfitV1alpha1().DiskNodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("reporting disks of DiskNode %s: %w", name, err)
	}
	return nil
}

// provisioner does what external-provisioner and the PV controller do for a
// diskfit claim once the scheduler has selected a node: create a CSI PV on
// the selected disk and bind it to the claim. The harness runs neither, and
// VolumeBinding's PreBind waits until every claim is bound.
type provisioner struct {
	client kubernetes.Interface
	claims corelisters.PersistentVolumeClaimLister
	queue  workqueue.TypedRateLimitingInterface[string]
	stats  provisionerStats
}

// provisionerStats tell whether the stand-in served both profiles alike:
// how long a claim waited from the scheduler's selected-node write (as
// seen by the stand-in's informer) until the stand-in had bound it, and
// how often its writes met a conflict.
type provisionerStats struct {
	mu        sync.Mutex
	seen      map[string]time.Time
	latencies []time.Duration
	conflicts int
}

func (s *provisionerStats) enqueued(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.seen[key]; !ok {
		s.seen[key] = time.Now()
	}
}

func (s *provisionerStats) bound(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t, ok := s.seen[key]; ok {
		s.latencies = append(s.latencies, time.Since(t))
		delete(s.seen, key)
	}
}

func (s *provisionerStats) conflict() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.conflicts++
}

// String summarises the claims bound so far.
func (s *provisionerStats) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.latencies) == 0 {
		return "no claims bound"
	}
	l := slices.Clone(s.latencies)
	slices.Sort(l)
	var sum time.Duration
	for _, d := range l {
		sum += d
	}
	return fmt.Sprintf("%d claims bound, selected-node seen to bound: avg %s, p50 %s, p99 %s; %d update conflicts",
		len(l), (sum / time.Duration(len(l))).Round(time.Millisecond), l[len(l)/2].Round(time.Millisecond),
		l[len(l)*99/100].Round(time.Millisecond), s.conflicts)
}

// startProvisioner starts the provisioner for the workload of tCtx and
// stops it, waiting for its goroutines, when the workload ends.
func startProvisioner(tCtx ktesting.TContext) error {
	ctx, cancel := context.WithCancel(tCtx)
	factory := informers.NewSharedInformerFactory(tCtx.Client(), 0)
	informer := factory.Core().V1().PersistentVolumeClaims()
	p := &provisioner{
		client: tCtx.Client(),
		claims: informer.Lister(),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "schedperf-provisioner"}),
		stats: provisionerStats{seen: map[string]time.Time{}},
	}
	enqueue := func(obj any) {
		if pvc, ok := obj.(*v1.PersistentVolumeClaim); ok && needsVolume(pvc) {
			key := pvc.Namespace + "/" + pvc.Name
			p.stats.enqueued(key)
			p.queue.Add(key)
		}
	}
	if _, err := informer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
	}); err != nil {
		cancel()
		return err
	}
	factory.Start(ctx.Done())
	var wg sync.WaitGroup
	tCtx.Cleanup(func() {
		cancel()
		p.queue.ShutDown()
		wg.Wait()
		factory.Shutdown()
		// Printed, not logged: benchmark logs are truncated.
		fmt.Printf("stand-in provisioner, %s: %s\n", tCtx.Name(), &p.stats)
	})
	if !cache.WaitForCacheSync(ctx.Done(), informer.Informer().HasSynced) {
		return fmt.Errorf("PVC informer did not sync")
	}
	for range workers {
		wg.Go(func() {
			for p.next(ctx) {
			}
		})
	}
	return nil
}

// needsVolume: an unbound claim with a node selected by the scheduler.
func needsVolume(pvc *v1.PersistentVolumeClaim) bool {
	return pvc.Spec.VolumeName == "" && pvc.Annotations[diskfit.SelectedNodeAnnotation] != ""
}

func (p *provisioner) next(ctx context.Context) bool {
	key, quit := p.queue.Get()
	if quit {
		return false
	}
	defer p.queue.Done(key)
	if err := p.sync(ctx, key); err != nil {
		if ctx.Err() != nil {
			return true
		}
		klog.FromContext(ctx).V(2).Info("Retrying claim", "claim", key, "err", err)
		p.queue.AddRateLimited(key)
		return true
	}
	p.queue.Forget(key)
	return true
}

func (p *provisioner) sync(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return err
	}
	pvc, err := p.claims.PersistentVolumeClaims(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if !needsVolume(pvc) {
		return nil
	}
	pv, err := p.createVolume(ctx, pvc)
	if err != nil {
		return err
	}
	if err := p.bindClaim(ctx, pvc, pv); err != nil {
		return err
	}
	p.stats.bound(key)
	return nil
}

// createVolume creates the claim's PV, already bound to the claim, as
// external-provisioner does, on the disk DiskFit selected; claims placed by
// the default profile carry no disk and get one chosen by name, the way a
// driver would choose on its own.
func (p *provisioner) createVolume(ctx context.Context, pvc *v1.PersistentVolumeClaim) (*v1.PersistentVolume, error) {
	node := pvc.Annotations[diskfit.SelectedNodeAnnotation]
	disk := pvc.Annotations[diskfit.SelectedDiskAnnotation]
	if disk == "" {
		h := fnv.New32a()
		_, _ = h.Write([]byte(pvc.Name))
		disk = fmt.Sprintf("disk-%d", h.Sum32()%disksPerNode)
	}
	class := ""
	if pvc.Spec.StorageClassName != nil {
		class = *pvc.Spec.StorageClassName
	}
	size := pvc.Spec.Resources.Requests[v1.ResourceStorage]
	name := "pvc-" + string(pvc.UID)
	pv := &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Annotations: map[string]string{annProvisionedBy: diskfit.DriverName},
		},
		Spec: v1.PersistentVolumeSpec{
			Capacity:                      v1.ResourceList{v1.ResourceStorage: size},
			AccessModes:                   pvc.Spec.AccessModes,
			PersistentVolumeReclaimPolicy: v1.PersistentVolumeReclaimDelete,
			StorageClassName:              class,
			VolumeMode:                    pvc.Spec.VolumeMode,
			PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{
				Driver:           diskfit.DriverName,
				VolumeHandle:     name,
				VolumeAttributes: map[string]string{diskfit.VolumeContextDiskKey: disk},
			}},
			ClaimRef: &v1.ObjectReference{
				Kind:       "PersistentVolumeClaim",
				APIVersion: "v1",
				Namespace:  pvc.Namespace,
				Name:       pvc.Name,
				UID:        pvc.UID,
			},
			NodeAffinity: &v1.VolumeNodeAffinity{Required: &v1.NodeSelector{
				NodeSelectorTerms: []v1.NodeSelectorTerm{{MatchExpressions: []v1.NodeSelectorRequirement{{
					Key:      diskfit.TopologyKey,
					Operator: v1.NodeSelectorOpIn,
					Values:   []string{node},
				}}}},
			}},
		},
	}
	created, err := p.client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		created, err = p.client.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
	}
	if err != nil {
		return nil, fmt.Errorf("creating PV for %s/%s: %w", pvc.Namespace, pvc.Name, err)
	}
	if created.Status.Phase != v1.VolumeBound {
		created.Status.Phase = v1.VolumeBound
		created, err = p.client.CoreV1().PersistentVolumes().UpdateStatus(ctx, created, metav1.UpdateOptions{})
		if err != nil {
			return nil, fmt.Errorf("marking PV %s bound: %w", name, err)
		}
	}
	return created, nil
}

// bindClaim completes the binding on the claim's side, as the PV controller
// does. scheduler_perf's own fake PV controller may bind it first.
func (p *provisioner) bindClaim(ctx context.Context, pvc *v1.PersistentVolumeClaim, pv *v1.PersistentVolume) error {
	claims := p.client.CoreV1().PersistentVolumeClaims(pvc.Namespace)
	return retry.OnError(retry.DefaultRetry, func(err error) bool {
		if apierrors.IsConflict(err) {
			p.stats.conflict()
			return true
		}
		return false
	}, func() error {
		current, err := claims.Get(ctx, pvc.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if current.Spec.VolumeName == "" || current.Annotations[annBindCompleted] == "" {
			current.Spec.VolumeName = pv.Name
			metav1.SetMetaDataAnnotation(&current.ObjectMeta, annBindCompleted, "yes")
			metav1.SetMetaDataAnnotation(&current.ObjectMeta, annBoundByController, "yes")
			metav1.SetMetaDataAnnotation(&current.ObjectMeta, annStorageProvisioner, diskfit.DriverName)
			if current, err = claims.Update(ctx, current, metav1.UpdateOptions{}); err != nil {
				return err
			}
		}
		if current.Status.Phase == v1.ClaimBound {
			return nil
		}
		current.Status.Phase = v1.ClaimBound
		current.Status.AccessModes = pv.Spec.AccessModes
		current.Status.Capacity = pv.Spec.Capacity
		_, err = claims.UpdateStatus(ctx, current, metav1.UpdateOptions{})
		return err
	})
}
