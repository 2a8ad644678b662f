package e2e

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/scheduler-plugin/webhook"
)

// A node's driver creates PVs only for claims scheduled to its node: with
// diskfit-webhook's validating webhook registered (from manifests/webhook,
// served by this process, for this test's claims only), node-a's PV
// pre-bound to another tenant's claim that no scheduler has placed, or that
// it placed on node-b, is refused, as is a PV pre-bound to no claim, while
// the provisioners' own PVs pass: a pod's claim is provisioned and bound,
// and so is the claim placed on node-b, by node-b's provisioner.
// Without the webhook the first PV was created and the PV controller bound
// the pending claim to it, although it waits for its first consumer: root
// on node-a would have had the claim's pod, and its data, follow.
func TestNodeCreatesPVsOnlyForClaimsScheduledToIt(t *testing.T) {
	needLocal(t)
	ctx := ctxFor(t, 4*time.Minute)
	asNodeA, err := kubernetes.NewForConfig(nodeAConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	ns := newNamespace(t)
	class := newStorageClass(t, "")
	serveWebhook(t, ns, fmt.Sprintf("has(object.spec.claimRef) ? object.spec.claimRef.namespace == '%s' : object.metadata.name.startsWith('%s')", ns, ns))

	// The provisioner's own PV passes: a pod's claim is provisioned and
	// bound once diskfit-scheduler placed it.
	newPVC(t, ns, "data", class, 300*mi)
	createPod(t, ns, podSpec("app", diskfit.SchedulerName, "data"))
	waitPVCsBound(t, ns, []string{"data"}, 2*time.Minute)
	waitPodRunning(t, ns, "app", 2*time.Minute)

	unplaced := newPVC(t, ns, "unplaced", class, 300*mi)
	// Placed on node-b by hand: node-b's provisioner provisions it.
	elsewhere := claim("elsewhere", class, 300*mi)
	elsewhere.Annotations = map[string]string{diskfit.SelectedNodeAnnotation: "node-b"}
	elsewhere, err = kube.CoreV1().PersistentVolumeClaims(ns).Create(ctx, elsewhere, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		pvc  *v1.PersistentVolumeClaim
		want string
	}{
		{unplaced, "claim " + ns + "/unplaced is scheduled to no node"},
		{elsewhere, "claim " + ns + "/elsewhere is scheduled to node-b"},
	} {
		// Named, sized and classed as the provisioner's own PV would be.
		pvc := tt.pvc
		pv := nodePV("pvc-"+string(pvc.UID), "node-a", class)
		pv.Spec.ClaimRef = &v1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1",
			Namespace: pvc.Namespace, Name: pvc.Name, UID: pvc.UID}
		_, err := asNodeA.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{})
		if err == nil {
			deletePVAtEnd(t, pv.Name)
			bound := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 15*time.Second, true, func(ctx context.Context) (bool, error) {
				got, err := kube.CoreV1().PersistentVolumeClaims(ns).Get(ctx, pvc.Name, metav1.GetOptions{})
				return err == nil && got.Spec.VolumeName == pv.Name, nil
			}) == nil
			t.Errorf("node-a's driver created PV %s pre-bound to claim %s (selected node %q); the claim was bound to it: %v",
				pv.Name, pvc.Name, pvc.Annotations[diskfit.SelectedNodeAnnotation], bound)
			continue
		}
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "only for a claim scheduled to node-a") || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("node-a's driver creating a PV for claim %s: %v, want the webhook's refusal", pvc.Name, err)
		}
	}
	static := nodePV(ns+"-static", "node-a", class)
	if _, err := asNodeA.CoreV1().PersistentVolumes().Create(ctx, static, metav1.CreateOptions{}); err == nil {
		deletePVAtEnd(t, static.Name)
		t.Errorf("node-a's driver created PV %s pre-bound to no claim", static.Name)
	} else if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "names no claim") {
		t.Errorf("node-a's driver creating a PV for no claim: %v, want the webhook's refusal", err)
	}
	// node-b's provisioner's own PV for the claim placed there passes.
	pvc := waitPVCsBound(t, ns, []string{"elsewhere"}, 2*time.Minute)["elsewhere"]
	if pvc.Spec.VolumeName != "pvc-"+string(elsewhere.UID) {
		t.Errorf("claim elsewhere bound to %s, want node-b's PV pvc-%s", pvc.Spec.VolumeName, elsewhere.UID)
	}
}

