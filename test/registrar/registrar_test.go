package registrar

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"k8s.io/client-go/tools/record"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
	"k8s.io/utils/ptr"
)

// These tests run the registrar against the kubelet's own plugin manager
// (plugin watcher, reconciler, operation executor) with a handler that does
// what the kubelet's CSI handler does first: it validates the versions and
// calls the driver at the endpoint it was given.

const driver = "test.diskfit.io"

// identity is a CSI driver that only tells its name.
type identity struct {
	csi.UnimplementedIdentityServer
}

func (identity) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: driver}, nil
}

// serveDriver serves the identity driver on socket until the test ends.
func serveDriver(t *testing.T, socket string) {
	t.Helper()
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	csi.RegisterIdentityServer(s, identity{})
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
}

type registration struct {
	name, endpoint, driverName string
	versions                   []string
}

// csiHandler stands for the kubelet's CSI plugin handler.
type csiHandler struct {
	refuse       error
	registered   chan registration
	deregistered chan string
}

func (h *csiHandler) ValidatePlugin(_ context.Context, _, _ string, versions []string) error {
	if h.refuse != nil {
		return h.refuse
	}
	if !slices.Contains(versions, "1.0.0") {
		return errors.New("no supported CSI version")
	}
	return nil
}

func (h *csiHandler) RegisterPlugin(ctx context.Context, name, endpoint string, versions []string, _ *time.Duration) error {
	// The kubelet calls the driver at the endpoint (NodeGetInfo); the
	// identity service shows the endpoint reaches the driver.
	name2, err := driverName(ctx, endpoint, time.Second)
	if err != nil {
		return err
	}
	h.registered <- registration{name: name, endpoint: endpoint, driverName: name2, versions: versions}
	return nil
}

func (h *csiHandler) DeRegisterPlugin(_ context.Context, name, _ string) { h.deregistered <- name }

// kubelet runs the kubelet's plugin manager on dir until the test ends.
func kubelet(t *testing.T, dir string, h *csiHandler) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stop := make(chan struct{})
	pm := pluginmanager.NewPluginManager(dir, record.NewFakeRecorder(10))
	pm.AddHandler(registerapi.CSIPlugin, h)
	go pm.Run(ctx, allReady{}, stop)
	t.Cleanup(func() { close(stop); cancel() })
}

type allReady struct{}

func (allReady) AddSource(string) {}
func (allReady) AllReady() bool   { return true }

func newHandler(refuse error) *csiHandler {
	return &csiHandler{refuse: refuse, registered: make(chan registration, 1), deregistered: make(chan string, 1)}
}

func TestKubeletRegistersTheDriverAtItsEndpoint(t *testing.T) {
	dir := t.TempDir()
	registry := filepath.Join(dir, "plugins_registry")
	if err := os.Mkdir(registry, 0o750); err != nil {
		t.Fatal(err)
	}
	// The registrar and the kubelet reach the driver's socket by different
	// paths, as a sidecar and the host do.
	socket := filepath.Join(dir, "csi.sock")
	kubeletSocket := filepath.Join(dir, "host-csi.sock")
	if err := os.Symlink(socket, kubeletSocket); err != nil {
		t.Fatal(err)
	}
	h := newHandler(nil)
	kubelet(t, registry, h)

	// The driver comes up after the registrar: it waits for it.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	go func() {
		time.Sleep(1500 * time.Millisecond)
		serveDriver(t, socket)
	}()
	r, err := Start(ctx, Config{CSIAddress: socket, KubeletRegistrationPath: kubeletSocket, PluginRegistrationDir: registry})
	if err != nil {
		t.Fatal(err)
	}
	if r.Driver() != driver {
		t.Errorf("registrar learnt driver %q from the driver, want %q", r.Driver(), driver)
	}
	if _, err := os.Stat(filepath.Join(registry, driver+"-reg.sock")); err != nil {
		t.Errorf("no registration socket named after the driver: %v", err)
	}

	select {
	case got := <-h.registered:
		want := registration{name: driver, endpoint: kubeletSocket, driverName: driver, versions: []string{"1.0.0"}}
		if got.name != want.name || got.endpoint != want.endpoint || got.driverName != want.driverName || !slices.Equal(got.versions, want.versions) {
			t.Errorf("kubelet registered %+v, want %+v", got, want)
		}
	case <-ctx.Done():
		t.Fatal("the kubelet never registered the driver")
	}
	if err := r.Check(ctx); err != nil {
		t.Errorf("health check of a registered driver: %v", err)
	}
	select {
	case err := <-r.Refused():
		t.Errorf("registration accepted, but the registrar was told %v", err)
	default:
	}

	r.Stop()
	select {
	case name := <-h.deregistered:
		if name != driver {
			t.Errorf("kubelet deregistered %q, want %q", name, driver)
		}
	case <-ctx.Done():
		t.Fatal("the kubelet never deregistered the driver after the registrar stopped")
	}
	if err := r.Check(ctx); err == nil {
		t.Error("health check passes with the registrar stopped")
	}
}

