package lifecycle

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	clienttesting "k8s.io/client-go/testing"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
)

var nodeDeletionAnnotation = map[string]string{diskfit.ReleaseOnNodeDeletionAnnotation: "true"}

// TestReleaseClaimsOfDeletedNodes: a deleted Node, once it has stayed gone
// for the grace time, has exactly the claims on it that opted in released
// (by the node-deletion annotation, or by asking to be released on disk
// loss): the PVC and its PV are deleted, the PV made Retain and its
// provisioner finalizer removed first (its provisioner died with the
// node), while claims that
// did not opt in and claims on live nodes stay. A second pass does nothing.
func TestReleaseClaimsOfDeletedNodes(t *testing.T) {
	var objs []runtime.Object
	objs = append(objs, node("alive"))
	objs = append(objs, claim("lost", plainClass, "gone", "d0", nodeDeletionAnnotation)...)
	objs = append(objs, claim("lost-by-class", optInClass, "gone", "d0", nil)...)
	objs = append(objs, claim("kept", plainClass, "gone", "d1", nil)...)
	objs = append(objs, claim("alive", plainClass, "alive", "d0", nodeDeletionAnnotation)...)
	objs[2].(*v1.PersistentVolume).Finalizers = []string{provisionerFinalizer, "kubernetes.io/pv-protection"}
	e := newEnv(t, objs, diskNode("alive", "d0"))

	e.c.Pass(e.ctx)
	e.step(nodeGrace - time.Second)
	if !e.pvcExists("lost") {
		t.Fatal("claim released before the grace time")
	}
	e.client.ClearActions()
	e.step(time.Second)
	for _, name := range []string{"lost", "lost-by-class"} {
		if e.pvcExists(name) {
			t.Errorf("opted-in claim %s on the deleted node kept, want it deleted", name)
		}
		if e.pv("pv-"+name) != nil {
			t.Errorf("PV of %s kept, want it deleted", name)
		}
	}
	read := false
	for _, a := range e.client.Actions() {
		switch {
		case a.GetVerb() == "get" && a.GetResource().Resource == "nodes":
			read = true
		case a.GetVerb() == "delete" && !read:
			t.Errorf("deleted %s before reading the Node again", a.GetResource().Resource)
		}
		if p, ok := a.(clienttesting.PatchAction); ok && p.GetName() == "pv-lost" && strings.Contains(string(p.GetPatch()), "finalizers") {
			if want := `{"metadata":{"finalizers":["kubernetes.io/pv-protection"],"resourceVersion":""}}`; string(p.GetPatch()) != want {
				t.Errorf("finalizer patch %s, want %s", p.GetPatch(), want)
			}
		}
	}
	for _, name := range []string{"kept", "alive"} {
		if !e.pvcExists(name) || e.pv("pv-"+name) == nil {
			t.Errorf("claim %s or its PV deleted, want both kept", name)
		}
	}
	if err := wait.PollUntilContextTimeout(e.ctx, time.Millisecond, testTimeout, true, func(context.Context) (bool, error) {
		_, err1 := e.c.pvs.Get("pv-lost")
		_, err2 := e.c.pvs.Get("pv-lost-by-class")
		return err1 != nil && err2 != nil, nil
	}); err != nil {
		t.Fatal("the released PVs never left the cache")
	}
	e.client.ClearActions()
	e.c.Pass(e.ctx)
	for _, a := range e.client.Actions() {
		if a.GetVerb() == "delete" || a.GetVerb() == "patch" {
			t.Errorf("second pass did %s %s", a.GetVerb(), a.GetResource().Resource)
		}
	}
}

// TestNodeMissingOnlyFromTheCacheKeepsItsClaims: the cache misses a Node
// the API server has (a relist in progress, a missed watch event).
// However long that lasts, nothing is released; the controller asks the
// API server with quorum reads (no resourceVersion).
func TestNodeMissingOnlyFromTheCacheKeepsItsClaims(t *testing.T) {
	e := newEnv(t, claim("lost", plainClass, "gone", "d0", nodeDeletionAnnotation))
	var gets []metav1.GetOptions
	e.client.PrependReactor("get", "nodes", func(a clienttesting.Action) (bool, runtime.Object, error) {
		gets = append(gets, a.(clienttesting.GetActionImpl).GetOptions)
		return true, node("gone"), nil
	})
	for range 3 {
		e.step(nodeGrace)
	}
	if !e.pvcExists("lost") {
		t.Fatal("claim released while the API server has its Node")
	}
	if len(gets) == 0 {
		t.Fatal("the Node was never read from the API server")
	}
	for _, o := range gets {
		if o.ResourceVersion != "" {
			t.Errorf("Node read with resourceVersion %q, want a quorum read", o.ResourceVersion)
		}
	}
}

