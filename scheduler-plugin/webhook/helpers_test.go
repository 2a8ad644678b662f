package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/diskfit/diskfit/apis/diskfit"
)

const (
	appNamespace     = "app"
	webhookNamespace = "diskfit-system"
	secretName       = "diskfit-webhook-cert"
	configName       = "diskfit-webhook"
	otherDriver      = "ebs.csi.aws.com"
)

func storageClass(name, provisioner string) *storagev1.StorageClass {
	return &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: provisioner}
}

func defaultStorageClass(name, provisioner string, created time.Time) *storagev1.StorageClass {
	sc := storageClass(name, provisioner)
	sc.Annotations = map[string]string{diskfit.IsDefaultClassAnnotation: "true"}
	sc.CreationTimestamp = metav1.NewTime(created)
	return sc
}

// claim returns a PVC in appNamespace; a nil class asks for the default.
func claim(name string, class *string) *v1.PersistentVolumeClaim {
	return &v1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: appNamespace},
		Spec:       v1.PersistentVolumeClaimSpec{StorageClassName: class},
	}
}

func boundClaim(name string, class *string, volume string) *v1.PersistentVolumeClaim {
	c := claim(name, class)
	c.Spec.VolumeName = volume
	return c
}

// webhookConfig returns a MutatingWebhookConfiguration with n webhooks and
// no caBundle.
func webhookConfig(n int) *admissionregistrationv1.MutatingWebhookConfiguration {
	cfg := &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: configName}}
	for i := range n {
		cfg.Webhooks = append(cfg.Webhooks, admissionregistrationv1.MutatingWebhook{
			Name:                    "pods" + string(rune('a'+i)) + ".scheduler.diskfit.io",
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: ptr.To("https://127.0.0.1/mutate")},
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
		})
	}
	return cfg
}

// podWrapper builds test pods.
type podWrapper struct{ *v1.Pod }

func makePod(name string) podWrapper {
	return podWrapper{&v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: appNamespace},
		Spec:       v1.PodSpec{Containers: []v1.Container{{Name: "app", Image: "app"}}},
	}}
}

func (p podWrapper) withScheduler(name string) podWrapper {
	p.Spec.SchedulerName = name
	return p
}

func (p podWrapper) withClaim(name string) podWrapper {
	p.Spec.Volumes = append(p.Spec.Volumes, v1.Volume{Name: name, VolumeSource: v1.VolumeSource{
		PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: name},
	}})
	return p
}

func (p podWrapper) withEmptyDir(name string) podWrapper {
	p.Spec.Volumes = append(p.Spec.Volumes, v1.Volume{Name: name, VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}})
	return p
}

// withEphemeral adds a generic ephemeral volume; a nil class asks for the
// default.
func (p podWrapper) withEphemeral(name string, class *string) podWrapper {
	p.Spec.Volumes = append(p.Spec.Volumes, v1.Volume{Name: name, VolumeSource: v1.VolumeSource{
		Ephemeral: &v1.EphemeralVolumeSource{VolumeClaimTemplate: &v1.PersistentVolumeClaimTemplate{
			Spec: v1.PersistentVolumeClaimSpec{StorageClassName: class},
		}},
	}})
	return p
}

func (p podWrapper) withLabel(k, v string) podWrapper {
	metav1.SetMetaDataLabel(&p.ObjectMeta, k, v)
	return p
}

func (p podWrapper) withAnnotation(k, v string) podWrapper {
	metav1.SetMetaDataAnnotation(&p.ObjectMeta, k, v)
	return p
}

// podCreate is the admission request of creating pod.
func podCreate(t *testing.T, pod *v1.Pod) *admissionv1.AdmissionRequest {
	t.Helper()
	raw, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	return &admissionv1.AdmissionRequest{
		UID:       types.UID("uid-" + pod.Name),
		Kind:      metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
		Resource:  metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
		Namespace: appNamespace,
		Operation: admissionv1.Create,
		Object:    runtime.RawExtension{Raw: raw},
	}
}

func reviewOf(t *testing.T, req *admissionv1.AdmissionRequest) []byte {
	t.Helper()
	raw, err := json.Marshal(&admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request:  req,
	})
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// testServer is a Server serving on a loopback port with a fake
// clientset, and an HTTPS client that trusts what the server published in
// the webhook configuration's caBundle, as the API server does.
type testServer struct {
	*Server
	kube   *fake.Clientset
	client *http.Client
	url    string
}

// startServer serves a webhook whose fake cluster holds objects and the
// webhook configuration, until the test ends.
func startServer(t *testing.T, objects ...runtime.Object) *testServer {
	t.Helper()
	kube := fake.NewClientset(append(objects, webhookConfig(1))...)
	cfg := Config{
		Client:            kube,
		Namespace:         webhookNamespace,
		Hosts:             []string{"127.0.0.1"},
		SecretName:        secretName,
		WebhookConfigName: configName,
		Address:           "127.0.0.1:0",
	}
	for _, o := range objects {
		if vc, ok := o.(*admissionregistrationv1.ValidatingWebhookConfiguration); ok {
			cfg.VolumeWebhookConfigName = vc.Name
		}
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return s.Ready(), nil
	}); err != nil {
		t.Fatalf("webhook not ready: %v", err)
	}
	return &testServer{Server: s, kube: kube, client: trustingClient(t, kube), url: "https://" + ln.Addr().String() + MutatePath}
}

// trustingClient is an HTTPS client trusting the caBundle of the webhook
// configuration.
func trustingClient(t *testing.T, kube *fake.Clientset) *http.Client {
	t.Helper()
	cfg, err := kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(context.Background(), configName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(cfg.Webhooks[0].ClientConfig.CABundle) {
		t.Fatalf("no CA bundle published: %q", cfg.Webhooks[0].ClientConfig.CABundle)
	}
	// A new connection per request, so that every request sees the
	// certificate served at that moment.
	return &http.Client{Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
		DisableKeepAlives: true,
	}}
}

// post sends body to the webhook and returns the status and the body of
// the answer.
func (ts *testServer) post(t *testing.T, contentType string, body []byte) (int, []byte) {
	t.Helper()
	resp, err := ts.client.Post(ts.url, contentType, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, out
}
