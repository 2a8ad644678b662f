package cli

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kubefake "k8s.io/client-go/kubernetes/fake"

	dffake "github.com/diskfit/diskfit/apis/client/clientset/versioned/fake"
	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
)

const keptHandle = "nvme0:pvc-kept"

// withKeptVolume is node-a with one volume whose Retain PV was deleted.
func withKeptVolume() *v1alpha1.DiskNode {
	d := disk("nvme0", "nvme", 4*gi, gi, 1)
	d.VolumesWithoutPV, d.BytesWithoutPV = 1, 768*mi
	d.WithoutPV = []v1alpha1.VolumeWithoutPV{{VolumeHandle: keptHandle, SizeBytes: 768 * mi, Claim: "shop/data-web-0",
		Since: metav1.NewTime(testNow.Add(-2 * time.Hour))}}
	return diskNode("node-a", 3*time.Second, d)
}

func TestStatusListsVolumesWithoutPV(t *testing.T) {
	young := withKeptVolume()
	d := &young.Status.Disks[0]
	d.VolumesWithoutPV, d.BytesWithoutPV = 3, 768*mi+600*mi
	d.WithoutPV = append(d.WithoutPV, v1alpha1.VolumeWithoutPV{VolumeHandle: "nvme0:pvc-new", SizeBytes: 300 * mi,
		Since: metav1.NewTime(testNow.Add(-10 * time.Second)), NeverHadPV: true})
	out, _, err := runCommand(t, "default", nil, []runtime.Object{young}, "status")
	want := `NODE    DISK   CLASS  BACKEND  CAPACITY  USED  FREE  VOLUMES  HEALTH  USAGE                        OBSERVED
node-a  nvme0  nvme   file     4Gi       3Gi   1Gi   1        ok      [###############.....]  75%  3s ago

Volumes without a PersistentVolume (kept with their data; re-create a PV for one, or remove it with diskfit reclaim NODE VOLUME):
  node-a nvme0:pvc-kept 768Mi, claim shop/data-web-0, without a PV for 120m
  node-a nvme0:pvc-new 300Mi, claim -, without a PV for 10s (never had one: removed by the driver after the orphan grace period, unless its claim still waits for it)
  node-a/nvme0: 1 more
`
	checkResult(t, out, err, want, "")

	out, _, err = runCommand(t, "default", nil, []runtime.Object{young}, "status", "-o", "json")
	if err != nil || !strings.Contains(out, `"volumesWithoutPV": 3`) || !strings.Contains(out, `"volumeHandle": "nvme0:pvc-kept"`) {
		t.Errorf("status -o json: %v\n%s", err, out)
	}
}

// TestReclaim checks the PV reclaim makes, which Kubernetes' own reclaim
// path deletes with the volume (the e2e suite runs that path for real),
// and that reclaim refuses what it must not touch.
func TestReclaim(t *testing.T) {
	clients := &Clients{Kube: kubefake.NewClientset(), DiskFit: dffake.NewSimpleClientset(withKeptVolume())}
	run := func(args ...string) (string, error) {
		out, _, err := runWith(clients, "", args...)
		return out, err
	}

	if _, err := run("reclaim", "node-a", "nvme0:pvc-unknown"); err == nil || !strings.Contains(err.Error(), "does not report volume nvme0:pvc-unknown") {
		t.Errorf("reclaiming a volume the DiskNode does not list: %v", err)
	}
	if out, err := run("reclaim", "node-a", keptHandle, "--dry-run"); err != nil || !strings.Contains(out, "volumeHandle: "+keptHandle) {
		t.Errorf("dry run: %v\n%s", err, out)
	}
	if pvs, _ := clients.Kube.CoreV1().PersistentVolumes().List(context.Background(), metav1.ListOptions{}); len(pvs.Items) != 0 {
		t.Fatalf("the dry run created %d PVs", len(pvs.Items))
	}

	if _, err := run("reclaim", "node-a", keptHandle, "--timeout=0"); err != nil {
		t.Fatal(err)
	}
	pvs, err := clients.Kube.CoreV1().PersistentVolumes().List(context.Background(), metav1.ListOptions{})
	if err != nil || len(pvs.Items) != 1 {
		t.Fatalf("PVs after reclaim: %v, %v", pvs, err)
	}
	pv := pvs.Items[0]
	got := struct {
		Policy            v1.PersistentVolumeReclaimPolicy
		Driver, Handle    string
		ProvisionedBy     string
		Node              []string
		ClaimUIDSet       bool
		Size              int64
		ClaimNS, ClaimRef string
	}{
		pv.Spec.PersistentVolumeReclaimPolicy, pv.Spec.CSI.Driver, pv.Spec.CSI.VolumeHandle,
		pv.Annotations["pv.kubernetes.io/provisioned-by"],
		pv.Spec.NodeAffinity.Required.NodeSelectorTerms[0].MatchExpressions[0].Values,
		pv.Spec.ClaimRef.UID != "", pv.Spec.Capacity.Storage().Value(), pv.Spec.ClaimRef.Namespace, pv.Spec.ClaimRef.Name,
	}
	want := got
	want.Policy, want.Driver, want.Handle = v1.PersistentVolumeReclaimDelete, diskfit.DriverName, keptHandle
	want.ProvisionedBy, want.Node, want.ClaimUIDSet, want.Size = diskfit.DriverName, []string{"node-a"}, true, 768*mi
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("reclaim PV (-want +got):\n%s", diff)
	}
	if _, err := clients.Kube.CoreV1().PersistentVolumeClaims(pv.Spec.ClaimRef.Namespace).Get(context.Background(), pv.Spec.ClaimRef.Name, metav1.GetOptions{}); err == nil {
		t.Error("the PV's claim exists: the PV would not be Released")
	}

	// Now a PV refers to the volume: reclaim refuses.
	if _, err := run("reclaim", "node-a", keptHandle, "--timeout=0"); err == nil || !strings.Contains(err.Error(), "refers to volume") {
		t.Errorf("reclaiming a volume a PV refers to: %v", err)
	}
}

