package diskfit

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2/ktesting"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
)

func TestEventsToRegister(t *testing.T) {
	env := newTestEnv(t, nil, nil)
	events, err := env.pl.EventsToRegister(env.ctx)
	if err != nil {
		t.Fatal(err)
	}
	vbEvents, err := env.pl.vb.EventsToRegister(env.ctx)
	if err != nil {
		t.Fatal(err)
	}
	has := func(res fwk.EventResource, action fwk.ActionType) bool {
		for _, e := range events {
			if e.Event.Resource == res && e.Event.ActionType&action == action {
				return true
			}
		}
		return false
	}
	for _, e := range vbEvents {
		if !has(e.Event.Resource, e.Event.ActionType) {
			t.Errorf("VolumeBinding event %v missing", e.Event)
		}
	}
	for _, want := range []fwk.ClusterEvent{
		{Resource: "disknodes.v1alpha1.diskfit.io", ActionType: fwk.Add | fwk.Update},
		{Resource: fwk.PersistentVolume, ActionType: fwk.Delete},
		{Resource: fwk.PersistentVolumeClaim, ActionType: fwk.Delete},
		{Resource: fwk.StorageClass, ActionType: fwk.Add},
		{Resource: fwk.Node, ActionType: fwk.Add},
	} {
		if !has(want.Resource, want.ActionType) {
			t.Errorf("event %v missing", want)
		}
	}
}

func toUnstructured(t *testing.T, dn *v1alpha1.DiskNode) *unstructured.Unstructured {
	t.Helper()
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(dn)
	if err != nil {
		t.Fatal(err)
	}
	return &unstructured.Unstructured{Object: obj}
}

