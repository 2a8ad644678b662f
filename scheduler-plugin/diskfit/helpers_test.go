package diskfit

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	fakediscovery "k8s.io/client-go/discovery/fake"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	tf "k8s.io/kubernetes/pkg/scheduler/testing/framework"
	"k8s.io/utils/ptr"

	dffake "github.com/diskfit/diskfit/apis/client/clientset/versioned/fake"
	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
	"github.com/diskfit/diskfit/scheduler-plugin/apis/config"
)

const gi = int64(1) << 30

// testNow is the fixed clock of plugin tests; DiskNodes observed at it are
// fresh.
var testNow = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

const (
	diskfitClass = "diskfit"
	ssdClass     = "diskfit-ssd"
	otherClass   = "other"
)

func storageClasses() []runtime.Object {
	wffc := storagev1.VolumeBindingWaitForFirstConsumer
	return []runtime.Object{
		&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: diskfitClass}, Provisioner: diskfit.DriverName, VolumeBindingMode: &wffc},
		&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: ssdClass}, Provisioner: diskfit.DriverName, VolumeBindingMode: &wffc,
			Parameters: map[string]string{diskfit.DeviceClassParameter: "ssd"}},
		&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: otherClass}, Provisioner: "other.example.com", VolumeBindingMode: &wffc},
	}
}

func node(name string) *v1.Node {
	return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
		v1.LabelHostname: name, diskfit.TopologyKey: name,
	}}}
}

type diskSpec struct {
	name, class    string
	capacity, free int64
	unhealthy      bool
}

func diskNode(nodeName string, disks ...diskSpec) *v1alpha1.DiskNode {
	dn := &v1alpha1.DiskNode{
		ObjectMeta: metav1.ObjectMeta{Name: nodeName},
		Status:     v1alpha1.DiskNodeStatus{ObservedTime: metav1.NewTime(testNow)},
	}
	for _, d := range disks {
		dn.Status.Disks = append(dn.Status.Disks, v1alpha1.DiskStatus{
			Name: d.name, Backend: v1alpha1.BackendFile, DeviceClass: d.class,
			CapacityBytes: d.capacity, FreeBytes: d.free, Healthy: !d.unhealthy,
		})
	}
	return dn
}

// freeDisk is an empty disk of the given size.
// cordoned takes the named disks of dn out of service in its spec.
func cordoned(dn *v1alpha1.DiskNode, disks ...string) *v1alpha1.DiskNode {
	for _, name := range disks {
		dn.Spec.Disks = append(dn.Spec.Disks, v1alpha1.DiskSpec{Name: name, Unschedulable: true, Reason: "replacing"})
	}
	return dn
}

func freeDisk(name string, size int64) diskSpec {
	return diskSpec{name: name, capacity: size, free: size}
}

type pvcBuilder struct{ *v1.PersistentVolumeClaim }

func makePVC(name, class string, size int64) pvcBuilder {
	return pvcBuilder{&v1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name), ResourceVersion: "1"},
		Spec: v1.PersistentVolumeClaimSpec{
			StorageClassName: ptr.To(class),
			AccessModes:      []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			Resources: v1.VolumeResourceRequirements{Requests: v1.ResourceList{
				v1.ResourceStorage: *resource.NewQuantity(size, resource.BinarySI),
			}},
		},
	}}
}

func (b pvcBuilder) annotate(key, value string) pvcBuilder {
	if b.Annotations == nil {
		b.Annotations = map[string]string{}
	}
	b.Annotations[key] = value
	return b
}

func (b pvcBuilder) placed(nodeName, disk string) pvcBuilder {
	return b.annotate(diskfit.SelectedNodeAnnotation, nodeName).annotate(diskfit.SelectedDiskAnnotation, disk)
}

func makePod(name string, claims ...string) *v1.Pod {
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name)},
		Spec: v1.PodSpec{SchedulerName: diskfit.SchedulerName}}
	for _, c := range claims {
		p.Spec.Volumes = append(p.Spec.Volumes, v1.Volume{Name: c, VolumeSource: v1.VolumeSource{
			PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: c},
		}})
	}
	return p
}

// testEnv is a DiskFit plugin on fake clientsets, built through the
// framework like the scheduler builds it.
type testEnv struct {
	ctx       context.Context
	client    *fake.Clientset
	dfClient  *dffake.Clientset
	handle    fwk.Handle
	pl        *DiskFit
	activator *recordingActivator
	events    *recordingRecorder
	// snapshots is the VolumeSnapshot client; tests add reactors to it.
	snapshots *dynamicfake.FakeDynamicClient
}

// recordedEvent is one event as the plugin handed it to the recorder.
type recordedEvent struct {
	regarding, related runtime.Object
	eventType, reason  string
	action, note       string
}

// recordingRecorder stands in for the profile's events.k8s.io recorder.
type recordingRecorder struct {
	mu     sync.Mutex
	events []recordedEvent
}

