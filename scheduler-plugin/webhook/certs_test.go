package webhook

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/x509"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/util/cert"
)

const (
	testValidity    = 365 * 24 * time.Hour
	testRenewBefore = 30 * 24 * time.Hour
)

var serviceHosts = ServiceHosts("diskfit-webhook", webhookNamespace)

// newCerts is one replica's certificate keeper, on a clock stopped at now.
func newCerts(kube *fake.Clientset, now time.Time, hosts ...string) *certificates {
	return &certificates{
		client:            kube,
		namespace:         webhookNamespace,
		secretName:        secretName,
		webhookConfigName: configName,
		hosts:             hosts,
		validity:          testValidity,
		renewBefore:       testRenewBefore,
		now:               func() time.Time { return now },
	}
}

func getSecret(t *testing.T, kube *fake.Clientset) *v1.Secret {
	t.Helper()
	s, err := kube.CoreV1().Secrets(webhookNamespace).Get(context.Background(), secretName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func parseCerts(t *testing.T, pem []byte) []*x509.Certificate {
	t.Helper()
	certs, err := cert.ParseCertsPEM(pem)
	if err != nil {
		t.Fatal(err)
	}
	return certs
}

// checkServing checks that c serves the Secret's certificate, that it is
// valid at `at` for every host against the Secret's bundle, and that every
// webhook of the configuration trusts that bundle.
func checkServing(t *testing.T, kube *fake.Clientset, c *certificates, at time.Time) {
	t.Helper()
	secret := getSecret(t, kube)
	if secret.Type != v1.SecretTypeTLS {
		t.Errorf("Secret type %s, want %s", secret.Type, v1.SecretTypeTLS)
	}
	served := c.current.Load()
	if served == nil {
		t.Fatal("no certificate served")
	}
	leaf := parseCerts(t, secret.Data[v1.TLSCertKey])[0]
	if !bytes.Equal(served.Certificate[0], leaf.Raw) {
		t.Error("the certificate served is not the Secret's")
	}
	if key, ok := leaf.PublicKey.(*ecdsa.PublicKey); !ok || key.Curve != elliptic.P256() {
		t.Errorf("public key %T, want ECDSA P-256", leaf.PublicKey)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(secret.Data[CABundleKey])
	for _, host := range c.hosts {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: host, CurrentTime: at}); err != nil {
			t.Errorf("certificate not valid for %s: %v", host, err)
		}
	}
	cfg, err := kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(context.Background(), configName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range cfg.Webhooks {
		if !bytes.Equal(w.ClientConfig.CABundle, secret.Data[CABundleKey]) {
			t.Errorf("webhook %s: caBundle is not the Secret's", w.Name)
		}
	}
}

// A replica creates the Secret and publishes its CA; the next one serves
// the same certificate.
func TestCertificateCreatedAndReused(t *testing.T) {
	ctx := context.Background()
	now := time.Now()
	kube := fake.NewClientset(webhookConfig(2))
	first := newCerts(kube, now, serviceHosts...)
	if err := first.sync(ctx); err != nil {
		t.Fatal(err)
	}
	checkServing(t, kube, first, now)
	created := getSecret(t, kube)
	if leaf := parseCerts(t, created.Data[v1.TLSCertKey])[0]; !leaf.NotAfter.Equal(now.Add(testValidity).Truncate(time.Second)) {
		t.Errorf("certificate valid until %s, want %s", leaf.NotAfter, now.Add(testValidity))
	}

	second := newCerts(kube, now.Add(24*time.Hour), serviceHosts...)
	if err := second.sync(ctx); err != nil {
		t.Fatal(err)
	}
	checkServing(t, kube, second, now)
	if after := getSecret(t, kube); !bytes.Equal(after.Data[v1.TLSCertKey], created.Data[v1.TLSCertKey]) {
		t.Error("a valid certificate was replaced")
	}
}

func TestCertificateRenewal(t *testing.T) {
	start := time.Now()
	tests := []struct {
		name  string
		later time.Duration
		hosts []string
		// existing replaces the first replica's Secret.
		existing    map[string][]byte
		wantRenewed bool
		// wantOldCAToo: the bundle keeps the previous CA, which has not
		// expired yet.
		wantOldCAToo bool
	}{{
		name:  "valid for longer than the renewal margin",
		later: testValidity - testRenewBefore - time.Hour,
	}, {
		name:         "within the renewal margin",
		later:        testValidity - testRenewBefore + time.Hour,
		wantRenewed:  true,
		wantOldCAToo: true,
	}, {
		name:        "expired",
		later:       testValidity + time.Hour,
		wantRenewed: true,
	}, {
		name:         "another host",
		hosts:        append([]string{"127.0.0.1"}, serviceHosts...),
		wantRenewed:  true,
		wantOldCAToo: true,
	}, {
		name:         "not a certificate",
		existing:     map[string][]byte{v1.TLSCertKey: []byte("junk"), v1.TLSPrivateKeyKey: []byte("junk")},
		wantRenewed:  true,
		wantOldCAToo: true,
	}, {
		name:        "no CA bundle",
		existing:    map[string][]byte{CABundleKey: nil},
		wantRenewed: true,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			kube := fake.NewClientset(webhookConfig(1))
			if err := newCerts(kube, start, serviceHosts...).sync(ctx); err != nil {
				t.Fatal(err)
			}
			before := getSecret(t, kube)
			if tt.existing != nil {
				for k, v := range tt.existing {
					before.Data[k] = v
				}
				var err error
				if before, err = kube.CoreV1().Secrets(webhookNamespace).Update(ctx, before, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			hosts := serviceHosts
			if tt.hosts != nil {
				hosts = tt.hosts
			}
			now := start.Add(tt.later)
			replica := newCerts(kube, now, hosts...)
			if err := replica.sync(ctx); err != nil {
				t.Fatal(err)
			}
			checkServing(t, kube, replica, now)
			after := getSecret(t, kube)
			if renewed := !bytes.Equal(after.Data[v1.TLSCertKey], before.Data[v1.TLSCertKey]); renewed != tt.wantRenewed {
				t.Fatalf("renewed %v, want %v", renewed, tt.wantRenewed)
			}
			if !tt.wantRenewed {
				return
			}
			bundle := parseCerts(t, after.Data[CABundleKey])
			if tt.wantOldCAToo {
				// Replicas still serving the old certificate stay trusted.
				oldCA := parseCerts(t, before.Data[CABundleKey])[0]
				if len(bundle) != 2 || !bundle[1].Equal(oldCA) {
					t.Errorf("bundle has %d certificates, want the new CA and the old one", len(bundle))
				}
				if tt.existing != nil {
					return
				}
				oldLeaf := parseCerts(t, before.Data[v1.TLSCertKey])[0]
				roots := x509.NewCertPool()
				roots.AppendCertsFromPEM(after.Data[CABundleKey])
				if _, err := oldLeaf.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: now}); err != nil {
					t.Errorf("the old certificate is not trusted by the new bundle: %v", err)
				}
			} else if len(bundle) != 1 {
				t.Errorf("bundle has %d certificates, want only the new CA", len(bundle))
			}
		})
	}
}

// A replica that loses the race to renew reads the winner's Secret again
// and renews only if it still has to.
func TestRenewalConflict(t *testing.T) {
	ctx := context.Background()
	start := time.Now()
	kube := fake.NewClientset(webhookConfig(1))
	if err := newCerts(kube, start, serviceHosts...).sync(ctx); err != nil {
		t.Fatal(err)
	}
	conflicts := 0
	kube.PrependReactor("update", "secrets", func(clienttesting.Action) (bool, runtime.Object, error) {
		if conflicts > 0 {
			return false, nil, nil
		}
		conflicts++
		return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "secrets"}, secretName, nil)
	})
	now := start.Add(testValidity - time.Hour)
	replica := newCerts(kube, now, serviceHosts...)
	if err := replica.sync(ctx); err != nil {
		t.Fatal(err)
	}
	if conflicts != 1 {
		t.Fatalf("%d conflicts, want 1", conflicts)
	}
	checkServing(t, kube, replica, now)
	if leaf := parseCerts(t, getSecret(t, kube).Data[v1.TLSCertKey])[0]; leaf.NotAfter.Sub(now) < testValidity-time.Minute {
		t.Errorf("certificate valid until %s, not renewed after the conflict", leaf.NotAfter)
	}
}

