package webhook

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net"
	"sync/atomic"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/keyutil"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
)

// CABundleKey is the Secret key of the PEM CA bundle that the webhook
// configuration's caBundle is set to. tls.crt and tls.key hold the serving
// certificate and its key, as in any kubernetes.io/tls Secret.
const CABundleKey = "ca.crt"

// secretWriteAttempts bounds how often ensureSecret starts over after
// another replica wrote the Secret first.
const secretWriteAttempts = 5

// certificates keeps the serving certificate in a Secret that every replica
// shares, serves what the Secret holds and publishes its CA bundle in the
// MutatingWebhookConfiguration and the ValidatingWebhookConfiguration. The CA's key is thrown away after signing:
// renewal makes a new CA and serving certificate together, and the bundle
// keeps the previous CA until it expires, so replicas still serving the old
// certificate stay trusted until they read the Secret again.
type certificates struct {
	client            kubernetes.Interface
	namespace         string
	secretName        string
	webhookConfigName string
	volumeConfigName  string // empty: none
	hosts             []string
	validity          time.Duration
	renewBefore       time.Duration
	now               func() time.Time

	current atomic.Pointer[tls.Certificate]
}

// getCertificate is the tls.Config hook: every handshake gets the
// certificate the last sync loaded.
func (c *certificates) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	if crt := c.current.Load(); crt != nil {
		return crt, nil
	}
	return nil, errors.New("no serving certificate yet")
}

// loaded reports whether a serving certificate is available.
func (c *certificates) loaded() bool { return c.current.Load() != nil }

// run syncs at once, then every interval; after a failure it retries
// sooner, backing off up to interval.
func (c *certificates) run(ctx context.Context, interval time.Duration) {
	logger := klog.FromContext(ctx)
	const retryMin = time.Second
	delay := retryMin
	for {
		next := interval
		if err := c.sync(ctx); err != nil {
			logger.Error(err, "Syncing the serving certificate", "secret", klog.KRef(c.namespace, c.secretName), "retryIn", delay)
			next, delay = delay, min(2*delay, interval)
		} else {
			delay = retryMin
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(next):
		}
	}
}

// sync makes sure the Secret holds a certificate valid for a while yet,
// serves it, and publishes its CA bundle in the webhook configuration.
func (c *certificates) sync(ctx context.Context) error {
	secret, err := c.ensureSecret(ctx)
	if err != nil {
		return err
	}
	crt, err := tls.X509KeyPair(secret.Data[v1.TLSCertKey], secret.Data[v1.TLSPrivateKeyKey])
	if err != nil {
		return fmt.Errorf("loading the certificate of Secret %s/%s: %w", c.namespace, c.secretName, err)
	}
	c.current.Store(&crt)
	return c.publishCABundle(ctx, secret.Data[CABundleKey])
}

// ensureSecret returns the Secret, creating it when absent and renewing
// its certificate when it is unusable or close to expiry. When another
// replica creates or updates it first, that replica's certificate wins and
// is returned.
func (c *certificates) ensureSecret(ctx context.Context) (*v1.Secret, error) {
	logger := klog.FromContext(ctx)
	secrets := c.client.CoreV1().Secrets(c.namespace)
	for range secretWriteAttempts {
		secret, err := secrets.Get(ctx, c.secretName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			data, err := c.generate(nil)
			if err != nil {
				return nil, err
			}
			created, err := secrets.Create(ctx, &v1.Secret{
				ObjectMeta: metav1.ObjectMeta{Name: c.secretName, Namespace: c.namespace},
				Type:       v1.SecretTypeTLS,
				Data:       data,
			}, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("creating Secret %s/%s: %w", c.namespace, c.secretName, err)
			}
			logger.Info("Created the serving certificate", "secret", klog.KObj(created), "hosts", c.hosts)
			return created, nil
		}
		if err != nil {
			return nil, fmt.Errorf("reading Secret %s/%s: %w", c.namespace, c.secretName, err)
		}
		reason := c.renewalReason(secret.Data)
		if reason == nil {
			return secret, nil
		}
		data, err := c.generate(secret.Data[CABundleKey])
		if err != nil {
			return nil, err
		}
		renewed := secret.DeepCopy()
		renewed.Data = data
		updated, err := secrets.Update(ctx, renewed, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("renewing the certificate in Secret %s/%s: %w", c.namespace, c.secretName, err)
		}
		logger.Info("Renewed the serving certificate", "secret", klog.KObj(updated), "reason", reason.Error(), "hosts", c.hosts)
		return updated, nil
	}
	return nil, fmt.Errorf("writing Secret %s/%s: it changed under each of %d attempts", c.namespace, c.secretName, secretWriteAttempts)
}