// A PV of another node with the same volume handle (disk names repeat
// across nodes) does not refer to this node's volume: reclaim makes its PV
// for this node's volume instead of telling the admin to delete the other
// node's PV, which would delete that node's live volume.
func TestReclaimIgnoresPVsOfOtherNodes(t *testing.T) {
	other := reclaimPV("node-b", v1alpha1.VolumeWithoutPV{VolumeHandle: keptHandle, SizeBytes: 768 * mi})
	other.Name = "pvc-live-on-node-b"
	other.Spec.CSI.VolumeAttributes = map[string]string{diskfit.VolumeContextDiskKey: "nvme0"}
	clients := &Clients{Kube: kubefake.NewClientset(other), DiskFit: dffake.NewSimpleClientset(withKeptVolume())}
	out, _, err := runWith(clients, "", "reclaim", "node-a", keptHandle, "--dry-run")
	if err != nil || !strings.Contains(out, "volumeHandle: "+keptHandle) || !strings.Contains(out, "- node-a") {
		t.Errorf("reclaiming node-a's volume beside node-b's PV of the same handle: %v\n%s", err, out)
	}
}

// A volume that never had a PV while the claim it was made for still
// exists and waits for it is one whose PV could not be saved yet (the API
// server, or diskfit-webhook's check of the nodes' PVs, was down): the
// driver keeps it, and reclaim refuses it too, unless forced, since the PV
// saved later would point at nothing (and a restore or clone would lose
// its copy). Once the claim is gone, reclaim goes ahead.
func TestReclaimRefusesAVolumeItsClaimWaitsFor(t *testing.T) {
	const uid = "0b5c3f2e-1111-2222-3333-444455556666"
	handle := "nvme0:pvc-" + uid
	d := disk("nvme0", "nvme", 4*gi, gi, 1)
	d.VolumesWithoutPV, d.BytesWithoutPV = 1, 300*mi
	d.WithoutPV = []v1alpha1.VolumeWithoutPV{{VolumeHandle: handle, SizeBytes: 300 * mi, Claim: "shop/data-0",
		Since: metav1.NewTime(testNow.Add(-time.Hour)), NeverHadPV: true}}
	claim := &v1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "data-0", UID: uid,
		Annotations: map[string]string{diskfit.SelectedNodeAnnotation: "node-a"}}}
	clients := &Clients{Kube: kubefake.NewClientset(claim), DiskFit: dffake.NewSimpleClientset(diskNode("node-a", 3*time.Second, d))}
	_, _, err := runWith(clients, "", "reclaim", "node-a", handle, "--timeout=0")
	if err == nil || !strings.Contains(err.Error(), "claim shop/data-0 still waits for volume "+handle) {
		t.Errorf("reclaiming a volume its claim waits for: %v, want a refusal naming the claim", err)
	}
	if pvs, _ := clients.Kube.CoreV1().PersistentVolumes().List(context.Background(), metav1.ListOptions{}); len(pvs.Items) != 0 {
		t.Fatalf("the refused reclaim created %d PVs", len(pvs.Items))
	}
	if _, _, err := runWith(clients, "", "reclaim", "node-a", handle, "--timeout=0", "--dry-run", "--force"); err != nil {
		t.Errorf("reclaim --force: %v", err)
	}

	// Bound to it under a PV that was deleted (the claim is Lost): the
	// data is the claim's, refused too.
	claim.Spec.VolumeName = "pvc-" + uid
	if _, err := clients.Kube.CoreV1().PersistentVolumeClaims("shop").Update(context.Background(), claim, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, _, err = runWith(clients, "", "reclaim", "node-a", handle, "--timeout=0")
	if err == nil || !strings.Contains(err.Error(), "re-create that PV") {
		t.Errorf("reclaiming the volume of a Lost claim: %v, want a refusal saying to re-create its PV", err)
	}
	// Made again under the same name, or gone: reclaim goes ahead.
	claim.UID, claim.Spec.VolumeName = "another-uid", ""
	if _, err := clients.Kube.CoreV1().PersistentVolumeClaims("shop").Update(context.Background(), claim, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := runWith(clients, "", "reclaim", "node-a", handle, "--timeout=0", "--dry-run"); err != nil {
		t.Errorf("reclaiming a volume whose claim was made again: %v", err)
	}
	if err := clients.Kube.CoreV1().PersistentVolumeClaims("shop").Delete(context.Background(), "data-0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := runWith(clients, "", "reclaim", "node-a", handle, "--timeout=0"); err != nil {
		t.Errorf("reclaiming a volume whose claim is gone: %v", err)
	}
}

// A reclaim whose deletion does not happen in time (DeleteVolume refused:
// the volume is still staged, a snapshot depends on it, the disk is
// unhealthy) leaves no deletion pending behind it: its PV is taken back
// (reclaim policy Retain, then deleted), so that a PV an admin re-creates
// for the volume later cannot have its data deleted from under it when
// the provisioner's retry finally succeeds. The error says why, from the
// PV's last warning.
func TestReclaimTakesBackADeletionThatDoesNotHappen(t *testing.T) {
	clients := &Clients{Kube: kubefake.NewClientset(), DiskFit: dffake.NewSimpleClientset(withKeptVolume())}
	pvName := reclaimPV("node-a", withKeptVolume().Status.Disks[0].WithoutPV[0]).Name
	_, err := clients.Kube.CoreV1().Events(metav1.NamespaceDefault).Create(context.Background(), &v1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: pvName + ".1", Namespace: metav1.NamespaceDefault},
		InvolvedObject: v1.ObjectReference{Kind: "PersistentVolume", Name: pvName},
		Type:           v1.EventTypeWarning, Reason: "VolumeFailedDelete",
		Message: "rpc error: code = FailedPrecondition desc = volume is still staged",
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = runWith(clients, "", "reclaim", "node-a", keptHandle, "--timeout=2s")
	if err == nil || !strings.Contains(err.Error(), "not deleted") || !strings.Contains(err.Error(), "volume is still staged") {
		t.Errorf("reclaim whose PV stays: %v; want it to say the volume was not deleted, and why", err)
	}
	pvs, err := clients.Kube.CoreV1().PersistentVolumes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, pv := range pvs.Items {
		if pv.Spec.PersistentVolumeReclaimPolicy == v1.PersistentVolumeReclaimDelete {
			t.Errorf("reclaim gave up and left PV %s, reclaim policy Delete, for volume %s: its deletion is still pending", pv.Name, pv.Spec.CSI.VolumeHandle)
		}
	}
	// Deleted with reclaim policy Delete, the PV would still take the
	// volume with it (external-provisioner's finalizer): Retain first.
	w := writes(clients)
	if patched, deleted := slices.Index(w, "patch persistentvolumes "+pvName), slices.Index(w, "delete persistentvolumes "+pvName); patched < 0 || deleted < patched {
		t.Errorf("reclaim took its PV back with writes %q; want it set to Retain before it is deleted", w)
	}
}
