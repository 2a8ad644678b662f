package e2e

import (
	"context"
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/diskfit/diskfit/apis/client/clientset/versioned"
	"github.com/diskfit/diskfit/apis/diskfit"
)

// A node's driver writes only its own node's DiskNode: with node-a's
// driver token (bound to the Node node-a, as a DaemonSet pod's token is
// bound to its pod on that node), rewriting node-a's status passes, and
// node-b's is refused by the manifests' admission policy, as is any write
// with a token of the node ServiceAccount bound to no node.
func TestNodeWritesOnlyItsOwnDiskNode(t *testing.T) {
	needLocal(t)
	ctx := ctxFor(t, 2*time.Minute)
	cfg := nodeAConfig(t)
	asNodeA, err := versioned.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := kube.CoreV1().ServiceAccounts("diskfit-system").CreateToken(ctx, "diskfit-csi-node", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	unbound := rest.AnonymousClientConfig(restConfig)
	unbound.BearerToken = tr.Status.Token
	asNoNode, err := versioned.NewForConfig(unbound)
	if err != nil {
		t.Fatal(err)
	}
	// rewrite writes a DiskNode's status back as it is: the write, not
	// its content, is what the policy judges.
	rewrite := func(client versioned.Interface, node string) error {
		return retry.RetryOnConflict(retry.DefaultRetry, func() error {
			dn, err := client.DiskfitV1alpha1().DiskNodes().Get(ctx, node, metav1.GetOptions{})
			if err != nil {
				return err
			}
			_, err = client.DiskfitV1alpha1().DiskNodes().UpdateStatus(context.Background(), dn, metav1.UpdateOptions{})
			return err
		})
	}
	refused := func(what string, err error) {
		t.Helper()
		if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "may write only the DiskNode of the node its token is bound to") {
			t.Errorf("%s: %v, want the admission policy's refusal", what, err)
		}
	}
	if err := rewrite(asNodeA, "node-a"); err != nil {
		t.Errorf("node-a's driver writing node-a's DiskNode: %v", err)
	}
	refused("node-a's driver writing node-b's DiskNode", rewrite(asNodeA, "node-b"))
	refused("a token bound to no node writing node-a's DiskNode", rewrite(asNoNode, "node-a"))
}