var _ events.EventRecorderLogger = &recordingRecorder{}

func (r *recordingRecorder) Eventf(regarding, related runtime.Object, eventType, reason, action, note string, args ...interface{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, recordedEvent{regarding: regarding, related: related,
		eventType: eventType, reason: reason, action: action, note: fmt.Sprintf(note, args...)})
}

func (r *recordingRecorder) WithLogger(klog.Logger) events.EventRecorderLogger { return r }

func (r *recordingRecorder) recorded() []recordedEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

// recordingActivator stands in for the scheduling queue.
type recordingActivator struct {
	mu        sync.Mutex
	activated []string
}

func (a *recordingActivator) Activate(_ klog.Logger, pods map[string]*v1.Pod) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for key := range pods {
		a.activated = append(a.activated, key)
	}
}

func newTestEnv(t *testing.T, args *config.DiskFitArgs, objs []runtime.Object, diskNodes ...*v1alpha1.DiskNode) *testEnv {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	return buildEnv(t, ctx, nil, args, objs, diskNodes...)
}

// buildEnv builds a test environment with the given logging context and
// features (nil: the process's feature gates, as in the scheduler).
func buildEnv(t testing.TB, ctx context.Context, fts *feature.Features, args *config.DiskFitArgs, objs []runtime.Object, diskNodes ...*v1alpha1.DiskNode) *testEnv {
	t.Helper()
	if fts == nil {
		fts = &feature.Features{}
	}
	ctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	// Unstructured objects (VolumeSnapshots and their contents) go to the
	// dynamic client, the rest to the clientset.
	kubeObjs, snapshotObjs := storageClasses(), []runtime.Object{}
	nodes := map[string]bool{}
	for _, o := range objs {
		switch o := o.(type) {
		case *unstructured.Unstructured:
			snapshotObjs = append(snapshotObjs, o)
		case *v1.Node:
			nodes[o.Name] = true
			kubeObjs = append(kubeObjs, o)
		default:
			kubeObjs = append(kubeObjs, o)
		}
	}
	// A DiskNode's Node exists, as in a cluster.
	for _, dn := range diskNodes {
		if !nodes[dn.Name] {
			kubeObjs = append(kubeObjs, node(dn.Name))
		}
	}
	client := fake.NewClientset(kubeObjs...)
	// The snapshot API is served, as on a cluster with manifests/snapshot.
	client.Discovery().(*fakediscovery.FakeDiscovery).Resources = snapshotAPI()
	informerFactory := informers.NewSharedInformerFactory(client, 0)
	activator := &recordingActivator{}
	recorder := &recordingRecorder{}
	fh, err := frameworkruntime.NewFramework(ctx, nil, nil,
		frameworkruntime.WithEventRecorder(recorder),
		frameworkruntime.WithClientSet(client),
		frameworkruntime.WithInformerFactory(informerFactory),
		frameworkruntime.WithPodActivator(activator))
	if err != nil {
		t.Fatal(err)
	}
	dnObjs := make([]runtime.Object, 0, len(diskNodes))
	for _, dn := range diskNodes {
		dnObjs = append(dnObjs, dn)
	}
	dfClient := dffake.NewSimpleClientset(dnObjs...)
	var obj runtime.Object
	if args != nil {
		obj = args
	}
	snapshots := dynamicfake.NewSimpleDynamicClient(runtime.NewScheme(), snapshotObjs...)
	pl, err := NewWithOptions(ctx, obj, fh, Options{
		Features:       fts,
		DiskNodeClient: dfClient,
		Now:            func() time.Time { return testNow },
		SnapshotClient: snapshots,
	})
	if err != nil {
		t.Fatal(err)
	}
	// The scheduler starts the shared informers after building plugins.
	informerFactory.Start(ctx.Done())
	informerFactory.WaitForCacheSync(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), pl.handlersSynced...) {
		t.Fatal("event handlers did not sync")
	}
	return &testEnv{ctx: ctx, client: client, dfClient: dfClient, handle: fh, pl: pl, activator: activator, events: recorder, snapshots: snapshots}
}

// nodeInfos builds scheduler NodeInfos for the named nodes.
func nodeInfos(names ...string) []fwk.NodeInfo {
	nodes := make([]*v1.Node, len(names))
	for i, n := range names {
		nodes[i] = node(n)
	}
	return tf.BuildNodeInfos(nodes)
}

// waitFor polls cond until it holds or the test times out.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// snapshotAPI is the discovery document of the VolumeSnapshot API.
func snapshotAPI() []*metav1.APIResourceList {
	return []*metav1.APIResourceList{{
		GroupVersion: volumeSnapshots.GroupVersion().String(),
		APIResources: []metav1.APIResource{{Name: volumeSnapshots.Resource}, {Name: volumeSnapshotContent.Resource}},
	}}
}
