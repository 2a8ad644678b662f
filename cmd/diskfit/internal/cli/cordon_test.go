package cli

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	kubefake "k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	dffake "github.com/diskfit/diskfit/apis/client/clientset/versioned/fake"
	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
)

var diskNodesResource = schema.GroupVersionResource{Group: "diskfit.io", Version: "v1alpha1", Resource: "disknodes"}

// twoDisks is node-a with nvme0 and nvme1, nvme1 cordoned before.
func twoDisks() *v1alpha1.DiskNode {
	dn := diskNode("node-a", time.Second, disk("nvme0", "nvme", 4*gi, gi, 1), disk("nvme1", "nvme", 4*gi, 4*gi, 0))
	dn.Spec.Disks = []v1alpha1.DiskSpec{{Name: "nvme1", Unschedulable: true, Reason: "old firmware"}}
	return dn
}

// diskNodeClients are fake clients holding dns.
func diskNodeClients(dns ...runtime.Object) *Clients {
	return &Clients{Kube: kubefake.NewClientset(), DiskFit: dffake.NewSimpleClientset(dns...)}
}

func specOf(t *testing.T, c *Clients, node string) v1alpha1.DiskNodeSpec {
	t.Helper()
	dn, err := c.DiskFit.DiskfitV1alpha1().DiskNodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return dn.Spec
}

// writes lists the actions on c's clients that change something, as
// "verb resource name" in the order they were made.
func writes(c *Clients) []string {
	var out []string
	for _, f := range []interface{ Actions() []clienttesting.Action }{
		c.Kube.(*kubefake.Clientset), c.DiskFit.(*dffake.Clientset),
	} {
		for _, a := range f.Actions() {
			resource := a.GetResource().Resource
			if sub := a.GetSubresource(); sub != "" {
				resource += "/" + sub
			}
			var name string
			switch a := a.(type) {
			case clienttesting.CreateAction: // also every UpdateAction: same methods
				if ev, ok := a.GetObject().(*policyv1.Eviction); ok && ev.DeleteOptions != nil && len(ev.DeleteOptions.DryRun) > 0 {
					continue // a dry run writes nothing
				}
				name = a.GetObject().(metav1.Object).GetName()
			case clienttesting.DeleteAction:
				name = a.GetName()
			case clienttesting.PatchAction:
				name = a.GetName()
			default:
				continue
			}
			out = append(out, a.GetVerb()+" "+resource+" "+name)
		}
	}
	return out
}

// TestCordonDisk cordons and uncordons one disk: its own entry is added,
// updated and removed, the other disk's entry stays, and doing it again
// writes nothing.
func TestCordonDisk(t *testing.T) {
	c := diskNodeClients(twoDisks())
	nvme1 := v1alpha1.DiskSpec{Name: "nvme1", Unschedulable: true, Reason: "old firmware"}
	steps := []struct {
		args       []string
		wantOut    string
		wantSpec   v1alpha1.DiskNodeSpec
		wantWrites int
	}{
		{
			args:       []string{"cordon", "node-a/nvme0", "--reason", "SMART errors"},
			wantOut:    "disk node-a/nvme0 cordoned: no new volume is placed on it; the volumes on it stay (reason: SMART errors)\n",
			wantSpec:   v1alpha1.DiskNodeSpec{Disks: []v1alpha1.DiskSpec{nvme1, {Name: "nvme0", Unschedulable: true, Reason: "SMART errors"}}},
			wantWrites: 1,
		},
		{
			args:     []string{"cordon", "node-a/nvme0"},
			wantOut:  "disk node-a/nvme0 already cordoned: no new volume is placed on it; the volumes on it stay (reason: SMART errors)\n",
			wantSpec: v1alpha1.DiskNodeSpec{Disks: []v1alpha1.DiskSpec{nvme1, {Name: "nvme0", Unschedulable: true, Reason: "SMART errors"}}},
		},
		{
			args:       []string{"cordon", "node-a/nvme0", "--reason", "replace on Friday"},
			wantOut:    "disk node-a/nvme0 cordoned: no new volume is placed on it; the volumes on it stay (reason: replace on Friday)\n",
			wantSpec:   v1alpha1.DiskNodeSpec{Disks: []v1alpha1.DiskSpec{nvme1, {Name: "nvme0", Unschedulable: true, Reason: "replace on Friday"}}},
			wantWrites: 1,
		},
		{
			args:       []string{"uncordon", "node-a/nvme0"},
			wantOut:    "disk node-a/nvme0 uncordoned\n",
			wantSpec:   v1alpha1.DiskNodeSpec{Disks: []v1alpha1.DiskSpec{nvme1}},
			wantWrites: 1,
		},
		{
			args:     []string{"uncordon", "node-a/nvme0"},
			wantOut:  "disk node-a/nvme0 already uncordoned\n",
			wantSpec: v1alpha1.DiskNodeSpec{Disks: []v1alpha1.DiskSpec{nvme1}},
		},
	}
	for _, s := range steps {
		before := len(writes(c))
		out, _, err := runWith(c, "", s.args...)
		checkResult(t, out, err, s.wantOut, "")
		if diff := cmp.Diff(s.wantSpec, specOf(t, c, "node-a")); diff != "" {
			t.Errorf("%v: spec (-want +got):\n%s", s.args, diff)
		}
		if got := len(writes(c)) - before; got != s.wantWrites {
			t.Errorf("%v: %d writes, want %d", s.args, got, s.wantWrites)
		}
	}
}

