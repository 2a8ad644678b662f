// Command kind-livenessprobe stands in for livenessprobe in the DaemonSet
// of diskfit's kind overlay (manifests/overlays/kind) only: a kind cluster
// built without a container registry cannot pull the real sidecar, whose
// source no Go module serves. The production manifests and the Helm chart
// keep the real livenessprobe.
//
// It takes livenessprobe's flags and does what it does: --http-endpoint
// serves /healthz, which calls the CSI driver's Probe at --csi-address and
// answers 200 when the driver is ready, 500 otherwise, so that the
// kubelet's liveness probe of the driver container restarts a driver that
// stopped answering.
package main

import (
	"flag"
	"net/http"
	"time"

	"k8s.io/klog/v2"

	"github.com/diskfit/diskfit/test/registrar"
)

func main() {
	klog.InitFlags(nil)
	address := flag.String("csi-address", "/run/csi/socket", "Path of the CSI driver socket.")
	endpoint := flag.String("http-endpoint", ":9808", "TCP address of the HTTP server for /healthz.")
	timeout := flag.Duration("probe-timeout", time.Second, "Timeout of each call to the driver's Probe.")
	flag.Parse()

	mux := http.NewServeMux()
	mux.Handle("/healthz", registrar.ProbeHandler(*address, *timeout))
	klog.InfoS("Serving /healthz", "endpoint", *endpoint, "csi-address", *address)
	server := &http.Server{Addr: *endpoint, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	klog.ErrorS(server.ListenAndServe(), "Health server stopped")
	klog.FlushAndExit(klog.ExitFlushTimeout, 1)
}
