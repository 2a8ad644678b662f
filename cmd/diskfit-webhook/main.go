// Command diskfit-webhook is diskfit's optional mutating admission webhook:
// it sets spec.schedulerName to diskfit-scheduler on new pods that use a
// diskfit volume. See docs/webhook.md.
package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/diskfit/diskfit/cmd/internal/command"
	"github.com/diskfit/diskfit/scheduler-plugin/webhook"
)

type options struct {
	kubeconfig              string
	namespace               string
	serviceName             string
	secretName              string
	webhookConfigName       string
	volumeWebhookConfigName string
	hosts                   []string
	port                    int
	healthAddress           string
	certValidity            time.Duration
	certRenewBefore         time.Duration
}

func main() {
	o := options{}
	fs := pflag.NewFlagSet("diskfit-webhook", pflag.ExitOnError)
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file; empty means in-cluster config")
	fs.StringVar(&o.namespace, "namespace", os.Getenv("POD_NAMESPACE"), "namespace of the webhook's Service and certificate Secret (default $POD_NAMESPACE)")
	fs.StringVar(&o.serviceName, "service-name", "diskfit-webhook", "Service the API server calls; its DNS names go into the serving certificate")
	fs.StringVar(&o.secretName, "secret-name", "diskfit-webhook-cert", "Secret that holds the serving certificate, shared by all replicas")
	fs.StringVar(&o.webhookConfigName, "webhook-config-name", "diskfit-webhook", "MutatingWebhookConfiguration whose caBundle is kept in sync with the certificate; empty when it is not registered (only the nodes' PVs are checked)")
	fs.StringVar(&o.volumeWebhookConfigName, "volume-webhook-config-name", "diskfit-node-volumes", "ValidatingWebhookConfiguration of the node driver's PVs whose caBundle is kept in sync with the certificate; empty when it is not registered")
	fs.StringSliceVar(&o.hosts, "cert-hosts", nil, "further DNS names or IP addresses for the serving certificate")
	fs.IntVar(&o.port, "port", 9443, "HTTPS port of the webhook")
	fs.StringVar(&o.healthAddress, "health-address", ":8080", "address serving /healthz, /readyz and /metrics over HTTP; empty disables it")
	fs.DurationVar(&o.certValidity, "cert-validity", webhook.DefaultCertValidity, "validity of a new serving certificate")
	fs.DurationVar(&o.certRenewBefore, "cert-renew-before", webhook.DefaultCertRenewBefore, "renew the serving certificate this long before it expires")
	command.Run("diskfit-webhook", fs, func(ctx context.Context) error { return run(ctx, o) })
}

func run(ctx context.Context, o options) error {
	if o.port <= 0 || o.port > 65535 {
		return fmt.Errorf("--port %d is not a TCP port", o.port)
	}
	// An empty path falls back to the in-cluster config.
	restCfg, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return fmt.Errorf("loading the client config: %w", err)
	}
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("creating Kubernetes client: %w", err)
	}
	s, err := webhook.New(webhook.Config{
		Client:                  client,
		Namespace:               o.namespace,
		ServiceName:             o.serviceName,
		Hosts:                   o.hosts,
		SecretName:              o.secretName,
		WebhookConfigName:       o.webhookConfigName,
		VolumeWebhookConfigName: o.volumeWebhookConfigName,
		Address:                 net.JoinHostPort("", strconv.Itoa(o.port)),
		HealthAddress:           o.healthAddress,
		CertValidity:            o.certValidity,
		CertRenewBefore:         o.certRenewBefore,
	})
	if err != nil {
		return err
	}
	return s.Run(ctx)
}