func TestDiskNodeHint(t *testing.T) {
	base := diskNode("n1", diskSpec{name: "d0", capacity: 10 * gi, free: 2 * gi})
	withFree := func(free int64) *v1alpha1.DiskNode {
		dn := base.DeepCopy()
		dn.Status.Disks[0].FreeBytes = free
		return dn
	}
	withCapacity := func(capacity int64) *v1alpha1.DiskNode {
		dn := base.DeepCopy()
		dn.Status.Disks[0].CapacityBytes = capacity
		return dn
	}
	staleDN := base.DeepCopy()
	staleDN.Status.ObservedTime = metav1.NewTime(testNow.Add(-time.Hour))
	sick := base.DeepCopy()
	sick.Status.Disks[0].Healthy = false
	out := cordoned(base.DeepCopy(), "d0")
	extra := base.DeepCopy()
	extra.Status.Disks = append(extra.Status.Disks, v1alpha1.DiskStatus{Name: "d1", CapacityBytes: gi, FreeBytes: gi, Healthy: true})
	tests := []struct {
		name     string
		old, new *v1alpha1.DiskNode
		want     fwk.QueueingHint
	}{
		{"created", nil, base, fwk.Queue},
		{"more free space", base, withFree(3 * gi), fwk.Queue},
		{"less free space", base, withFree(gi), fwk.QueueSkip},
		// XFS frees a deleted volume's blocks in the background: a report
		// taken in between has the volume gone but not its space, and the
		// next one more capacity with the same free space (a new volume
		// took the room meanwhile). The ledger's room grew.
		{"more capacity, same free space", base, withCapacity(11 * gi), fwk.Queue},
		{"only refreshed", base, base.DeepCopy(), fwk.QueueSkip},
		{"fresh again", staleDN, base, fwk.Queue},
		{"healthy again", sick, base, fwk.Queue},
		{"new disk", base, extra, fwk.Queue},
		{"disk became unhealthy", base, sick, fwk.QueueSkip},
		{"back in service", out, base, fwk.Queue},
		{"taken out of service", base, out, fwk.QueueSkip},
	}
	env := newTestEnv(t, nil, nil)
	logger, _ := ktesting.NewTestContext(t)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var oldObj interface{}
			if tc.old != nil {
				oldObj = toUnstructured(t, tc.old)
			}
			got, err := env.pl.isSchedulableAfterDiskNodeChange(logger, makePod("p"), oldObj, toUnstructured(t, tc.new))
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("hint = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestVolumeHints(t *testing.T) {
	env := newTestEnv(t, nil, []runtime.Object{makePVC("mine", diskfitClass, gi).PersistentVolumeClaim})
	logger, _ := ktesting.NewTestContext(t)
	pod := makePod("p", "mine")

	diskfitPV := &v1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv1"}, Spec: v1.PersistentVolumeSpec{
		PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{
			Driver: diskfit.DriverName, VolumeAttributes: map[string]string{diskfit.VolumeContextDiskKey: "d0"}}},
		NodeAffinity: &v1.VolumeNodeAffinity{Required: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
			MatchExpressions: []v1.NodeSelectorRequirement{{Key: diskfit.TopologyKey, Operator: v1.NodeSelectorOpIn, Values: []string{"n1"}}}}}}},
	}}
	otherPV := &v1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv2"}}
	placed := makePVC("other", diskfitClass, gi).placed("n1", "d0").PersistentVolumeClaim
	released := placed.DeepCopy()
	delete(released.Annotations, diskfit.SelectedNodeAnnotation)
	unplaced := makePVC("other", diskfitClass, gi).PersistentVolumeClaim
	forged := makePVC("forged", "no-such-class", gi).placed("n1", "d0").PersistentVolumeClaim
	forgedReleased := forged.DeepCopy()
	delete(forgedReleased.Annotations, diskfit.SelectedNodeAnnotation)

	var pvcUpdate, pvAddUpdate, capacityAddUpdate fwk.QueueingHintFn
	for _, e := range mustEvents(t, env) {
		switch {
		case e.Event.Resource == fwk.PersistentVolumeClaim && e.Event.ActionType&fwk.Update != 0:
			pvcUpdate = e.QueueingHintFn
		case e.Event.Resource == fwk.PersistentVolume && e.Event.ActionType&fwk.Add != 0:
			pvAddUpdate = e.QueueingHintFn
		case e.Event.Resource == fwk.CSIStorageCapacity:
			capacityAddUpdate = e.QueueingHintFn
		}
	}
	capacity := func(class string) *storagev1.CSIStorageCapacity {
		return &storagev1.CSIStorageCapacity{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "cap-" + class}, StorageClassName: class}
	}
	tests := []struct {
		name string
		hint func() (fwk.QueueingHint, error)
		want fwk.QueueingHint
	}{
		{"diskfit PV deleted", func() (fwk.QueueingHint, error) {
			return env.pl.isSchedulableAfterPVDelete(logger, pod, diskfitPV, nil)
		}, fwk.Queue},
		{"other PV deleted", func() (fwk.QueueingHint, error) {
			return env.pl.isSchedulableAfterPVDelete(logger, pod, otherPV, nil)
		}, fwk.QueueSkip},
		{"placed PVC deleted", func() (fwk.QueueingHint, error) {
			return env.pl.isSchedulableAfterPVCDelete(logger, pod, placed, nil)
		}, fwk.Queue},
		{"unplaced PVC deleted", func() (fwk.QueueingHint, error) {
			return env.pl.isSchedulableAfterPVCDelete(logger, pod, unplaced, nil)
		}, fwk.QueueSkip},
		{"another pod's PVC lost selected-node", func() (fwk.QueueingHint, error) {
			return pvcUpdate(logger, pod, placed, released)
		}, fwk.Queue},
		{"forged PVC of a class that does not exist deleted (held nothing)", func() (fwk.QueueingHint, error) {
			return env.pl.isSchedulableAfterPVCDelete(logger, pod, forged, nil)
		}, fwk.QueueSkip},
		{"forged PVC lost selected-node (held nothing)", func() (fwk.QueueingHint, error) {
			return pvcUpdate(logger, pod, forged, forgedReleased)
		}, fwk.QueueSkip},
		{"another pod's PVC got a node", func() (fwk.QueueingHint, error) {
			return pvcUpdate(logger, pod, unplaced, placed)
		}, fwk.QueueSkip},
		{"diskfit PV provisioned", func() (fwk.QueueingHint, error) {
			return pvAddUpdate(logger, pod, nil, diskfitPV)
		}, fwk.QueueSkip},
		{"diskfit PV updated", func() (fwk.QueueingHint, error) {
			return pvAddUpdate(logger, pod, diskfitPV, diskfitPV)
		}, fwk.QueueSkip},
		{"other PV added (VolumeBinding: always)", func() (fwk.QueueingHint, error) {
			return pvAddUpdate(logger, pod, nil, otherPV)
		}, fwk.Queue},
		{"capacity published for a diskfit class", func() (fwk.QueueingHint, error) {
			return capacityAddUpdate(logger, pod, nil, capacity(diskfitClass))
		}, fwk.QueueSkip},
		{"capacity published for another class (VolumeBinding's hint)", func() (fwk.QueueingHint, error) {
			return capacityAddUpdate(logger, pod, nil, capacity(otherClass))
		}, fwk.Queue},
		{"the pod's own PVC changed (VolumeBinding's hint)", func() (fwk.QueueingHint, error) {
			mine := makePVC("mine", diskfitClass, gi).PersistentVolumeClaim
			return pvcUpdate(logger, pod, mine, mine)
		}, fwk.Queue},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.hint()
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("hint = %v, want %v", got, tc.want)
			}
		})
	}
}

func mustEvents(t *testing.T, env *testEnv) []fwk.ClusterEventWithHint {
	t.Helper()
	events, err := env.pl.EventsToRegister(env.ctx)
	if err != nil {
		t.Fatal(err)
	}
	return events
}

func TestDiskNodeConversionReused(t *testing.T) {
	env := newTestEnv(t, nil, nil)
	a := toUnstructured(t, diskNode("n1", freeDisk("d0", gi)))
	b := toUnstructured(t, diskNode("n2", freeDisk("d0", gi)))
	c := toUnstructured(t, diskNode("n3", freeDisk("d0", gi)))
	first, err := env.pl.toDiskNode(a)
	if err != nil {
		t.Fatal(err)
	}
	if first.Name != "n1" || len(first.Status.Disks) != 1 {
		t.Fatalf("converted %+v", first)
	}
	if _, err := env.pl.toDiskNode(b); err != nil {
		t.Fatal(err)
	}
	if again, _ := env.pl.toDiskNode(a); again != first {
		t.Error("the same object was converted twice")
	}
	// Two newer objects push the first out.
	if _, err := env.pl.toDiskNode(c); err != nil {
		t.Fatal(err)
	}
	if _, err := env.pl.toDiskNode(b); err != nil {
		t.Fatal(err)
	}
	if again, _ := env.pl.toDiskNode(a); again == first {
		t.Error("a forgotten object was not converted again")
	}
}