// TestCordonNode cordons a whole node: the node-wide mark is set and
// cleared, the entries of single disks stay, and each command says what
// still keeps disks out of service.
func TestCordonNode(t *testing.T) {
	c := diskNodeClients(twoDisks())
	nvme1 := v1alpha1.DiskSpec{Name: "nvme1", Unschedulable: true, Reason: "old firmware"}

	out, _, err := runWith(c, "", "cordon", "node-a", "--reason", "maintenance")
	checkResult(t, out, err, "node node-a cordoned: no new volume is placed on any of its disks; the volumes on them stay (reason: maintenance)\n", "")
	want := v1alpha1.DiskNodeSpec{Unschedulable: true, Reason: "maintenance", Disks: []v1alpha1.DiskSpec{nvme1}}
	if diff := cmp.Diff(want, specOf(t, c, "node-a")); diff != "" {
		t.Errorf("spec after cordon (-want +got):\n%s", diff)
	}

	out, _, err = runWith(c, "", "uncordon", "node-a/nvme1")
	checkResult(t, out, err, "disk node-a/nvme1 uncordoned\nThe whole node node-a stays cordoned: diskfit uncordon node-a puts its disks back.\n", "")

	if _, _, err := runWith(c, "", "cordon", "node-a/nvme1", "--reason", "old firmware"); err != nil {
		t.Fatal(err)
	}
	out, _, err = runWith(c, "", "uncordon", "node-a")
	checkResult(t, out, err, "node node-a uncordoned\nDisks cordoned on their own stay so: nvme1 (diskfit uncordon node-a/DISK).\n", "")
	if diff := cmp.Diff(v1alpha1.DiskNodeSpec{Disks: []v1alpha1.DiskSpec{nvme1}}, specOf(t, c, "node-a")); diff != "" {
		t.Errorf("spec after uncordon (-want +got):\n%s", diff)
	}
}

func TestCordonErrors(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{
			name:    "unknown disk",
			args:    []string{"cordon", "node-a/sda"},
			wantErr: "node node-a has no disk sda: its disks are nvme0, nvme1",
		},
		{
			name:    "unknown disk, uncordon",
			args:    []string{"uncordon", "node-a/sda"},
			wantErr: "node node-a has no disk sda: its disks are nvme0, nvme1",
		},
		{
			name:    "unknown node",
			args:    []string{"cordon", "node-x/nvme0"},
			wantErr: `reading DiskNode node-x: disknodes.diskfit.io "node-x" not found`,
		},
		{
			name:    "no node",
			args:    []string{"cordon", "/nvme0"},
			wantErr: `"/nvme0" names no node: use NODE or NODE/DISK`,
		},
		{
			name:    "malformed disk",
			args:    []string{"uncordon", "node-a/NVMe0"},
			wantErr: `disk name "NVMe0" must be lower-case letters, digits, '.', '_' or '-', starting and ending with a letter or digit`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := diskNodeClients(twoDisks())
			_, _, err := runWith(c, "", tc.args...)
			checkResult(t, "", err, "", tc.wantErr)
			if w := writes(c); len(w) != 0 {
				t.Errorf("writes: %v", w)
			}
		})
	}
}

// TestCordonKeepsConcurrentChanges has another writer cordon nvme1 between
// cordon's read and its update: the update fails with a conflict, cordon
// reads again, and both disks end up cordoned.
func TestCordonKeepsConcurrentChanges(t *testing.T) {
	dn := twoDisks()
	dn.Spec = v1alpha1.DiskNodeSpec{}
	c := diskNodeClients(dn)
	fake := c.DiskFit.(*dffake.Clientset)
	conflicted := false
	fake.PrependReactor("update", "disknodes", func(clienttesting.Action) (bool, runtime.Object, error) {
		if conflicted {
			return false, nil, nil
		}
		conflicted = true
		other := twoDisks()
		other.Spec.Disks[0].Reason = "someone else"
		if err := fake.Tracker().Update(diskNodesResource, other, ""); err != nil {
			t.Error(err)
		}
		return true, nil, apierrors.NewConflict(diskNodesResource.GroupResource(), "node-a", nil)
	})
	if _, _, err := runWith(c, "", "cordon", "node-a/nvme0"); err != nil {
		t.Fatal(err)
	}
	want := v1alpha1.DiskNodeSpec{Disks: []v1alpha1.DiskSpec{
		{Name: "nvme1", Unschedulable: true, Reason: "someone else"}, {Name: "nvme0", Unschedulable: true},
	}}
	if diff := cmp.Diff(want, specOf(t, c, "node-a")); diff != "" {
		t.Errorf("spec (-want +got):\n%s", diff)
	}
}
