package lifecycle

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	clienttesting "k8s.io/client-go/testing"

	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
)

// ownedByNode makes dn owned by its Node, as drivers before this version
// created DiskNodes.
func ownedByNode(dn *v1alpha1.DiskNode) *v1alpha1.DiskNode {
	dn.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: dn.Name, UID: "uid-node-" + types.UID(dn.Name)}}
	return dn
}

// TestDiskNodeOutlivesItsNodeWhileItHoldsACordon: an admin's cordon in a
// DiskNode's spec survives its Node being deleted and registered again
// (kubectl delete node for maintenance, a kubelet that registers anew).
// With an owner reference to the Node the garbage collector deleted the
// DiskNode with the Node, the driver made a new one with an empty spec,
// and new volumes went to a disk taken out of service. So no DiskNode is
// owned by its Node (the controller removes the references older drivers
// set), and the controller deletes the DiskNode of a Node gone for the
// grace time only when its spec holds nothing, after a quorum read, and
// only once its driver stopped reporting: a machine whose Node object
// was deleted runs on, and its driver could not make the DiskNode again.
func TestDiskNodeOutlivesItsNodeWhileItHoldsACordon(t *testing.T) {
	cordoned := ownedByNode(diskNode("cordoned", "d0"))
	cordoned.Spec.Disks = []v1alpha1.DiskSpec{{Name: "d0", Unschedulable: true, Reason: "SMART errors"}}
	nodeWide := diskNode("node-wide", "d0")
	nodeWide.Spec.Unschedulable = true
	e := newEnv(t, []runtime.Object{node("alive")},
		ownedByNode(diskNode("alive", "d0")), cordoned, nodeWide, ownedByNode(diskNode("plain", "d0")), diskNode("reporting", "d0"))
	// The machine of plain went with its Node: its last report is old.
	plain, err := e.df.DiskfitV1alpha1().DiskNodes().Get(e.ctx, "plain", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	plain.Status.ObservedTime = metav1.NewTime(e.clock.Now().Add(-statusAge - time.Second))
	e.setDiskNode(plain)
	e.silent["plain"] = true

	e.c.Pass(e.ctx)
	for _, name := range []string{"alive", "cordoned", "node-wide", "plain"} {
		dn, err := e.df.DiskfitV1alpha1().DiskNodes().Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(dn.OwnerReferences) != 0 {
			t.Errorf("DiskNode %s still owned by %v: the garbage collector deletes it, cordon and all, with its Node", name, dn.OwnerReferences)
		}
	}

	e.step(nodeGrace - time.Second)
	if !e.diskNodeExists("plain") {
		t.Fatal("the DiskNode of a deleted Node was deleted before the grace time")
	}
	e.step(time.Second)
	if !e.diskNodeExists("plain") {
		t.Fatal("the DiskNode of a deleted Node was deleted before LossWindow since its last report: it counts the nodes lost at once")
	}
	e.df.ClearActions()
	e.step(LossWindow)
	if e.diskNodeExists("plain") {
		t.Error("the DiskNode of a Node gone for the grace time and LossWindow, its spec empty, was kept")
	}
	for _, a := range e.df.Actions() {
		if d, ok := a.(clienttesting.DeleteActionImpl); ok {
			if p := d.DeleteOptions.Preconditions; p == nil || p.UID == nil || p.ResourceVersion == nil {
				t.Errorf("DiskNode %s deleted without UID and resourceVersion preconditions: an admin's cordon written meanwhile would go with it", d.Name)
			}
		}
	}
	for range 3 {
		e.step(nodeGrace)
	}
	for _, name := range []string{"alive", "cordoned", "node-wide", "reporting"} {
		if !e.diskNodeExists(name) {
			t.Errorf("DiskNode %s deleted, want it kept (its Node exists, it holds a cordon, or its driver reports)", name)
		}
	}
	dn, err := e.df.DiskfitV1alpha1().DiskNodes().Get(e.ctx, "cordoned", metav1.GetOptions{})
	if err != nil || dn.Spec.Disks[0].Reason != "SMART errors" {
		t.Errorf("the cordon after the Node left: %+v, %v", dn, err)
	}
}

// TestDiskNodeOfANodeMissingOnlyFromTheCacheStays: the cache misses a
// Node the API server has; its DiskNode is not deleted.
func TestDiskNodeOfANodeMissingOnlyFromTheCacheStays(t *testing.T) {
	e := newEnv(t, nil, diskNode("n1", "d0"))
	e.client.PrependReactor("get", "nodes", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, node("n1"), nil
	})
	for range 3 {
		e.step(nodeGrace)
	}
	if !e.diskNodeExists("n1") {
		t.Error("DiskNode deleted while the API server has its Node")
	}
}

func (e *env) diskNodeExists(name string) bool {
	e.t.Helper()
	_, err := e.df.DiskfitV1alpha1().DiskNodes().Get(e.ctx, name, metav1.GetOptions{})
	if err == nil {
		return true
	}
	// Wait for the cache too, so the next pass sees what the API has.
	_ = wait.PollUntilContextTimeout(e.ctx, time.Millisecond, testTimeout, true, func(context.Context) (bool, error) {
		_, err := e.c.diskNodes.Get(name)
		return err != nil, nil
	})
	return false
}