func TestRefusedRegistrationIsReported(t *testing.T) {
	dir := t.TempDir()
	socket := filepath.Join(dir, "csi.sock")
	serveDriver(t, socket)
	h := newHandler(errors.New("driver name clash"))
	kubelet(t, dir, h)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := Start(ctx, Config{CSIAddress: "unix://" + socket, KubeletRegistrationPath: socket, PluginRegistrationDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	select {
	case err := <-r.Refused():
		if err == nil || !strings.Contains(err.Error(), "driver name clash") {
			t.Errorf("refusal reported as %v, want the kubelet's reason", err)
		}
	case <-h.registered:
		t.Fatal("the kubelet registered a driver its handler refused")
	case <-ctx.Done():
		t.Fatal("the registrar was never told of the refusal")
	}
}

func TestStartGivesUpWhenNoDriverAnswers(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := Start(ctx, Config{CSIAddress: filepath.Join(dir, "csi.sock"), KubeletRegistrationPath: "/x", PluginRegistrationDir: dir})
	if err == nil {
		t.Fatal("Start succeeded with no driver")
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("registration directory holds %v with no driver", entries)
	}
}

// prober is a CSI driver whose Probe answers ready or not, or fails.
type prober struct {
	csi.UnimplementedIdentityServer
	ready *bool
	err   error
}

func (p prober) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	if p.err != nil {
		return nil, p.err
	}
	resp := &csi.ProbeResponse{}
	if p.ready != nil {
		resp.Ready = wrapperspb.Bool(*p.ready)
	}
	return resp, nil
}

// /healthz follows the driver's Probe: 200 when it answers ready or says
// nothing of readiness, 500 when it is not ready, fails, or is not there.
func TestProbeHandlerFollowsTheDriversProbe(t *testing.T) {
	for _, tc := range []struct {
		name   string
		driver *prober
		want   int
	}{
		{"ready", &prober{ready: ptr.To(true)}, http.StatusOK},
		{"no readiness", &prober{}, http.StatusOK},
		{"not ready", &prober{ready: ptr.To(false)}, http.StatusInternalServerError},
		{"probe fails", &prober{err: status.Error(codes.FailedPrecondition, "disk gone")}, http.StatusInternalServerError},
		{"no driver", nil, http.StatusInternalServerError},
	} {
		t.Run(tc.name, func(t *testing.T) {
			socket := filepath.Join(t.TempDir(), "csi.sock")
			if tc.driver != nil {
				l, err := net.Listen("unix", socket)
				if err != nil {
					t.Fatal(err)
				}
				s := grpc.NewServer()
				csi.RegisterIdentityServer(s, *tc.driver)
				go func() { _ = s.Serve(l) }()
				t.Cleanup(s.Stop)
			}
			rec := httptest.NewRecorder()
			ProbeHandler(socket, time.Second).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
			if rec.Code != tc.want {
				t.Errorf("/healthz answered %d (%s), want %d", rec.Code, strings.TrimSpace(rec.Body.String()), tc.want)
			}
		})
	}
}