// Replicas starting together all end up serving the one certificate that
// was created first.
func TestReplicasRaceToCreateTheSecret(t *testing.T) {
	const replicas = 8
	now := time.Now()
	kube := fake.NewClientset(webhookConfig(1))
	keepers := make([]*certificates, replicas)
	errs := make([]error, replicas)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range keepers {
		keepers[i] = newCerts(kube, now, serviceHosts...)
		wg.Go(func() {
			<-start
			errs[i] = keepers[i].sync(context.Background())
		})
	}
	close(start)
	wg.Wait()
	for i, c := range keepers {
		if errs[i] != nil {
			t.Errorf("replica %d: %v", i, errs[i])
			continue
		}
		checkServing(t, kube, c, now)
	}
	creates := 0
	for _, a := range kube.Actions() {
		if a.Matches("create", "secrets") {
			creates++
		}
	}
	if creates < 1 || creates > replicas {
		t.Errorf("%d creates of the Secret by %d replicas", creates, replicas)
	}
}

// The caBundle is put back when something else changed it, and a missing
// webhook configuration does not keep the certificate from being served.
func TestCABundlePublishing(t *testing.T) {
	ctx := context.Background()
	now := time.Now()
	kube := fake.NewClientset()
	c := newCerts(kube, now, serviceHosts...)
	err := c.sync(ctx)
	if err == nil || !strings.Contains(err.Error(), configName) {
		t.Fatalf("sync without a webhook configuration: %v, want an error naming %s", err, configName)
	}
	if !c.loaded() {
		t.Fatal("no certificate served without a webhook configuration")
	}

	configs := kube.AdmissionregistrationV1().MutatingWebhookConfigurations()
	if _, err := configs.Create(ctx, webhookConfig(3), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.sync(ctx); err != nil {
		t.Fatal(err)
	}
	checkServing(t, kube, c, now)

	cfg, err := configs.Get(ctx, configName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Webhooks[1].ClientConfig.CABundle = []byte("stale")
	if _, err := configs.Update(ctx, cfg, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.sync(ctx); err != nil {
		t.Fatal(err)
	}
	checkServing(t, kube, c, now)
}

// Each webhook configuration gets the caBundle even when the other one
// cannot be written: without it the API server could not call the
// validating webhook, which fails closed, and no node could save a PV.
func TestCABundlePublishedToEachConfigurationAlone(t *testing.T) {
	ctx := context.Background()
	now := time.Now()
	kube := fake.NewClientset(volumeWebhookConfig())
	c := newCerts(kube, now, serviceHosts...)
	c.volumeConfigName = volumeConfigName
	err := c.sync(ctx)
	if err == nil || !strings.Contains(err.Error(), configName) {
		t.Fatalf("sync without the mutating configuration: %v, want an error naming %s", err, configName)
	}
	cfg, err := kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, volumeConfigName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(cfg.Webhooks[0].ClientConfig.CABundle), string(getSecret(t, kube).Data[CABundleKey]); got != want {
		t.Errorf("validating configuration's caBundle %q, want the Secret's %q", got, want)
	}
}

// With only the validating configuration registered (the pods' scheduler
// left alone), the bundle goes there and nothing else is asked for.
func TestCABundlePublishedToTheVolumeConfigurationOnly(t *testing.T) {
	ctx := context.Background()
	kube := fake.NewClientset(volumeWebhookConfig())
	c := newCerts(kube, time.Now(), serviceHosts...)
	c.webhookConfigName, c.volumeConfigName = "", volumeConfigName
	if err := c.sync(ctx); err != nil {
		t.Fatalf("sync with only the validating configuration: %v", err)
	}
	cfg, err := kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, volumeConfigName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(cfg.Webhooks[0].ClientConfig.CABundle), string(getSecret(t, kube).Data[CABundleKey]); got != want {
		t.Errorf("validating configuration's caBundle %q, want the Secret's %q", got, want)
	}
}
