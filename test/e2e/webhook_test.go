package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/scheduler-plugin/webhook"
)

// The webhook, run in this process with the certificate it makes itself,
// registered with the API server through the MutatingWebhookConfiguration
// of manifests/webhook (pointed at this process and at one fresh namespace,
// so no other test's pods are affected): a pod with a diskfit claim gets
// diskfit-scheduler and is placed by it; a pod with another driver's claim,
// and an opted-out pod, keep the default scheduler; with the webhook gone,
// pods are still created, unchanged.
//
// The API server calls https://127.0.0.1:<port>, so this needs the local
// cluster, whose API server runs on this host. On kind, the manifests'
// Deployment is the way to run the webhook; this test skips there.
func TestWebhookSetsTheSchedulerOfDiskFitPods(t *testing.T) {
	if localDir == "" {
		t.Skip("the API server must reach this test process at 127.0.0.1, which only the local cluster's does; on kind, deploy manifests/webhook")
	}
	ns := newNamespace(t)
	class := newStorageClass(t, "")
	newPVC(t, ns, "data", class, 300*mi)
	newPVC(t, ns, "other", otherDriverClass(t), 300*mi)

	// The volume webhook too, for no PV of this test but its probe.
	stop := serveWebhook(t, ns, fmt.Sprintf("object.metadata.name.startsWith('%s')", ns))
	waitForWebhook(t, ns, "data")

	mutated := createPod(t, ns, podSpec("diskfit", "", "data"))
	if mutated.Spec.SchedulerName != diskfit.SchedulerName {
		t.Errorf("pod with a diskfit claim: schedulerName %q, want %q", mutated.Spec.SchedulerName, diskfit.SchedulerName)
	}
	other := createPod(t, ns, podSpec("other", "", "other"))
	if other.Spec.SchedulerName != defaultScheduler {
		t.Errorf("pod with another driver's claim: schedulerName %q, want %q", other.Spec.SchedulerName, defaultScheduler)
	}
	optedOut := podSpec("opted-out", "", "data")
	optedOut.Labels[webhook.OptOutKey] = webhook.OptOutValue
	if got := createPod(t, ns, optedOut); got.Spec.SchedulerName != defaultScheduler {
		t.Errorf("opted-out pod: schedulerName %q, want %q", got.Spec.SchedulerName, defaultScheduler)
	}
	placed := waitPodScheduled(t, ns, mutated.Name, 2*time.Minute)
	t.Logf("diskfit-scheduler placed %s on %s", placed.Name, placed.Spec.NodeName)

	// failurePolicy Ignore: nobody answers at the URL any more, and pods
	// are created all the same.
	stop()
	unserved := createPod(t, ns, podSpec("unserved", "", "data"))
	if unserved.Spec.SchedulerName != defaultScheduler {
		t.Errorf("pod created with the webhook down: schedulerName %q, want it unchanged, %q", unserved.Spec.SchedulerName, defaultScheduler)
	}
}

// waitForWebhook waits until the API server calls the webhook for a pod
// of ns with the diskfit claim: the webhook publishes its caBundle itself
// once it runs, and the API server picks it up from its own informer. A dry
// run that comes back with diskfit-scheduler shows it.
func waitForWebhook(t *testing.T, ns, claim string) {
	t.Helper()
	probe := podSpec("probe", "", claim)
	err := wait.PollUntilContextTimeout(ctxFor(t, 3*time.Minute), 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		pod, err := kube.CoreV1().Pods(ns).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil && pod.Spec.SchedulerName == diskfit.SchedulerName, err
	})
	if err != nil {
		t.Fatalf("the API server does not call the webhook: %v", err)
	}
}

// otherDriverClass creates a StorageClass of a provisioner that is not
// diskfit's.
func otherDriverClass(t *testing.T) string {
	t.Helper()
	created, err := kube.StorageV1().StorageClasses().Create(ctxFor(t, time.Minute), &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{GenerateName: "other-"},
		Provisioner:       "example.com/not-diskfit",
		VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer),
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = kube.StorageV1().StorageClasses().Delete(context.Background(), created.Name, metav1.DeleteOptions{})
	})
	return created.Name
}

// readManifest decodes the file manifests/path, strictly, into obj.
func readManifest(t *testing.T, path string, obj any) {
	t.Helper()
	raw, err := os.ReadFile("../../manifests/" + path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(raw, obj); err != nil {
		t.Fatal(err)
	}
}

// registerWebhook creates the MutatingWebhookConfiguration of
// manifests/webhook under name, calling url, for the pods of namespace ns
// only. Its caBundle is left to the webhook.
func registerWebhook(t *testing.T, name, ns, url string) {
	t.Helper()
	config := &admissionregistrationv1.MutatingWebhookConfiguration{}
	readManifest(t, "webhook/mutatingwebhookconfiguration.yaml", config)
	config.Name = name
	for i := range config.Webhooks {
		w := &config.Webhooks[i]
		w.ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: ptr.To(url)}
		w.NamespaceSelector.MatchLabels = map[string]string{v1.LabelMetadataName: ns}
	}
	configs := kube.AdmissionregistrationV1().MutatingWebhookConfigurations()
	if _, err := configs.Create(ctxFor(t, time.Minute), config, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := configs.Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("deleting MutatingWebhookConfiguration %s: %v", name, err)
		}
	})
}

