package webhook

import (
	"context"
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/diskfit/diskfit/apis/diskfit"
)

func TestNewValidatesConfig(t *testing.T) {
	valid := func() Config {
		return Config{
			Client:            fake.NewClientset(),
			Namespace:         webhookNamespace,
			ServiceName:       "diskfit-webhook",
			SecretName:        secretName,
			WebhookConfigName: configName,
			Address:           ":9443",
		}
	}
	tests := []struct {
		name    string
		modify  func(*Config)
		wantErr string
	}{
		{name: "valid", modify: func(*Config) {}},
		{name: "hosts instead of a service", modify: func(c *Config) { c.ServiceName, c.Hosts = "", []string{"127.0.0.1"} }},
		{name: "no client", modify: func(c *Config) { c.Client = nil }, wantErr: "client"},
		{name: "no namespace", modify: func(c *Config) { c.Namespace = "" }, wantErr: "namespace"},
		{name: "no Secret", modify: func(c *Config) { c.SecretName = "" }, wantErr: "Secret"},
		{name: "no webhook configuration", modify: func(c *Config) { c.WebhookConfigName = "" }, wantErr: "webhook configuration"},
		// Only the check of the nodes' PVs, pods left as they are.
		{name: "only the volume webhook", modify: func(c *Config) { c.WebhookConfigName, c.VolumeWebhookConfigName = "", "volumes" }},
		{name: "no address", modify: func(c *Config) { c.Address = "" }, wantErr: "address"},
		{name: "no name for the certificate", modify: func(c *Config) { c.ServiceName = "" }, wantErr: "hosts"},
		{name: "renewal before validity", modify: func(c *Config) { c.CertValidity, c.CertRenewBefore = time.Hour, 2*time.Hour }, wantErr: "validity"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := valid()
			tt.modify(&cfg)
			_, err := New(cfg)
			if tt.wantErr == "" && err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("error %v, want one mentioning %q", err, tt.wantErr)
			}
		})
	}
}

// After another replica renews the certificate in the Secret, the server
// serves the new one from its next sync on, without a restart.
func TestServerReloadsRenewedCertificate(t *testing.T) {
	ts := startServer(t)
	servedSerial := func() string {
		t.Helper()
		// Trust what the webhook configuration says now, as the API server
		// does.
		client := trustingClient(t, ts.kube)
		conn, err := tls.Dial("tcp", strings.TrimPrefix(strings.TrimSuffix(ts.url, MutatePath), "https://"), client.Transport.(*http.Transport).TLSClientConfig)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	before := servedSerial()

	// A replica of a newer version, whose certificate names one host more.
	renewer := newCerts(ts.kube, time.Now(), append(ts.certs.hosts, "localhost")...)
	if err := renewer.sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := ts.certs.sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	after := servedSerial()
	if after == before {
		t.Fatal("still serving the certificate from before the renewal")
	}
	if want := renewer.current.Load().Leaf.SerialNumber.String(); after != want {
		t.Errorf("serving certificate %s, want the renewed %s", after, want)
	}
}

func TestHealthEndpoints(t *testing.T) {
	get := func(h http.Handler, path string) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Code, rec.Body.String()
	}
	idle, err := New(Config{Client: fake.NewClientset(), Namespace: webhookNamespace, Hosts: []string{"127.0.0.1"}, SecretName: secretName, WebhookConfigName: configName, Address: ":0"})
	if err != nil {
		t.Fatal(err)
	}
	if code, _ := get(idle.HealthHandler(), "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz of a server not started: %d, want 200", code)
	}
	if code, _ := get(idle.HealthHandler(), "/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz before caches and certificate: %d, want 503", code)
	}

	ts := startServer(t, storageClass("fast", diskfit.DriverName), claim("data", ptr.To("fast")))
	if code, _ := get(ts.HealthHandler(), "/readyz"); code != http.StatusOK {
		t.Errorf("/readyz when ready: %d, want 200", code)
	}
	if status, body := ts.post(t, "application/json", reviewOf(t, podCreate(t, makePod("p").withClaim("data").Pod))); status != http.StatusOK {
		t.Fatalf("status %d: %s", status, body)
	}
	code, body := get(ts.HealthHandler(), "/metrics")
	if want := `diskfit_webhook_admission_requests_total{outcome="mutated"} 1`; code != http.StatusOK || !strings.Contains(body, want) {
		t.Errorf("/metrics: %d, want a line %q in:\n%s", code, want, body)
	}
}
