package diskfit

import (
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/kubernetes/pkg/scheduler/framework"
)

// TestFailedSchedulingMessage shows the message of the FailedScheduling
// event a user sees when DiskFit rejects every node: the scheduler turns
// the Filter statuses into a FitError, counts identical reasons, and
// records its Error() (with the preemption outcome appended) on the pod.
// DiskFit's reasons name the node and its disks, so each node's reason
// reaches the user on its own.
func TestFailedSchedulingMessage(t *testing.T) {
	objs := []runtime.Object{
		makePVC("data", diskfitClass, 10*gi).PersistentVolumeClaim,
		makePVC("logs", diskfitClass, 3*gi).PersistentVolumeClaim,
		node("n1"), node("n2"), node("n3"),
	}
	pod := makePod("p", "data", "logs")
	env := newTestEnv(t, nil, append(objs, pod),
		// n1: no disk holds the 10Gi claim.
		diskNode("n1", freeDisk("nvme0", 9*gi), freeDisk("nvme1", 4*gi)),
		// n2: each claim fits alone, not both together.
		diskNode("n2", freeDisk("d0", 11*gi), freeDisk("d1", 2*gi)))
	// n3 has no DiskNode.

	state := framework.NewCycleState()
	nodes := nodeInfos("n1", "n2", "n3")
	mustPreFilter(t, env, state, pod, nodes)
	diagnosis := framework.Diagnosis{NodeToStatus: framework.NewDefaultNodeToStatus(), UnschedulablePlugins: sets.New[string]()}
	for _, n := range nodes {
		status := env.pl.Filter(env.ctx, state, pod, n)
		if status.IsSuccess() {
			t.Fatalf("Filter passed node %s", n.Node().Name)
		}
		status.SetPlugin(Name)
		diagnosis.NodeToStatus.Set(n.Node().Name, status)
		diagnosis.UnschedulablePlugins.Insert(Name)
	}
	got := (&framework.FitError{Pod: pod, NumAllNodes: len(nodes), Diagnosis: diagnosis}).Error()
	want := "0/3 nodes are available: " +
		"1 node n1: largest free disk nvme0 has 9Gi, pod needs 10Gi on one disk (claim ns/data), " +
		"1 node n2: claims 10Gi+3Gi do not fit together on disks d0 (11Gi free), d1 (2Gi free), " +
		"1 node n3: no DiskNode, the diskfit node plugin has not reported this node's disks."
	if got != want {
		t.Errorf("FailedScheduling message:\n got %q\nwant %q", got, want)
	}
}