// diskfit-webhook can write the caBundle of its webhook configurations and
// nothing else of them: with the webhook's own ServiceAccount token, an
// update of the caBundle passes, and updates that would widen what it is
// asked about (another operation, failing closed, no namespace selector),
// or let the nodes' PVs pass unchecked (failing open, fewer match
// conditions), are refused by the manifests' admission policy.
func TestWebhookCanOnlyWriteItsCABundle(t *testing.T) {
	ctx := ctxFor(t, 2*time.Minute)
	// The manifests' configuration under its own name (the webhook's
	// role may update only that one), for a namespace that has no pods;
	// on a cluster where manifests/webhook is deployed (kind), the
	// deployed one, whose caBundle is then written back unchanged so that
	// the running webhook keeps working.
	caBundle := []byte("a CA")
	deployed, err := kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "diskfit-webhook", metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		registerWebhook(t, "diskfit-webhook", "no-such-namespace", "https://127.0.0.1:1/mutate")
	case err != nil:
		t.Fatal(err)
	default:
		caBundle = deployed.Webhooks[0].ClientConfig.CABundle
	}
	tr, err := kube.CoreV1().ServiceAccounts("diskfit-system").CreateToken(ctx, "diskfit-webhook", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(restConfig)
	cfg.BearerToken = tr.Status.Token
	asWebhook, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	configs := asWebhook.AdmissionregistrationV1().MutatingWebhookConfigurations()
	for _, tt := range []struct {
		name   string
		change func(w *admissionregistrationv1.MutatingWebhook)
		allow  bool
	}{
		{"its caBundle", func(w *admissionregistrationv1.MutatingWebhook) { w.ClientConfig.CABundle = caBundle }, true},
		{"another operation", func(w *admissionregistrationv1.MutatingWebhook) {
			w.Rules[0].Operations = append(w.Rules[0].Operations, admissionregistrationv1.Update)
		}, false},
		{"failing closed", func(w *admissionregistrationv1.MutatingWebhook) {
			w.FailurePolicy = ptr.To(admissionregistrationv1.Fail)
		}, false},
		{"every namespace", func(w *admissionregistrationv1.MutatingWebhook) { w.NamespaceSelector = &metav1.LabelSelector{} }, false},
	} {
		err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			got, err := configs.Get(ctx, "diskfit-webhook", metav1.GetOptions{})
			if err != nil {
				return false, nil // the role's binding may not have reached the authorizer yet
			}
			tt.change(&got.Webhooks[0])
			_, err = configs.Update(ctx, got, metav1.UpdateOptions{})
			switch {
			case tt.allow && err != nil:
				t.Errorf("the webhook updating %s: %v", tt.name, err)
			case !tt.allow && (err == nil || !strings.Contains(err.Error(), "may change only the caBundle")):
				t.Errorf("the webhook updating %s: %v, want the admission policy's refusal", tt.name, err)
			}
			return true, nil
		})
		if err != nil {
			t.Fatalf("the webhook cannot read its configuration: %v", err)
		}
	}

	// The same for its ValidatingWebhookConfiguration of the nodes' PVs,
	// registered here for no request at all.
	validatingBundle := []byte("a CA")
	deployedVolumes, err := kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, "diskfit-node-volumes", metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		registerVolumeWebhook(t, "diskfit-node-volumes", "https://127.0.0.1:1/validate-volume", "false")
	case err != nil:
		t.Fatal(err)
	default:
		validatingBundle = deployedVolumes.Webhooks[0].ClientConfig.CABundle
	}
	validating := asWebhook.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	for _, tt := range []struct {
		name   string
		change func(w *admissionregistrationv1.ValidatingWebhook)
		allow  bool
	}{
		{"its caBundle", func(w *admissionregistrationv1.ValidatingWebhook) { w.ClientConfig.CABundle = validatingBundle }, true},
		{"failing open", func(w *admissionregistrationv1.ValidatingWebhook) {
			w.FailurePolicy = ptr.To(admissionregistrationv1.Ignore)
		}, false},
		{"fewer requests", func(w *admissionregistrationv1.ValidatingWebhook) { w.MatchConditions = w.MatchConditions[1:] }, false},
	} {
		got, err := validating.Get(ctx, "diskfit-node-volumes", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("the webhook reading its validating configuration: %v", err)
		}
		tt.change(&got.Webhooks[0])
		_, err = validating.Update(ctx, got, metav1.UpdateOptions{})
		switch {
		case tt.allow && err != nil:
			t.Errorf("the webhook updating %s of its validating configuration: %v", tt.name, err)
		case !tt.allow && (err == nil || !strings.Contains(err.Error(), "may change only the caBundle")):
			t.Errorf("the webhook updating %s of its validating configuration: %v, want the admission policy's refusal", tt.name, err)
		}
	}
}
