// Package webhook is diskfit's optional admission webhook. On pod creation
// it sets spec.schedulerName to diskfit-scheduler when the pod uses a
// diskfit volume and asked for no scheduler other than the default; it
// never rejects a pod. On the creation of a PV by the node driver it
// refuses a PV that is not for a claim scheduled to the driver's node
// (volumes.go). It makes and renews its own serving certificate, kept in a
// Secret that its replicas share.
package webhook

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/component-base/metrics"
	"k8s.io/klog/v2"
)

// MutatePath is the path the API server posts AdmissionReviews to.
const MutatePath = "/mutate"

// maxReviewBytes bounds an AdmissionReview body; the API server's own
// limit for a request is 3 MiB, and a review carries one object.
const maxReviewBytes = 6 << 20

// Config configures a Server.
type Config struct {
	// Client reads claims and classes and writes the certificate Secret
	// and the webhook configuration's caBundle.
	Client kubernetes.Interface
	// Namespace holds the Secret and, with ServiceName, names the
	// Service the API server calls.
	Namespace string
	// ServiceName is the webhook's Service; its DNS names go into the
	// serving certificate. May be empty when Hosts names the server.
	ServiceName string
	// Hosts are further DNS names or IP addresses of the server, for the
	// certificate.
	Hosts []string
	// SecretName is the Secret that holds the certificate.
	SecretName string
	// WebhookConfigName is the MutatingWebhookConfiguration whose caBundle
	// is kept in sync with the Secret; empty when it is not registered
	// (the webhook then only checks the nodes' PVs).
	WebhookConfigName string
	// VolumeWebhookConfigName is the ValidatingWebhookConfiguration of
	// the node driver's PVs whose caBundle is kept in sync with the
	// Secret; empty when it is not registered.
	VolumeWebhookConfigName string
	// Address is where the webhook serves HTTPS, e.g. ":9443".
	Address string
	// HealthAddress serves /healthz, /readyz and /metrics over HTTP;
	// empty disables it.
	HealthAddress string
	// CertValidity is how long a new certificate is valid.
	CertValidity time.Duration
	// CertRenewBefore is how long before expiry a certificate is renewed.
	CertRenewBefore time.Duration
	// CertCheckInterval is how often the Secret is read again: to renew
	// the certificate, to serve one another replica renewed and to put the
	// caBundle back if it was changed.
	CertCheckInterval time.Duration
}

// Defaults for the Config durations left zero.
const (
	DefaultCertValidity      = 365 * 24 * time.Hour
	DefaultCertRenewBefore   = 30 * 24 * time.Hour
	DefaultCertCheckInterval = time.Minute
)

// Server is the webhook: an HTTPS admission endpoint and an HTTP health
// and metrics endpoint.
type Server struct {
	cfg      Config
	informer informers.SharedInformerFactory
	mutator  *mutator
	volumes  *volumeValidator
	certs    *certificates
	synced   atomic.Bool
	registry metrics.KubeRegistry
	requests *metrics.CounterVec
	// volumeRequests counts the reviews of PVs.
	volumeRequests *metrics.CounterVec
}

