// Package registrar stands in for node-driver-registrar, the CSI sidecar
// that registers a node's CSI driver with the kubelet, where the real one
// cannot be had: the local cluster (package test/cluster) and kind clusters
// built without a registry (command test/cmd/kind-registrar, used only by
// manifests/overlays/kind). Production manifests keep the real sidecar.
// ProbeHandler does the same for livenessprobe, whose source no Go module
// serves either (command test/cmd/kind-livenessprobe).
//
// The protocol is the kubelet's plugin registration
// (k8s.io/kubelet/pkg/apis/pluginregistration/v1): the registrar serves a
// socket named <driver>-reg.sock in the kubelet's plugins_registry
// directory; the kubelet's plugin watcher finds it, calls GetInfo, checks
// and registers the CSI driver at the endpoint it was given, and reports
// the outcome with NotifyRegistrationStatus.
package registrar

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// supportedVersions are the CSI versions announced to the kubelet, as
// node-driver-registrar announces them.
var supportedVersions = []string{"1.0.0"}

// Config says where the driver, the kubelet and the registration directory
// are. The registrar and the kubelet may see the driver's socket at
// different paths (a sidecar container mounts the host's directory
// elsewhere), hence two of them.
type Config struct {
	// CSIAddress is the driver's socket as the registrar reaches it: a path
	// or a unix:// address.
	CSIAddress string
	// KubeletRegistrationPath is the driver's socket as the kubelet
	// reaches it; the kubelet calls the driver there.
	KubeletRegistrationPath string
	// PluginRegistrationDir is the kubelet's plugins_registry directory as
	// the registrar reaches it.
	PluginRegistrationDir string
	// Timeout bounds each call to the driver.
	Timeout time.Duration
}

// Registrar serves the kubelet's registration socket for one CSI driver.
type Registrar struct {
	registerapi.UnimplementedRegistrationServer
	driver   string
	endpoint string
	socket   string
	timeout  time.Duration
	server   *grpc.Server
	refused  chan error
}

// Start asks the driver at cfg.CSIAddress for its name (GetPluginInfo),
// waiting until ctx ends for it to answer as a sidecar must (the driver may
// start later), then serves <PluginRegistrationDir>/<name>-reg.sock until
// Stop.
func Start(ctx context.Context, cfg Config) (*Registrar, error) {
	if cfg.KubeletRegistrationPath == "" || cfg.PluginRegistrationDir == "" {
		return nil, errors.New("registrar needs the kubelet registration path and the plugin registration directory")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = time.Second
	}
	name, err := driverName(ctx, cfg.CSIAddress, cfg.Timeout)
	if err != nil {
		return nil, err
	}
	r := &Registrar{
		driver:   name,
		endpoint: cfg.KubeletRegistrationPath,
		socket:   filepath.Join(cfg.PluginRegistrationDir, name+"-reg.sock"),
		timeout:  cfg.Timeout,
		server:   grpc.NewServer(),
		refused:  make(chan error, 1),
	}
	// A socket left by a registrar that was killed.
	if err := os.Remove(r.socket); err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	l, err := net.Listen("unix", r.socket)
	if err != nil {
		return nil, err
	}
	// Only the kubelet (root) talks to it.
	if err := os.Chmod(r.socket, 0o600); err != nil {
		_ = l.Close()
		return nil, err
	}
	registerapi.RegisterRegistrationServer(r.server, r)
	go func() { _ = r.server.Serve(l) }()
	klog.InfoS("Serving the kubelet's plugin registration", "driver", name, "socket", r.socket, "endpoint", r.endpoint)
	return r, nil
}

// dial connects to a unix socket given as a path or a unix:// address.
func dial(address string) (*grpc.ClientConn, error) {
	if !strings.Contains(address, "://") {
		address = "unix://" + address
	}
	return grpc.NewClient(address, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// driverName calls GetPluginInfo once a second until the driver answers
// with a name or ctx ends.
func driverName(ctx context.Context, address string, timeout time.Duration) (string, error) {
	conn, err := dial(address)
	if err != nil {
		return "", err
	}
	defer func() { _ = conn.Close() }()
	identity := csi.NewIdentityClient(conn)
	for {
		call, cancel := context.WithTimeout(ctx, timeout)
		info, err := identity.GetPluginInfo(call, &csi.GetPluginInfoRequest{})
		cancel()
		if err == nil && info.GetName() != "" {
			return info.GetName(), nil
		}
		if err == nil {
			err = errors.New("the driver has no name")
		}
		klog.V(2).InfoS("Waiting for the CSI driver", "address", address, "err", err)
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("asking the CSI driver at %s for its name: %w", address, err)
		case <-time.After(time.Second):
		}
	}
}

// Driver returns the name the driver gave.
func (r *Registrar) Driver() string { return r.driver }

// Refused receives the kubelet's error when it refuses the driver.
// node-driver-registrar exits then, so that its container restarts and
// registers anew; the command does the same.
func (r *Registrar) Refused() <-chan error { return r.refused }

// Check calls GetInfo on the registration socket as the kubelet does and
// fails unless the answer names the driver: the health check.
func (r *Registrar) Check(ctx context.Context) error {
	conn, err := dial(r.socket)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	info, err := registerapi.NewRegistrationClient(conn).GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		return fmt.Errorf("registration socket %s: %w", r.socket, err)
	}
	if info.Name != r.driver {
		return fmt.Errorf("registration socket %s names %q, not %q", r.socket, info.Name, r.driver)
	}
	return nil
}

// Stop stops serving and removes the socket; the kubelet then deregisters
// the driver.
func (r *Registrar) Stop() {
	r.server.Stop()
	_ = os.Remove(r.socket)
}

// GetInfo implements the registration API.
func (r *Registrar) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              r.driver,
		Endpoint:          r.endpoint,
		SupportedVersions: supportedVersions,
	}, nil
}

// NotifyRegistrationStatus implements the registration API.
func (r *Registrar) NotifyRegistrationStatus(_ context.Context, s *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if s.PluginRegistered {
		klog.InfoS("The kubelet registered the driver", "driver", r.driver)
	} else {
		err := fmt.Errorf("the kubelet refused driver %s: %s", r.driver, s.Error)
		klog.ErrorS(err, "Registration failed")
		select {
		case r.refused <- err:
		default:
		}
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

// ProbeHandler serves livenessprobe's /healthz for the CSI driver at
// address: 200 when the driver's Probe answers ready within timeout, 500
// with the reason otherwise. The kind overlay's livenessprobe stand-in
// (test/cmd/kind-livenessprobe) serves it.
func ProbeHandler(address string, timeout time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if err := probe(req.Context(), address, timeout); err != nil {
			klog.V(2).InfoS("Health check failed", "address", address, "err", err)
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
}

// probe calls the driver's Probe once. A driver that answers without
// "ready" is ready, as the CSI spec says.
func probe(ctx context.Context, address string, timeout time.Duration) error {
	conn, err := dial(address)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := csi.NewIdentityClient(conn).Probe(ctx, &csi.ProbeRequest{})
	if err != nil {
		return fmt.Errorf("probing the CSI driver at %s: %w", address, err)
	}
	if ready := resp.GetReady(); ready != nil && !ready.GetValue() {
		return fmt.Errorf("the CSI driver at %s is not ready", address)
	}
	return nil
}