// A node's driver changes only its own node's volumes: with node-a's
// driver token, the node ServiceAccount (whose RBAC, external-provisioner's
// and external-resizer's, grants PV create, patch and delete and claim
// update cluster-wide) creates and deletes PVs on node-a only; of a PV on
// node-b it may patch the capacity (the leader-elected resizer's write)
// but not its reclaim policy, claimRef, finalizers or CSI source, and not
// delete it; no claim gets an owner reference from it. Otherwise root on
// node-a could set node-b's PV to Delete and release it, and node-b's own
// provisioner would delete the data.
func TestNodeChangesOnlyItsOwnVolumes(t *testing.T) {
	needLocal(t)
	ctx := ctxFor(t, 2*time.Minute)
	cfg := nodeAConfig(t)
	asNodeA, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	const class = "e2e-node-volumes" // no StorageClass: nothing binds these PVs
	pvOn := func(name, node string) *v1.PersistentVolume { return nodePV(name, node, class) }
	// Later tests count every PV of the driver: these go before the
	// test ends.
	cleanup := func(name string) {
		t.Cleanup(func() {
			ctx := ctxFor(t, time.Minute)
			_ = kube.CoreV1().PersistentVolumes().Delete(ctx, name, metav1.DeleteOptions{})
			err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
				_, err := kube.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
				return apierrors.IsNotFound(err), nil
			})
			if err != nil {
				t.Errorf("PV %s not gone: %v", name, err)
			}
		})
	}
	refused := func(what string, err error) {
		t.Helper()
		if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "the diskfit node driver may") {
			t.Errorf("%s: %v, want the admission policy's refusal", what, err)
		}
	}
	patchPV := func(name, patch string) error {
		_, err := asNodeA.CoreV1().PersistentVolumes().Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		return err
	}

	cleanup("e2e-own-b")
	_, err = asNodeA.CoreV1().PersistentVolumes().Create(ctx, pvOn("e2e-own-b", "node-b"), metav1.CreateOptions{})
	refused("node-a's driver creating a PV on node-b", err)
	cleanup("e2e-own-a")
	if _, err := asNodeA.CoreV1().PersistentVolumes().Create(ctx, pvOn("e2e-own-a", "node-a"), metav1.CreateOptions{}); err != nil {
		t.Errorf("node-a's driver creating a PV on node-a: %v", err)
	} else {
		// Not even of its own PVs may a node choose the claim: pointed at
		// another tenant's pending claim, or left for any claim, the PV
		// would be bound to it and the pod would follow.
		refused("node-a's driver pointing its own PV at another claim",
			patchPV("e2e-own-a", `{"spec":{"claimRef":{"namespace":"default","name":"someone-else","uid":"00000000-0000-0000-0000-000000000001"}}}`))
		// Nor have the PV controller take the claimRef off once its claim
		// is bound elsewhere, or move it to the claims of another class.
		refused("node-a's driver marking its own PV as bound by the PV controller",
			patchPV("e2e-own-a", `{"metadata":{"annotations":{"pv.kubernetes.io/bound-by-controller":"yes"}}}`))
		refused("node-a's driver changing the class of its own PV",
			patchPV("e2e-own-a", `{"spec":{"storageClassName":"other"}}`))
		if err := asNodeA.CoreV1().PersistentVolumes().Delete(ctx, "e2e-own-a", metav1.DeleteOptions{}); err != nil {
			t.Errorf("node-a's driver deleting its PV: %v", err)
		}
	}

	cleanup("e2e-other-b")
	if _, err := kube.CoreV1().PersistentVolumes().Create(ctx, pvOn("e2e-other-b", "node-b"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	refused("node-a's driver setting reclaim policy Delete on node-b's PV",
		patchPV("e2e-other-b", `{"spec":{"persistentVolumeReclaimPolicy":"Delete"}}`))
	refused("node-a's driver pointing node-b's PV at another claim",
		patchPV("e2e-other-b", `{"spec":{"claimRef":{"namespace":"default","name":"someone-else","uid":"00000000-0000-0000-0000-000000000001"}}}`))
	refused("node-a's driver adding a finalizer to node-b's PV",
		patchPV("e2e-other-b", `{"metadata":{"finalizers":["example.com/hold"]}}`))
	refused("node-a's driver deleting node-b's PV",
		asNodeA.CoreV1().PersistentVolumes().Delete(ctx, "e2e-other-b", metav1.DeleteOptions{}))
	if err := patchPV("e2e-other-b", `{"spec":{"capacity":{"storage":"2Gi"}}}`); err != nil {
		t.Errorf("node-a's driver patching the capacity of node-b's PV (the resizer's write): %v", err)
	}
	// Every node's external-provisioner adds its finalizer to the
	// driver's PVs of policy Delete and removes it from those of policy
	// Retain: a PV of a node that is down must still lose it.
	const provisionerFinalizer = "external-provisioner.volume.kubernetes.io/finalizer"
	setFinalizer := func(on bool) error {
		return retry.RetryOnConflict(retry.DefaultRetry, func() error {
			pv, err := asNodeA.CoreV1().PersistentVolumes().Get(ctx, "e2e-other-b", metav1.GetOptions{})
			if err != nil {
				return err
			}
			fins := slices.DeleteFunc(pv.Finalizers, func(f string) bool { return f == provisionerFinalizer })
			if on {
				fins = append(fins, provisionerFinalizer)
			}
			// As the provisioner does: a patch of the whole list (the
			// role has no update).
			patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"finalizers": fins, "resourceVersion": pv.ResourceVersion}})
			return patchPV(pv.Name, string(patch))
		})
	}
	if err := setFinalizer(true); err != nil {
		t.Errorf("node-a's driver adding external-provisioner's finalizer to node-b's PV: %v", err)
	}
	if err := setFinalizer(false); err != nil {
		t.Errorf("node-a's driver removing external-provisioner's finalizer from node-b's Retain PV: %v", err)
	}
	pv, err := kube.CoreV1().PersistentVolumes().Get(ctx, "e2e-other-b", metav1.GetOptions{})
	if err != nil || pv.Spec.PersistentVolumeReclaimPolicy != v1.PersistentVolumeReclaimRetain || pv.Spec.ClaimRef != nil {
		t.Errorf("node-b's PV after node-a's writes: %+v, %v", pv, err)
	}

	pvc := &v1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-node-owner", Namespace: "default"},
		Spec: v1.PersistentVolumeClaimSpec{
			StorageClassName: ptr.To(class),
			AccessModes:      []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			Resources:        v1.VolumeResourceRequirements{Requests: v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}
	if _, err := kube.CoreV1().PersistentVolumeClaims("default").Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = kube.CoreV1().PersistentVolumeClaims("default").Delete(context.Background(), pvc.Name, metav1.DeleteOptions{})
	})
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		got, err := asNodeA.CoreV1().PersistentVolumeClaims("default").Get(ctx, pvc.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		got.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "gone", UID: "00000000-0000-0000-0000-000000000002"}}
		_, err = asNodeA.CoreV1().PersistentVolumeClaims("default").Update(ctx, got, metav1.UpdateOptions{})
		return err
	})
	refused("node-a's driver giving a claim an owner", err)
	// The status subresource (the resizer's) keeps metadata changes too.
	_, err = asNodeA.CoreV1().PersistentVolumeClaims("default").Patch(ctx, pvc.Name, types.MergePatchType,
		[]byte(`{"metadata":{"ownerReferences":[{"apiVersion":"v1","kind":"ConfigMap","name":"gone","uid":"00000000-0000-0000-0000-000000000002"}]}}`),
		metav1.PatchOptions{}, "status")
	refused("node-a's driver giving a claim an owner through its status", err)
	if got, err := kube.CoreV1().PersistentVolumeClaims("default").Get(ctx, pvc.Name, metav1.GetOptions{}); err != nil || len(got.OwnerReferences) != 0 {
		t.Errorf("claim after node-a's writes: owners %v, %v", got.OwnerReferences, err)
	}

	// A node may not steer a claim to itself (its provisioner would make
	// the volume there, and the pod and its data would follow), nor opt a
	// claim in to release: selected-node and diskfit's annotations come
	// from the scheduler and the claim's owner. Its provisioner only
	// removes selected-node naming its own node, to have the pod
	// rescheduled.
	// As external-provisioner writes a claim (update; its role has no
	// patch) and external-resizer its status (patch).
	setAnnotation := func(key string, value *string) error {
		return retry.RetryOnConflict(retry.DefaultRetry, func() error {
			got, err := asNodeA.CoreV1().PersistentVolumeClaims("default").Get(ctx, pvc.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if value == nil {
				delete(got.Annotations, key)
			} else {
				metav1.SetMetaDataAnnotation(&got.ObjectMeta, key, *value)
			}
			_, err = asNodeA.CoreV1().PersistentVolumeClaims("default").Update(ctx, got, metav1.UpdateOptions{})
			return err
		})
	}
	refused("node-a's driver writing its node into a claim",
		setAnnotation(diskfit.SelectedNodeAnnotation, ptr.To("node-a")))
	_, err = asNodeA.CoreV1().PersistentVolumeClaims("default").Patch(ctx, pvc.Name, types.MergePatchType,
		[]byte(`{"metadata":{"annotations":{"volume.kubernetes.io/selected-node":"node-a"}}}`), metav1.PatchOptions{}, "status")
	refused("node-a's driver writing its node into a claim through its status", err)
	refused("node-a's driver opting a claim in to release",
		setAnnotation(diskfit.OnDiskLossAnnotation, ptr.To(diskfit.OnDiskLossRelease)))
	setNode := func(node string) {
		t.Helper()
		if _, err := kube.CoreV1().PersistentVolumeClaims("default").Patch(ctx, pvc.Name, types.MergePatchType,
			[]byte(`{"metadata":{"annotations":{"volume.kubernetes.io/selected-node":"`+node+`"}}}`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	setNode("node-b")
	refused("node-a's driver taking node-b's selected-node off a claim",
		setAnnotation(diskfit.SelectedNodeAnnotation, nil))
	refused("node-a's driver moving a claim from node-b to itself",
		setAnnotation(diskfit.SelectedNodeAnnotation, ptr.To("node-a")))
	// Nor bind an unbound claim to a PV of its choosing (the API server
	// lets volumeName be set once).
	unbound := pvc.DeepCopy()
	unbound.Name, unbound.ResourceVersion, unbound.Spec.StorageClassName = "e2e-node-unbound", "", ptr.To("e2e-node-nothing")
	if _, err := kube.CoreV1().PersistentVolumeClaims("default").Create(ctx, unbound, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = kube.CoreV1().PersistentVolumeClaims("default").Delete(context.Background(), unbound.Name, metav1.DeleteOptions{})
	})
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		got, err := asNodeA.CoreV1().PersistentVolumeClaims("default").Get(ctx, unbound.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		got.Spec.VolumeName = "e2e-own-a"
		_, err = asNodeA.CoreV1().PersistentVolumeClaims("default").Update(ctx, got, metav1.UpdateOptions{})
		return err
	})
	refused("node-a's driver binding a claim to a PV of its choosing", err)
	setNode("node-a")
	if err := setAnnotation(diskfit.SelectedNodeAnnotation, nil); err != nil {
		t.Errorf("node-a's driver taking its own node off a claim (its provisioner's reschedule): %v", err)
	}
	if got, err := kube.CoreV1().PersistentVolumeClaims("default").Get(ctx, pvc.Name, metav1.GetOptions{}); err != nil ||
		got.Annotations[diskfit.SelectedNodeAnnotation] != "" || got.Annotations[diskfit.OnDiskLossAnnotation] != "" {
		t.Errorf("claim after node-a's writes: annotations %v, %v", got.Annotations, err)
	}
}

// A node's snapshotter changes only its own node's snapshot contents (the
// ones snapshot-controller labelled managed-by that node): with node-a's
// driver token, pointing node-b's content at another snapshot or setting
// its deletion policy to Delete is refused, while node-a's own passes.
func TestNodeChangesOnlyItsOwnSnapshotContents(t *testing.T) {
	needLocal(t)
	ctx := ctxFor(t, 2*time.Minute)
	cfg := nodeAConfig(t)
	asNodeA, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := dynamic.NewForConfig(restConfig)
	if err != nil {
		t.Fatal(err)
	}
	content := func(name, node string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
			"metadata": map[string]any{"name": name, "labels": map[string]any{"snapshot.storage.kubernetes.io/managed-by": node}},
			"spec": map[string]any{
				"deletionPolicy": "Retain", "driver": diskfit.DriverName,
				"source":            map[string]any{"snapshotHandle": "none:" + name},
				"volumeSnapshotRef": map[string]any{"namespace": "default", "name": name},
			},
		}}
	}
	for _, c := range []*unstructured.Unstructured{content("e2e-content-a", "node-a"), content("e2e-content-b", "node-b")} {
		if _, err := admin.Resource(volumeSnapshotContents).Create(ctx, c, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		name := c.GetName()
		t.Cleanup(func() {
			_ = admin.Resource(volumeSnapshotContents).Delete(context.Background(), name, metav1.DeleteOptions{})
		})
	}
	patch := func(name, p string, sub ...string) error {
		_, err := asNodeA.Resource(volumeSnapshotContents).Patch(ctx, name, types.MergePatchType, []byte(p), metav1.PatchOptions{}, sub...)
		return err
	}
	refused := func(what string, err error) {
		t.Helper()
		if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "may update only the snapshot contents of the node") {
			t.Errorf("%s: %v, want the admission policy's refusal", what, err)
		}
	}
	refused("node-a's driver setting node-b's content to deletion policy Delete",
		patch("e2e-content-b", `{"spec":{"deletionPolicy":"Delete"}}`))
	refused("node-a's driver pointing node-b's content at another snapshot",
		patch("e2e-content-b", `{"status":{"snapshotHandle":"elsewhere:someone-elses"}}`, "status"))
	refused("node-a's driver taking node-b's content as its own",
		patch("e2e-content-b", `{"metadata":{"labels":{"snapshot.storage.kubernetes.io/managed-by":"node-a"}}}`))
	if err := patch("e2e-content-a", `{"metadata":{"annotations":{"e2e.diskfit.io/touched":"yes"}}}`); err != nil {
		t.Errorf("node-a's driver updating its own node's content: %v", err)
	}
	got, err := admin.Resource(volumeSnapshotContents).Get(ctx, "e2e-content-b", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if policy, _, _ := unstructured.NestedString(got.Object, "spec", "deletionPolicy"); policy != "Retain" {
		t.Errorf("node-b's content has deletion policy %q after node-a's writes, want Retain", policy)
	}
}

// nodeAConfig is the client config of node-a's driver: its token is bound
// to the Node node-a, as a DaemonSet pod's is bound to its pod there.
func nodeAConfig(t *testing.T) *rest.Config {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(localDir, "kubeconfig-diskfit-system-diskfit-csi-node-node-a"))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}