// New validates cfg and returns a Server.
func New(cfg Config) (*Server, error) {
	if cfg.Client == nil {
		return nil, errors.New("webhook: no Kubernetes client")
	}
	if cfg.Namespace == "" || cfg.SecretName == "" || cfg.WebhookConfigName == "" && cfg.VolumeWebhookConfigName == "" {
		return nil, errors.New("webhook: namespace, Secret name and a webhook configuration name are required")
	}
	if cfg.Address == "" {
		return nil, errors.New("webhook: no address to serve on")
	}
	hosts := ServiceHosts(cfg.ServiceName, cfg.Namespace)
	hosts = append(hosts, cfg.Hosts...)
	if len(hosts) == 0 {
		return nil, errors.New("webhook: neither a Service name nor hosts for the serving certificate")
	}
	if cfg.CertValidity == 0 {
		cfg.CertValidity = DefaultCertValidity
	}
	if cfg.CertRenewBefore == 0 {
		cfg.CertRenewBefore = DefaultCertRenewBefore
	}
	if cfg.CertCheckInterval == 0 {
		cfg.CertCheckInterval = DefaultCertCheckInterval
	}
	if cfg.CertRenewBefore >= cfg.CertValidity {
		return nil, fmt.Errorf("webhook: renewing %s before expiry needs a validity longer than %s", cfg.CertRenewBefore, cfg.CertValidity)
	}
	factory := informers.NewSharedInformerFactory(cfg.Client, 0)
	s := &Server{
		cfg:      cfg,
		informer: factory,
		mutator: &mutator{
			client:  cfg.Client,
			claims:  factory.Core().V1().PersistentVolumeClaims().Lister(),
			classes: factory.Storage().V1().StorageClasses().Lister(),
		},
		volumes: &volumeValidator{client: cfg.Client},
		certs: &certificates{
			client:            cfg.Client,
			namespace:         cfg.Namespace,
			secretName:        cfg.SecretName,
			webhookConfigName: cfg.WebhookConfigName,
			volumeConfigName:  cfg.VolumeWebhookConfigName,
			hosts:             hosts,
			validity:          cfg.CertValidity,
			renewBefore:       cfg.CertRenewBefore,
			now:               time.Now,
		},
		registry: metrics.NewKubeRegistry(),
		requests: metrics.NewCounterVec(&metrics.CounterOpts{
			Subsystem:      "diskfit_webhook",
			Name:           "admission_requests_total",
			Help:           "Admission requests answered, by outcome: mutated, skipped (left unchanged) or error (left unchanged after an error).",
			StabilityLevel: metrics.ALPHA,
		}, []string{"outcome"}),
		volumeRequests: metrics.NewCounterVec(&metrics.CounterOpts{
			Subsystem:      "diskfit_webhook",
			Name:           "volume_admission_requests_total",
			Help:           "Admission requests for PVs of the node driver answered, by outcome: allowed, denied (not for a claim scheduled to the driver's node), error (denied after an error) or skipped (not a PV creation).",
			StabilityLevel: metrics.ALPHA,
		}, []string{"outcome"}),
	}
	s.registry.MustRegister(s.requests, s.volumeRequests)
	return s, nil
}

// ServiceHosts are the DNS names of a Service in a cluster with the default
// cluster domain; none without a service name.
func ServiceHosts(service, namespace string) []string {
	if service == "" {
		return nil
	}
	return []string{
		service + "." + namespace + ".svc",
		service + "." + namespace + ".svc.cluster.local",
		service + "." + namespace,
		service,
	}
}

// Run serves until ctx ends.
func (s *Server) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.cfg.Address)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", s.cfg.Address, err)
	}
	return s.Serve(ctx, ln)
}

