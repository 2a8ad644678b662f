// Command diskfit-controller releases the claims of lost disks and nodes
// that asked for it, so that StatefulSets move on (csi-driver/lifecycle,
// docs/reliability.md "A disk or node is lost"). Run two replicas; one
// leads (a Lease), the other waits.
package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"

	"github.com/diskfit/diskfit/apis/client/clientset/versioned"
	dfinformers "github.com/diskfit/diskfit/apis/client/informers/externalversions"
	"github.com/diskfit/diskfit/cmd/internal/command"
	"github.com/diskfit/diskfit/csi-driver/lifecycle"
)

type options struct {
	kubeconfig    string
	namespace     string
	leaseName     string
	leaderElect   bool
	healthAddress string
	lifecycle     lifecycle.Options
}

func main() {
	o := options{}
	fs := pflag.NewFlagSet("diskfit-controller", pflag.ExitOnError)
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file; empty means in-cluster config")
	fs.StringVar(&o.namespace, "namespace", os.Getenv("POD_NAMESPACE"), "namespace of the leader election Lease (default $POD_NAMESPACE)")
	fs.StringVar(&o.leaseName, "lease-name", "diskfit-controller", "name of the leader election Lease")
	fs.BoolVar(&o.leaderElect, "leader-elect", true, "run only while holding the Lease; turn off only when a single instance runs")
	fs.StringVar(&o.healthAddress, "health-address", ":8080", "address serving /healthz over HTTP; empty disables it")
	fs.DurationVar(&o.lifecycle.NodeLossGrace, "node-loss-grace", lifecycle.DefaultNodeLossGrace,
		"how long a Node must stay deleted, its driver silent (DiskNode status older than --disknode-max-age), before the claims on it that asked for it are released")
	fs.DurationVar(&o.lifecycle.DiskFailureGrace, "disk-failure-grace", lifecycle.DefaultDiskFailureGrace,
		"how long a disk must stay unhealthy before the claims on it that asked for it are released")
	fs.DurationVar(&o.lifecycle.StatusMaxAge, "disknode-max-age", lifecycle.DefaultStatusMaxAge,
		"a DiskNode status older than this says nothing about its disks")
	fs.DurationVar(&o.lifecycle.Interval, "interval", lifecycle.DefaultInterval, "how often every disk and node is looked at, besides on changes")
	o.lifecycle.MaxNodesWithFailedDisks = lifecycle.DefaultMaxNodesWithFailedDisks
	fs.Var(intOrPercent{&o.lifecycle.MaxNodesWithFailedDisks}, "max-nodes-with-failed-disks",
		"on how many nodes at most (a number, or a percentage of the nodes with a DiskNode; at least one) disks may fail at once for claims of failed disks to be released")
	o.lifecycle.MaxLostNodes = lifecycle.DefaultMaxLostNodes
	fs.Var(intOrPercent{&o.lifecycle.MaxLostNodes}, "max-lost-nodes",
		"how many nodes holding volumes at most (a number, or a percentage of the nodes whose DiskNode reports volumes; at least one) may go silent, their Node deleted, within 30 minutes of each other for their claims to be released")
	command.Run("diskfit-controller", fs, func(ctx context.Context) error { return run(ctx, o) })
}

func run(ctx context.Context, o options) error {
	if err := o.lifecycle.Validate(); err != nil {
		return err
	}
	restCfg, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return fmt.Errorf("loading the client config: %w", err)
	}
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("creating Kubernetes client: %w", err)
	}
	df, err := versioned.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("creating DiskNode client: %w", err)
	}
	broadcaster := events.NewBroadcaster(&events.EventSinkImpl{Interface: client.EventsV1()})
	defer broadcaster.Shutdown()
	if err := broadcaster.StartRecordingToSinkWithContext(ctx); err != nil {
		return err
	}
	recorder := broadcaster.NewRecorder(scheme.Scheme, "diskfit-controller")

	var watchdog *leaderelection.HealthzAdaptor
	if o.leaderElect {
		watchdog = leaderelection.NewLeaderHealthzAdaptor(20 * time.Second)
	}
	if o.healthAddress != "" {
		mux := http.NewServeMux()
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
			if watchdog != nil {
				if err := watchdog.Check(r); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
			}
			_, _ = w.Write([]byte("ok"))
		})
		srv := &http.Server{Addr: o.healthAddress, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				klog.FromContext(ctx).Error(err, "Serving /healthz")
			}
		}()
		defer srv.Close()
	}

	lead := func(ctx context.Context) error {
		factory := informers.NewSharedInformerFactory(client, 0)
		dfFactory := dfinformers.NewSharedInformerFactory(df, 0)
		defer factory.Shutdown()
		defer dfFactory.Shutdown()
		c, err := lifecycle.New(client, df, factory, dfFactory, recorder, o.lifecycle)
		if err != nil {
			return err
		}
		factory.Start(ctx.Done())
		dfFactory.Start(ctx.Done())
		return c.Run(ctx)
	}
	if !o.leaderElect {
		return lead(ctx)
	}
	if o.namespace == "" {
		return fmt.Errorf("--namespace (or $POD_NAMESPACE) is needed for the leader election Lease")
	}
	host, err := os.Hostname()
	if err != nil {
		return err
	}
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, o.namespace, o.leaseName,
		client.CoreV1(), client.CoordinationV1(), resourcelock.ResourceLockConfig{Identity: host + "_" + uuid.NewString()})
	if err != nil {
		return err
	}
	// The election ends when leading ends, whyever: a replica that stops
	// acting must not keep the Lease from a standby.
	electCtx, endElection := context.WithCancel(ctx)
	defer endElection()
	var led atomic.Bool
	leadErr := make(chan error, 1)
	leaderelection.RunOrDie(electCtx, leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   15 * time.Second,
		RenewDeadline:   10 * time.Second,
		RetryPeriod:     2 * time.Second,
		ReleaseOnCancel: true,
		WatchDog:        watchdog,
		Name:            o.leaseName,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				led.Store(true)
				leadErr <- lead(ctx)
				endElection()
			},
			// A replica that lost the Lease stops: a new leader counts its
			// grace times from its own first look.
			OnStoppedLeading: func() { klog.FromContext(ctx).Info("Lost the leader election Lease") },
		},
	})
	if led.Load() {
		if err := <-leadErr; err != nil {
			return err
		}
	}
	if ctx.Err() == nil {
		return fmt.Errorf("lost the leader election Lease")
	}
	return nil
}

// intOrPercent is a flag holding a number or a percentage.
type intOrPercent struct{ v *intstr.IntOrString }

func (f intOrPercent) String() string { return f.v.String() }
func (f intOrPercent) Type() string   { return "int-or-percent" }
func (f intOrPercent) Set(s string) error {
	*f.v = intstr.Parse(s)
	return nil
}