// serveWebhook runs diskfit-webhook in this process until the test ends,
// registered with the manifests' webhook configurations pointed at it: the
// mutating one for the pods of namespace ns, the validating one of the
// node driver's PVs for those that also match the CEL expression scope.
// stop, also called when the test ends, stops serving.
func serveWebhook(t *testing.T, ns, scope string) (stop func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "https://" + ln.Addr().String()
	mutating, validating := "diskfit-webhook-"+ns, "diskfit-node-volumes-"+ns
	registerWebhook(t, mutating, ns, url+webhook.MutatePath)
	registerVolumeWebhook(t, validating, url+webhook.ValidateVolumePath, scope)
	s, err := webhook.New(webhook.Config{
		Client:                  kube,
		Namespace:               ns,
		Hosts:                   []string{"127.0.0.1"},
		SecretName:              "diskfit-webhook-cert",
		WebhookConfigName:       mutating,
		VolumeWebhookConfigName: validating,
		Address:                 ln.Addr().String(),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, ln) }()
	stop = sync.OnceFunc(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("webhook: %v", err)
		}
	})
	t.Cleanup(stop)
	// The API server calls the webhook once it has the caBundle the
	// webhook publishes: a dry run of a PV for no claim is refused then.
	probe := nodePV(ns+"-probe", "node-a", "")
	asNodeA, err := kubernetes.NewForConfig(nodeAConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctxFor(t, 3*time.Minute), 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := asNodeA.CoreV1().PersistentVolumes().Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), "names no claim"), nil
	})
	if err != nil {
		t.Fatalf("the API server does not call the volume webhook: %v", err)
	}
	return stop
}

// registerVolumeWebhook creates the ValidatingWebhookConfiguration of
// manifests/webhook under name, calling url, for the PVs that also match
// the CEL expression scope. Its caBundle is left to the webhook.
func registerVolumeWebhook(t *testing.T, name, url, scope string) {
	t.Helper()
	config := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	readManifest(t, "webhook/validatingwebhookconfiguration.yaml", config)
	config.Name = name
	for i := range config.Webhooks {
		w := &config.Webhooks[i]
		w.ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: ptr.To(url)}
		w.MatchConditions = append(w.MatchConditions, admissionregistrationv1.MatchCondition{Name: "test-scope", Expression: scope})
	}
	configs := kube.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	if _, err := configs.Create(ctxFor(t, time.Minute), config, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := configs.Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("deleting ValidatingWebhookConfiguration %s: %v", name, err)
		}
	})
}

// nodePV is a PV of the diskfit driver on node, of class, on a disk the
// node serves, so that its driver does not report the PV's disk as not
// served.
func nodePV(name, node, class string) *v1.PersistentVolume {
	dn, err := diskfitAPI.DiskfitV1alpha1().DiskNodes().Get(context.Background(), node, metav1.GetOptions{})
	disk := "disk0"
	if err == nil && len(dn.Status.Disks) > 0 {
		disk = dn.Status.Disks[0].Name
	}
	return &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1.PersistentVolumeSpec{
			Capacity:                      v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: v1.PersistentVolumeReclaimRetain,
			StorageClassName:              class,
			PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{
				Driver: diskfit.DriverName, VolumeHandle: disk + ":" + name,
				VolumeAttributes: map[string]string{diskfit.VolumeContextDiskKey: disk}}},
			NodeAffinity: &v1.VolumeNodeAffinity{Required: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
				MatchExpressions: []v1.NodeSelectorRequirement{{Key: diskfit.TopologyKey, Operator: v1.NodeSelectorOpIn, Values: []string{node}}},
			}}}},
		},
	}
}

// deletePVAtEnd deletes PV name, as the cluster admin, when the test ends.
func deletePVAtEnd(t *testing.T, name string) {
	t.Cleanup(func() {
		_ = kube.CoreV1().PersistentVolumes().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}
