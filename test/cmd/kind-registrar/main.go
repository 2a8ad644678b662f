// Command kind-registrar stands in for node-driver-registrar in the
// DaemonSet of diskfit's kind overlay (manifests/overlays/kind) only: a kind
// cluster built without a container registry cannot pull the real sidecar,
// whose source no Go module serves. The production manifests and the Helm
// chart keep the real node-driver-registrar.
//
// It takes node-driver-registrar's flags and does what it does (package
// test/registrar): asks the driver at --csi-address for its name, serves
// <--plugin-registration-path>/<name>-reg.sock for the kubelet, announcing
// the driver at --kubelet-registration-path, and exits 1 when the kubelet
// refuses the driver so that the container restarts. --http-endpoint serves
// /healthz, which calls the registration socket as the kubelet does.
package main

import (
	"context"
	"flag"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/diskfit/diskfit/test/registrar"
)

func main() {
	klog.InitFlags(nil)
	var cfg registrar.Config
	flag.StringVar(&cfg.CSIAddress, "csi-address", "/run/csi/socket", "Path of the CSI driver socket that the registrar connects to.")
	flag.StringVar(&cfg.KubeletRegistrationPath, "kubelet-registration-path", "", "Path of the CSI driver socket on the host, where the kubelet calls the driver. Required.")
	flag.StringVar(&cfg.PluginRegistrationDir, "plugin-registration-path", "/registration", "Path of the kubelet's plugin registration directory (the host's /var/lib/kubelet/plugins_registry).")
	flag.DurationVar(&cfg.Timeout, "timeout", time.Second, "Timeout of each call to the driver.")
	httpEndpoint := flag.String("http-endpoint", "", "TCP address of the HTTP server for /healthz (example: :9809); empty disables it.")
	flag.Parse()
	if cfg.KubeletRegistrationPath == "" {
		klog.ErrorS(nil, "--kubelet-registration-path is required")
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	r, err := registrar.Start(ctx, cfg)
	if err != nil {
		klog.ErrorS(err, "Cannot register the driver")
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
	if *httpEndpoint != "" {
		go serveHealth(*httpEndpoint, r)
	}
	select {
	case <-ctx.Done():
		// Removing the socket tells the kubelet the driver is gone.
		r.Stop()
	case <-r.Refused():
		// Logged by the registrar; restart and register anew.
		r.Stop()
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
}

func serveHealth(addr string, r *registrar.Registrar) {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, req *http.Request) {
		if err := r.Check(req.Context()); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	klog.ErrorS(http.ListenAndServe(addr, mux), "Health server stopped")
	klog.FlushAndExit(klog.ExitFlushTimeout, 1)
}
