package kube

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/informers"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"

	"github.com/diskfit/diskfit/apis/diskfit"
)

// servedContents is the discovery answer of a cluster with the snapshot
// CRDs installed.
var servedContents = []*metav1.APIResourceList{{GroupVersion: VolumeSnapshotContents.GroupVersion().String(),
	APIResources: []metav1.APIResource{{Name: VolumeSnapshotContents.Resource, Kind: "VolumeSnapshotContent"}}}}

// content is a VolumeSnapshotContent of driver naming handle in its status
// (a snapshot the driver made), in its spec (pre-provisioned), or nowhere
// (handle "": CreateSnapshot has not answered yet).
func content(name, driver, handle string, preProvisioned bool) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
		"metadata": map[string]any{"name": name},
		"spec":     map[string]any{"driver": driver, "deletionPolicy": "Retain", "source": map[string]any{"volumeHandle": "d:pvc-x"}},
	}}
	switch {
	case handle == "":
	case preProvisioned:
		_ = unstructured.SetNestedField(u.Object, map[string]any{"snapshotHandle": handle}, "spec", "source")
	default:
		_ = unstructured.SetNestedField(u.Object, handle, "status", "snapshotHandle")
	}
	return u
}

// contentEnv is an OrphanFinder on fake clients whose
// VolumeSnapshotContent informer runs and sends the handles it is told
// of to handles.
type contentEnv struct {
	ctx     context.Context
	kube    *k8sfake.Clientset
	dynamic *dynamicfake.FakeDynamicClient
	finder  *OrphanFinder
	handles chan string
}

// newContentEnv makes the env; setup runs before the informer does.
func newContentEnv(t *testing.T, setup func(*contentEnv), contents ...*unstructured.Unstructured) *contentEnv {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	objs := make([]runtime.Object, 0, len(contents))
	for _, c := range contents {
		objs = append(objs, c)
	}
	e := &contentEnv{ctx: ctx, kube: k8sfake.NewClientset(), handles: make(chan string, 100),
		dynamic: dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
			map[schema.GroupVersionResource]string{VolumeSnapshotContents: "VolumeSnapshotContentList"}, objs...)}
	f, err := NewOrphanFinder(e.kube, e.dynamic, informers.NewSharedInformerFactory(e.kube, 0), "n1")
	if err != nil {
		t.Fatal(err)
	}
	f.servedPoll = 10 * time.Millisecond
	e.finder = f
	if err := f.OnSnapshotHandle(func(handle string) { e.handles <- handle }); err != nil {
		t.Fatal(err)
	}
	setup(e)
	var running sync.WaitGroup
	running.Go(func() { f.RunContentInformer(ctx) })
	t.Cleanup(func() {
		cancel()
		running.Wait()
	})
	return e
}

// waitForWatch waits until the informer watches: the fake client sends a
// watch only what is made after it.
func (e *contentEnv) waitForWatch(t *testing.T) {
	t.Helper()
	if err := e.poll(func() bool { return e.asked("watch") }); err != nil {
		t.Fatal("the VolumeSnapshotContent informer never watched")
	}
}

// asked tells whether the dynamic client was asked to verb
// VolumeSnapshotContents.
func (e *contentEnv) asked(verb string) bool {
	for _, a := range e.dynamic.Actions() {
		if a.GetResource() == VolumeSnapshotContents && a.GetVerb() == verb {
			return true
		}
	}
	return false
}

func (e *contentEnv) poll(cond func() bool) error {
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	return wait.PollUntilContextCancel(ctx, 5*time.Millisecond, true, func(context.Context) (bool, error) { return cond(), nil })
}

// told returns the handles the informer told of, up to and including last.
func (e *contentEnv) told(t *testing.T, last string) []string {
	t.Helper()
	var got []string
	timeout := time.After(30 * time.Second)
	for {
		select {
		case h := <-e.handles:
			got = append(got, h)
			if h == last {
				return got
			}
		case <-timeout:
			t.Fatalf("told of %v, never of %s", got, last)
		}
	}
}

func (e *contentEnv) create(t *testing.T, u *unstructured.Unstructured) {
	t.Helper()
	if _, err := e.dynamic.Resource(VolumeSnapshotContents).Create(e.ctx, u, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestContentInformerTellsOfEverySnapshotHandle: the driver is told of the
// snapshot handle of every VolumeSnapshotContent of this driver, those
// there at start, a handle the snapshotter records in a content's status,
// and a pre-provisioned content's, even if the content is deleted at once;
// not of contents without a handle or of another driver.
func TestContentInformerTellsOfEverySnapshotHandle(t *testing.T) {
	e := newContentEnv(t, func(e *contentEnv) { e.kube.Resources = servedContents },
		content("content-existing", diskfit.DriverName, "d:snap-existing", false))
	e.waitForWatch(t)
	e.create(t, content("content-other", "other.csi.example.com", "d:snap-other", false))
	e.create(t, content("content-new", diskfit.DriverName, "", false))
	if _, err := e.dynamic.Resource(VolumeSnapshotContents).Update(e.ctx, content("content-new", diskfit.DriverName, "d:snap-new", false), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.create(t, content("content-imported", diskfit.DriverName, "d:snap-imported", true))
	if err := e.dynamic.Resource(VolumeSnapshotContents).Delete(e.ctx, "content-imported", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, want := e.told(t, "d:snap-imported"), []string{"d:snap-existing", "d:snap-new", "d:snap-imported"}; !slices.Equal(got, want) {
		t.Errorf("told of %v, want %v", got, want)
	}
}

// TestContentInformerWaitsForTheCRD: on a cluster without the snapshot
// CRDs the informer does not run (it would fail and log every few
// seconds); once they are installed it does, and the driver is told of
// the contents' handles.
func TestContentInformerWaitsForTheCRD(t *testing.T) {
	var installed atomic.Bool
	var asked atomic.Int32
	e := newContentEnv(t, func(e *contentEnv) {
		// Discovery reads Resources after its reactors ran, in the same
		// call: they are set here, under the fake's lock, not by the test.
		e.kube.PrependReactor("get", "resource", func(k8stesting.Action) (bool, runtime.Object, error) {
			asked.Add(1)
			if installed.Load() {
				e.kube.Resources = servedContents
			}
			return false, nil, nil
		})
	})
	if err := e.poll(func() bool { return asked.Load() >= 3 || len(e.dynamic.Actions()) != 0 }); err != nil {
		t.Fatal("the API was never asked whether it serves VolumeSnapshotContents")
	}
	if acts := e.dynamic.Actions(); len(acts) != 0 {
		t.Errorf("VolumeSnapshotContents were asked for while the API serves none: %v", acts)
	}
	installed.Store(true)
	e.waitForWatch(t)
	e.create(t, content("content", diskfit.DriverName, "d:snap", false))
	if got := e.told(t, "d:snap"); !slices.Equal(got, []string{"d:snap"}) {
		t.Errorf("told of %v", got)
	}
}

// TestContentInformerWithoutDynamicClient: without a dynamic client there
// is nothing to watch, and running the informer returns at once.
func TestContentInformerWithoutDynamicClient(t *testing.T) {
	kube := k8sfake.NewClientset()
	f, err := NewOrphanFinder(kube, nil, informers.NewSharedInformerFactory(kube, 0), "n1")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.OnSnapshotHandle(func(string) { t.Error("told of a handle") }); err != nil {
		t.Fatal(err)
	}
	_, ctx := ktesting.NewTestContext(t)
	f.RunContentInformer(ctx)
}