// Serve serves the webhook on ln, and health and metrics on
// Config.HealthAddress, until ctx ends. It closes ln.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	logger := klog.FromContext(ctx)
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		s.informer.Shutdown()
		wg.Wait()
	}()

	if s.mutates() {
		s.informer.Core().V1().PersistentVolumeClaims().Informer()
		s.informer.Storage().V1().StorageClasses().Informer()
		s.informer.Start(ctx.Done())
		wg.Go(func() {
			for typ, ok := range s.informer.WaitForCacheSync(ctx.Done()) {
				if !ok {
					logger.Info("Informer cache did not sync", "type", typ)
					return
				}
			}
			s.synced.Store(true)
		})
	} else {
		// The check of the nodes' PVs reads claims from the API server.
		s.synced.Store(true)
	}
	wg.Go(func() { s.certs.run(ctx, s.cfg.CertCheckInterval) })

	servers := []*http.Server{{
		Handler:           s.Handler(),
		TLSConfig:         &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: s.certs.getCertificate},
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return ctx },
		// TLS handshake errors (a client that does not trust the
		// certificate yet) go to the component's log.
		ErrorLog: klog.NewStandardLogger("WARNING"),
	}}
	errs := make(chan error, 2)
	go func() { errs <- servers[0].ServeTLS(ln, "", "") }()
	logger.Info("Serving the webhook", "address", ln.Addr().String())
	if s.cfg.HealthAddress != "" {
		healthLn, err := net.Listen("tcp", s.cfg.HealthAddress)
		if err != nil {
			_ = servers[0].Close()
			return fmt.Errorf("listening on %s: %w", s.cfg.HealthAddress, err)
		}
		health := &http.Server{Handler: s.HealthHandler(), ReadHeaderTimeout: 10 * time.Second}
		servers = append(servers, health)
		go func() { errs <- health.Serve(healthLn) }()
		logger.Info("Serving health and metrics", "address", healthLn.Addr().String())
	}

	var err error
	select {
	case <-ctx.Done():
	case err = <-errs:
	}
	shutdownCtx, done := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer done()
	for _, srv := range servers {
		_ = srv.Shutdown(shutdownCtx)
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// Ready reports whether the webhook can answer: its caches have synced and
// it has a serving certificate.
func (s *Server) Ready() bool { return s.synced.Load() && s.certs.loaded() }

// mutates reports whether the webhook sets pods' scheduler: only when its
// MutatingWebhookConfiguration is registered.
func (s *Server) mutates() bool { return s.cfg.WebhookConfigName != "" }

// Handler serves ValidateVolumePath, and MutatePath when the webhook
// mutates: a MutatingWebhookConfiguration left from an earlier install
// then gets 404, so pods are created unchanged (failurePolicy Ignore).
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	if s.mutates() {
		mux.HandleFunc(MutatePath, func(w http.ResponseWriter, r *http.Request) {
			serveReview(w, r, s.mutator.admit, s.requests)
		})
	}
	mux.HandleFunc(ValidateVolumePath, func(w http.ResponseWriter, r *http.Request) {
		serveReview(w, r, s.volumes.admit, s.volumeRequests)
	})
	return mux
}

// HealthHandler serves /healthz (the process answers), /readyz (Ready) and
// /metrics.
func (s *Server) HealthHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !s.Ready() {
			http.Error(w, "caches not synced or no serving certificate yet", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.Handle("/metrics", metrics.HandlerFor(s.registry, metrics.HandlerOpts{}))
	return mux
}

// admitFunc answers one admission request and names its outcome.
type admitFunc func(context.Context, *admissionv1.AdmissionRequest) (*admissionv1.AdmissionResponse, string)

// serveReview answers an AdmissionReview with admit and counts the outcome
// in requests. A request that is not one gets 400.
func serveReview(w http.ResponseWriter, r *http.Request, admit admitFunc, requests *metrics.CounterVec) {
	if r.Method != http.MethodPost {
		http.Error(w, "only POST", http.StatusMethodNotAllowed)
		return
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		http.Error(w, "Content-Type must be application/json", http.StatusUnsupportedMediaType)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxReviewBytes))
	if err != nil {
		http.Error(w, fmt.Sprintf("reading the request: %v", err), http.StatusBadRequest)
		return
	}
	review := &admissionv1.AdmissionReview{}
	if err := json.Unmarshal(body, review); err != nil {
		http.Error(w, fmt.Sprintf("decoding the AdmissionReview: %v", err), http.StatusBadRequest)
		return
	}
	gvk := admissionv1.SchemeGroupVersion.WithKind("AdmissionReview")
	if review.GroupVersionKind() != gvk {
		http.Error(w, fmt.Sprintf("expected %s, got %s", gvk, review.GroupVersionKind()), http.StatusBadRequest)
		return
	}
	if review.Request == nil {
		http.Error(w, "AdmissionReview without a request", http.StatusBadRequest)
		return
	}
	resp, outcome := admit(r.Context(), review.Request)
	requests.WithLabelValues(outcome).Inc()
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(&admissionv1.AdmissionReview{TypeMeta: review.TypeMeta, Response: resp}); err != nil {
		klog.FromContext(r.Context()).Error(err, "Writing an admission response")
	}
}