// TestNodeBackDuringGraceResetsClock: a Node that comes back while its
// claims wait keeps them, and when it is gone again the grace time counts
// from then.
func TestNodeBackDuringGraceResetsClock(t *testing.T) {
	e := newEnv(t, claim("lost", plainClass, "gone", "d0", nodeDeletionAnnotation))
	inCache := func(want bool) {
		t.Helper()
		if err := wait.PollUntilContextTimeout(e.ctx, time.Millisecond, testTimeout, true, func(context.Context) (bool, error) {
			_, err := e.c.nodes.Get("gone")
			return (err == nil) == want, nil
		}); err != nil {
			t.Fatal("the Node cache never caught up")
		}
	}
	e.c.Pass(e.ctx)
	e.step(nodeGrace / 2)
	if _, err := e.client.CoreV1().Nodes().Create(e.ctx, node("gone"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	inCache(true)
	e.step(0)
	if err := e.client.CoreV1().Nodes().Delete(e.ctx, "gone", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	inCache(false)
	e.step(0)
	e.step(nodeGrace / 2)
	if !e.pvcExists("lost") {
		t.Fatal("claim released a grace time after the Node first went, though it came back in between")
	}
	e.step(nodeGrace / 2)
	if e.pvcExists("lost") {
		t.Error("claim kept a grace time after the Node went again")
	}
}

// TestDeletedNodeWhoseDriverReportsKeepsItsClaims: the Node is deleted
// (kubectl delete node during maintenance, a cloud controller's bug) while
// the machine runs on, its driver refreshing its DiskNode. The claim's
// data is intact on a live machine: however long that lasts, the claim
// and its PV stay. Once the driver stops reporting (the machine is gone
// too), the claim is released a grace time later, as for any deleted Node.
func TestDeletedNodeWhoseDriverReportsKeepsItsClaims(t *testing.T) {
	e := newEnv(t, claim("lost", plainClass, "gone", "d0", nodeDeletionAnnotation), diskNode("gone", "d0"))
	e.c.Pass(e.ctx)
	for range 5 {
		e.step(nodeGrace)
	}
	if !e.pvcExists("lost") || e.pv("pv-lost") == nil {
		t.Fatal("claim of a deleted Node, or its PV, deleted while the machine's driver still reports")
	}
	e.silent["gone"] = true
	e.step(statusAge + time.Second) // its last report is old now
	e.step(nodeGrace - time.Second)
	if !e.pvcExists("lost") {
		t.Fatal("claim released before a grace time without reports from its node")
	}
	e.step(time.Second)
	if e.pvcExists("lost") {
		t.Error("claim of a deleted Node kept a grace time after its driver stopped reporting")
	}
}

// TestNodesLostAtOnceReleaseNothing: the Node objects of all 30 nodes are
// deleted at once (a cloud controller that cannot see its instances, a
// script run against the wrong cluster) and their pods with them, so
// their drivers stop reporting. A 3-replica StatefulSet opted in has its
// claims on 3 of them, within the limit (10% of 30). The other 27 nodes,
// without claims, show the cause is shared all the same: a grace time
// later nothing is released (every replica recreated empty at once) and no
// DiskNode is deleted; the claims are told why. Once the Nodes are back
// but one, that one's claim is released as for any lost node.
func TestNodesLostAtOnceReleaseNothing(t *testing.T) {
	objs, dns, replicas := thirtyNodes(nodeDeletionAnnotation)
	e := newEnv(t, objs, dns...)
	e.c.opts.MaxLostNodes = DefaultMaxLostNodes
	e.c.Pass(e.ctx)
	for _, dn := range dns {
		if err := e.client.CoreV1().Nodes().Delete(e.ctx, dn.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		e.silent[dn.Name] = true
	}
	e.nodesInCache(0)
	e.step(statusAge + time.Second) // the last reports are old now
	for range 3 {
		e.step(nodeGrace)
	}
	for _, name := range replicas {
		if !e.pvcExists(name) || e.pv("pv-"+name) == nil {
			t.Errorf("claim %s or its PV deleted while all 30 Nodes were deleted at once, its replicas on 3 of them", name)
		}
		if got := e.rec.of(name); !slices.ContainsFunc(got, func(ev string) bool { return strings.Contains(ev, ReasonReleaseHeld) }) {
			t.Errorf("events of %s = %q, want one %s", name, got, ReasonReleaseHeld)
		}
	}
	if list, err := e.df.DiskfitV1alpha1().DiskNodes().List(e.ctx, metav1.ListOptions{}); err != nil || len(list.Items) != 30 {
		t.Errorf("DiskNodes left: %d (err %v), want all 30 kept while their Nodes are gone at once", len(list.Items), err)
	}

	for _, dn := range dns[1:] {
		if _, err := e.client.CoreV1().Nodes().Create(e.ctx, node(dn.Name), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		e.silent[dn.Name] = false
	}
	e.nodesInCache(29)
	e.step(0)
	e.step(nodeGrace)
	if e.pvcExists("web-0") {
		t.Error("claim web-0 kept a grace time after only its node was still gone")
	}
	for _, name := range []string{"web-1", "web-2"} {
		if !e.pvcExists(name) {
			t.Errorf("claim %s of a node that came back released", name)
		}
	}
}

// TestNodesGoneLongAgoHoldNoRelease: three nodes were retired long ago
// (drained, their Nodes deleted), their DiskNodes kept for the cordon in
// their spec, and the controller restarts (an upgrade). Then n1, holding
// web-0, is lost. Those three are not lost at once with n1: web-0 is
// released a grace time later. Before, the restart counted them as lost
// anew and held every later release for good.
func TestNodesGoneLongAgoHoldNoRelease(t *testing.T) {
	objs, dns, _ := thirtyNodes(nodeDeletionAnnotation)
	objs, dns = objs[:20], dns[:20] // 20 nodes: at most 2 lost at once
	objs = append(objs, claim("web-0", plainClass, "n1", "d0", nodeDeletionAnnotation)...)
	for _, dn := range dns[17:] {
		dn.Spec.Disks = []v1alpha1.DiskSpec{{Name: "d0", Unschedulable: true, Reason: "retired"}}
	}
	e := newEnv(t, objs, dns...)
	e.c.opts.MaxLostNodes = DefaultMaxLostNodes
	retired := dns[17:]
	for _, dn := range retired {
		if err := e.client.CoreV1().Nodes().Delete(e.ctx, dn.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		dn.Status.ObservedTime = metav1.NewTime(e.clock.Now().Add(-30 * 24 * time.Hour))
		e.setDiskNode(dn)
		e.silent[dn.Name] = true
	}
	e.nodesInCache(17)
	e.loseN1WantWeb0Released("nodes retired a month ago are not lost at once with it")
}

// TestNodesRemovedAtOnceHoldNoLaterRelease: the autoscaler removes 4 empty
// nodes of 30 at once, more than the 3 lost at once allowed, with no claim
// to hold. Their DiskNodes are deleted as for any gone node, and when n1,
// holding web-0, is lost 40 minutes later, web-0 is released: it is not
// lost at once with them. Before, the 4 held every later release for good.
func TestNodesRemovedAtOnceHoldNoLaterRelease(t *testing.T) {
	objs, dns, _ := thirtyNodes(nodeDeletionAnnotation)
	objs = objs[:30]
	objs = append(objs, claim("web-0", plainClass, "n1", "d0", nodeDeletionAnnotation)...)
	e := newEnv(t, objs, dns...)
	e.c.opts.MaxLostNodes = DefaultMaxLostNodes
	e.c.Pass(e.ctx)
	for _, dn := range dns[26:] {
		if err := e.client.CoreV1().Nodes().Delete(e.ctx, dn.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		e.silent[dn.Name] = true
	}
	e.nodesInCache(26)
	for range 40 {
		e.step(time.Minute)
	}
	if list, err := e.df.DiskfitV1alpha1().DiskNodes().List(e.ctx, metav1.ListOptions{}); err != nil || len(list.Items) != 26 {
		t.Errorf("DiskNodes left: %d (err %v), want the 4 of the removed nodes deleted", len(list.Items), err)
	}
	e.loseN1WantWeb0Released("4 nodes removed 40 minutes before are not lost at once with it")
}

// loseN1WantWeb0Released deletes Node n1, silences its driver and wants
// its claim web-0 released a grace time later, for why.
func (e *env) loseN1WantWeb0Released(why string) {
	e.t.Helper()
	before, err := e.c.nodes.List(labels.Everything())
	if err != nil {
		e.t.Fatal(err)
	}
	if err := e.client.CoreV1().Nodes().Delete(e.ctx, "n1", metav1.DeleteOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.silent["n1"] = true
	e.nodesInCache(len(before) - 1)
	e.step(statusAge + time.Second)
	e.step(nodeGrace)
	e.step(time.Second)
	if e.pvcExists("web-0") {
		e.t.Errorf("claim web-0 kept a grace time after its node went, events %q: %s", e.rec.of("web-0"), why)
	}
}

// nodesInCache waits until the controller's Node cache holds want Nodes.
func (e *env) nodesInCache(want int) {
	e.t.Helper()
	if err := wait.PollUntilContextTimeout(e.ctx, time.Millisecond, testTimeout, true, func(context.Context) (bool, error) {
		list, err := e.c.nodes.List(labels.Everything())
		return err == nil && len(list) == want, nil
	}); err != nil {
		e.t.Fatal("the Node cache never caught up")
	}
}

// TestNodesDeletedOneByOneReleaseLittle: a script deletes the Nodes of a
// 30-node cluster one every 100 seconds, the replicas of web on the first
// three. When web-0's and web-1's grace times end, no more than 3 nodes
// are lost (the limit, 10% of 30), and the brake cannot know of the
// deletions still to come; by web-2's, 4 nodes are lost within
// LossWindow, those whose claims were released among them (their
// DiskNodes stay for LossWindow): web-2 stays. Before, a node counted
// only until its claims were released and all three went one after another.
func TestNodesDeletedOneByOneReleaseLittle(t *testing.T) {
	objs, dns, replicas := thirtyNodes(nodeDeletionAnnotation)
	e := newEnv(t, objs, dns...)
	e.c.opts.MaxLostNodes = DefaultMaxLostNodes
	e.c.Pass(e.ctx)
	for i, dn := range dns[:12] {
		if err := e.client.CoreV1().Nodes().Delete(e.ctx, dn.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		e.silent[dn.Name] = true
		e.nodesInCache(29 - i)
		for range 10 {
			e.step(10 * time.Second)
		}
	}
	for range 10 {
		e.step(time.Minute)
	}
	if !e.pvcExists(replicas[2]) {
		t.Errorf("claim %s released after 4 nodes were deleted within %s, one every 100 s", replicas[2], LossWindow)
	}
}

// TestAnEmptyNodeRemovedHoldsNoRelease: in a 15-node cluster (at most one
// node lost at once) the autoscaler removes n15, which holds no volume;
// ten minutes later n1, holding web-0, is lost. n15 lost nothing anyone
// needs: web-0 is released a grace time later. Before, n15 counted, each
// kept the other held, and web-0 waited for ever.
func TestAnEmptyNodeRemovedHoldsNoRelease(t *testing.T) {
	e, _ := web0OnN1(t, 15)
	e.removeNode("n15")
	e.nodesInCache(14)
	for range 10 {
		e.step(time.Minute)
	}
	e.loseN1WantWeb0Released("n15, removed 10 minutes before, held no volume")
}

// TestNodeWhoseClockIsAheadIsCountedByTheAPIServersTime: n2, holding a
// volume, went silent two hours ago, but its clock runs two hours ahead,
// so its DiskNode's observedTime says now. When n1, holding web-0, is
// lost, the two are not lost at once: web-0 is released a grace time
// later. When a node went silent is the API server's time of its last
// status write (the status's managedFields entry), not the node's clock.
func TestNodeWhoseClockIsAheadIsCountedByTheAPIServersTime(t *testing.T) {
	e, dns := web0OnN1(t, 20)
	e.removeNode("n2")
	n2 := dns[1]
	written := metav1.NewTime(e.clock.Now().Add(-2 * time.Hour))
	n2.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "diskfit-csi", Operation: metav1.ManagedFieldsOperationUpdate, Subresource: "status", Time: &written}}
	n2.Status.ObservedTime = metav1.NewTime(e.clock.Now())
	e.setDiskNode(n2)
	e.nodesInCache(19)
	e.loseN1WantWeb0Released("n2 went silent two hours before, by the API server's clock")
}

// web0OnN1 is a cluster of the first n of thirtyNodes' nodes, web-0 on n1
// asking to be released with its node, at most 10% of the nodes holding
// volumes lost at once, after a first pass.
func web0OnN1(t *testing.T, n int) (*env, []*v1alpha1.DiskNode) {
	t.Helper()
	objs, dns, _ := thirtyNodes(nodeDeletionAnnotation)
	objs, dns = objs[:n], dns[:n]
	objs = append(objs, claim("web-0", plainClass, "n1", "d0", nodeDeletionAnnotation)...)
	e := newEnv(t, objs, dns...)
	e.c.opts.MaxLostNodes = DefaultMaxLostNodes
	e.c.Pass(e.ctx)
	return e, dns
}

// removeNode deletes Node name and silences its driver.
func (e *env) removeNode(name string) {
	e.t.Helper()
	if err := e.client.CoreV1().Nodes().Delete(e.ctx, name, metav1.DeleteOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.silent[name] = true
}