// renewalReason says why the Secret's certificate must be replaced, or nil
// when it can be served as it is.
func (c *certificates) renewalReason(data map[string][]byte) error {
	if _, err := tls.X509KeyPair(data[v1.TLSCertKey], data[v1.TLSPrivateKeyKey]); err != nil {
		return fmt.Errorf("no usable key pair: %w", err)
	}
	leaf, err := cert.ParseCertsPEM(data[v1.TLSCertKey])
	if err != nil {
		return fmt.Errorf("no usable certificate: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(data[CABundleKey]) {
		return errors.New("no CA bundle")
	}
	now := c.now()
	if left := leaf[0].NotAfter.Sub(now); left < c.renewBefore {
		return fmt.Errorf("expires in %s", left.Round(time.Minute))
	}
	for _, host := range c.hosts {
		if _, err := leaf[0].Verify(x509.VerifyOptions{Roots: roots, DNSName: host, CurrentTime: now}); err != nil {
			return fmt.Errorf("not valid for %s: %w", host, err)
		}
	}
	return nil
}

// generate makes a new CA and a serving certificate for c.hosts signed by
// it. The bundle is the new CA followed by the first CA of oldBundle while
// that one has not expired.
func (c *certificates) generate(oldBundle []byte) (map[string][]byte, error) {
	now := c.now()
	notBefore, notAfter := now.Add(-time.Hour), now.Add(c.validity) // an hour for clock skew
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	caTemplate := &x509.Certificate{
		Subject:               pkix.Name{CommonName: fmt.Sprintf("diskfit-webhook-ca@%d", now.Unix())},
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := sign(caTemplate, caTemplate, caKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("signing the CA certificate: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	template := &x509.Certificate{
		Subject:     pkix.Name{CommonName: c.hosts[0]},
		NotBefore:   notBefore,
		NotAfter:    notAfter,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, host := range c.hosts {
		if ip := net.ParseIP(host); ip != nil {
			template.IPAddresses = append(template.IPAddresses, ip)
		} else {
			template.DNSNames = append(template.DNSNames, host)
		}
	}
	der, err := sign(template, ca, key, caKey)
	if err != nil {
		return nil, fmt.Errorf("signing the serving certificate: %w", err)
	}
	serving, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	bundle := []*x509.Certificate{ca}
	if old, err := cert.ParseCertsPEM(oldBundle); err == nil && now.Before(old[0].NotAfter) {
		bundle = append(bundle, old[0])
	}
	bundlePEM, err := cert.EncodeCertificates(bundle...)
	if err != nil {
		return nil, err
	}
	certPEM, err := cert.EncodeCertificates(serving)
	if err != nil {
		return nil, err
	}
	keyPEM, err := keyutil.MarshalPrivateKeyToPEM(key)
	if err != nil {
		return nil, err
	}
	return map[string][]byte{CABundleKey: bundlePEM, v1.TLSCertKey: certPEM, v1.TLSPrivateKeyKey: keyPEM}, nil
}

// sign gives template a random serial number and signs it with the key of
// parent.
func sign(template, parent *x509.Certificate, key, parentKey *ecdsa.PrivateKey) ([]byte, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, err
	}
	template.SerialNumber = serial
	return x509.CreateCertificate(rand.Reader, template, parent, key.Public(), parentKey)
}

// publishCABundle sets the caBundle of every webhook in the
// MutatingWebhookConfiguration and, when there is one, the
// ValidatingWebhookConfiguration to bundle. A replica that read the Secret
// just before another renewed it may write the older bundle after the
// renewer wrote the newer one; its next sync, which reads the renewed
// Secret, writes the newer bundle again.
func (c *certificates) publishCABundle(ctx context.Context, bundle []byte) error {
	api := c.client.AdmissionregistrationV1()
	// Each even when the other failed: the validating webhook fails
	// closed, and without the bundle no node could save a PV.
	var errs []error
	if c.webhookConfigName != "" {
		configs := api.MutatingWebhookConfigurations()
		errs = append(errs, publishTo(ctx, "MutatingWebhookConfiguration", c.webhookConfigName, bundle,
			configs.Get, configs.Update, mutatingClientConfigs))
	}
	if c.volumeConfigName != "" {
		configs := api.ValidatingWebhookConfigurations()
		errs = append(errs, publishTo(ctx, "ValidatingWebhookConfiguration", c.volumeConfigName, bundle,
			configs.Get, configs.Update, validatingClientConfigs))
	}
	return errors.Join(errs...)
}

func mutatingClientConfigs(config *admissionregistrationv1.MutatingWebhookConfiguration) (ccs []*admissionregistrationv1.WebhookClientConfig) {
	for i := range config.Webhooks {
		ccs = append(ccs, &config.Webhooks[i].ClientConfig)
	}
	return ccs
}

func validatingClientConfigs(config *admissionregistrationv1.ValidatingWebhookConfiguration) (ccs []*admissionregistrationv1.WebhookClientConfig) {
	for i := range config.Webhooks {
		ccs = append(ccs, &config.Webhooks[i].ClientConfig)
	}
	return ccs
}

// publishTo sets the caBundle of every client config of the webhook
// configuration kind name to bundle, writing it only when one differs.
func publishTo[T any](ctx context.Context, kind, name string, bundle []byte,
	get func(context.Context, string, metav1.GetOptions) (T, error),
	update func(context.Context, T, metav1.UpdateOptions) (T, error),
	clientConfigs func(T) []*admissionregistrationv1.WebhookClientConfig,
) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		config, err := get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("reading %s %s: %w", kind, name, err)
		}
		changed := false
		for _, cc := range clientConfigs(config) {
			if !bytes.Equal(cc.CABundle, bundle) {
				cc.CABundle = bundle
				changed = true
			}
		}
		if !changed {
			return nil
		}
		if _, err := update(ctx, config, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("publishing the CA bundle in %s %s: %w", kind, name, err)
		}
		klog.FromContext(ctx).Info("Published the CA bundle", "kind", kind, "name", name)
		return nil
	})
}
