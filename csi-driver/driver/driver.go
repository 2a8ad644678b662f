// Package driver implements the diskfit CSI driver's Identity, Controller
// and Node services on top of the disks' backends.
package driver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-lib-utils/connection"
	"github.com/kubernetes-csi/csi-lib-utils/metrics"
	"github.com/kubernetes-csi/csi-lib-utils/protosanitizer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	"k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
	"github.com/diskfit/diskfit/csi-driver/backend"
	"github.com/diskfit/diskfit/csi-driver/config"
	"github.com/diskfit/diskfit/csi-driver/fault"
	"github.com/diskfit/diskfit/csi-driver/lvm"
)

// Version is the driver version reported by GetPluginInfo.
const Version = "v0.1.0"

// PVCGetter reads the PVC a volume is created for. It is the driver's only
// read from the Kubernetes API.
type PVCGetter interface {
	GetPVC(ctx context.Context, namespace, name string) (*corev1.PersistentVolumeClaim, error)
}

// SpecReader reads what an admin asks of the node's disks: the DiskNode's
// spec, empty when there is no DiskNode yet.
type SpecReader interface {
	Spec(ctx context.Context) (*v1alpha1.DiskNodeSpec, error)
}

// StatusPublisher publishes the node's DiskNode status.
type StatusPublisher interface {
	Publish(ctx context.Context, status *v1alpha1.DiskNodeStatus) error
}

// Config is everything the driver needs to run.
type Config struct {
	// Endpoint is the unix socket to serve on, "unix:///path" or "/path".
	Endpoint string
	// NodeID is this node's name.
	NodeID string
	// Node is the parsed node config.
	Node *config.NodeConfig
	// KubeletDir is the kubelet's root directory; stage and publish paths
	// must be below it.
	KubeletDir string
	// MetricsAddress serves /metrics when not empty.
	MetricsAddress string
	// StatusInterval is how often the DiskNode is refreshed.
	StatusInterval time.Duration
	// PVCs reads PVCs; nil means no PVC is ever read (no disk annotation).
	PVCs PVCGetter
	// Status publishes the DiskNode; nil means nothing is published.
	Status StatusPublisher
	// Spec reads which disks an admin took out of service; nil means none is.
	Spec SpecReader
	// Orphans finds volumes and snapshots that no API object refers to;
	// nil disables the orphan sweep, which also keeps track of the volumes
	// without a PV that the DiskNode reports.
	Orphans OrphanFinder
	// OrphanGracePeriod is how long a volume or snapshot that never had
	// its API object must have been without one before it is removed; 0
	// removes nothing.
	OrphanGracePeriod time.Duration
	// Faults stops the driver at a step of an operation, for crash tests
	// (see package fault); nil otherwise.
	Faults *fault.Injector
	// LockDir is the node's directory for the locks that make one driver
	// at a time serve each lvm disk (backend.NewLVM): a host directory
	// that every driver on the node sees as the same one.
	LockDir string
	// LVMRunner runs lvm2 commands; nil means an lvm.ExecRunner per LVM
	// disk, which reads no loop device but the disk's own.
	LVMRunner lvm.Runner
	// DeviceMapperControl overrides lvm.DeviceMapperControl in tests.
	DeviceMapperControl string
	// Source gives the node config as it is now; nil means the config
	// never changes while the driver runs. See reload.go.
	Source ConfigSource
	// ReloadInterval is how often Source is read; 10s when zero.
	ReloadInterval time.Duration
	// Events records Kubernetes Events on the node's DiskNode; nil
	// records none (the driver logs them either way).
	Events EventRecorder
	// DiskStatusTimeout bounds, per disk, the status observation of each
	// refresh and the health and space checks of the RPCs: a disk that
	// does not answer in time (a dying device hangs the syscalls) is
	// reported unhealthy, and the other disks are not held up.
	// DefaultDiskStatusTimeout when zero.
	DiskStatusTimeout time.Duration
	// NoDisksReason, when set, is why the node has no config (no section
	// of the file selects it): Node then has no disks, and every call
	// that needs a disk answers Unavailable with it until Source gives a
	// config.
	NoDisksReason error
}

// ConfigSource gives the node config the driver should run with now.
type ConfigSource interface {
	Load(ctx context.Context) (*config.NodeConfig, error)
}

// EventRecorder records a Kubernetes Event on the node's DiskNode.
type EventRecorder interface {
	Event(ctx context.Context, eventType, reason, message string)
}

// disk is one configured disk and its backend.
type disk struct {
	name    string
	backend backend.Backend
	// conf is the config the disk was made from; a reload changes only
	// its device class and reserve in place (see reload.go).
	conf        config.Disk
	deviceClass atomic.Pointer[string]

	// use is held shared by every call that puts something new on the
	// disk (a volume, a snapshot) and by start, and exclusively by
	// retire, which checks that the disk is empty and marks it retired
	// so that nothing is put on it any more.
	use     sync.RWMutex
	retired bool

	mu sync.RWMutex
	// startErr is why the backend could not start (yet). The disk is then
	// unavailable: nothing calls its backend, calls for its volumes answer
	// Unavailable, and every status refresh tries to start it again.
	startErr error

	// timeout bounds the calls below, which a dying device can make hang
	// (see bounded.go): observing is the status observation in flight
	// (status.go), checking and measuring the Health and Usage calls of
	// the RPCs.
	timeout   time.Duration
	observing oneFlight[v1alpha1.DiskStatus]
	checking  oneFlight[error]
	measuring oneFlight[usageResult]
}

// What the bounded calls to a disk are called in their errors.
const (
	observingWhat = "its status check (health, space, volumes)"
	checkingWhat  = "its health check"
	measuringWhat = "its space check"
)

// unavailable returns why the disk's backend has not started, nil once it
// has.
func (dk *disk) unavailable() error {
	dk.mu.RLock()
	defer dk.mu.RUnlock()
	return dk.startErr
}

// class returns the disk's device class.
func (dk *disk) class() string { return *dk.deviceClass.Load() }

// start starts the disk's backend and records the outcome.
func (dk *disk) start(ctx context.Context) error {
	release, err := dk.hold()
	if err != nil {
		return err
	}
	defer release()
	err = dk.backend.Start(ctx)
	if err != nil {
		err = fmt.Errorf("starting disk: %w", err)
	}
	dk.mu.Lock()
	dk.startErr = err
	dk.mu.Unlock()
	return err
}

// checkHealth calls the backend's Health without a bound; only the status
// observation, which runs in a goroutine of its own, calls it.
func (dk *disk) checkHealth(ctx context.Context) error {
	if err := dk.unavailable(); err != nil {
		return err
	}
	return dk.backend.Health(ctx)
}

// health returns nil when new volumes can be placed on the disk and its
// volumes reached, or why not. It is bounded by the disk's timeout, so
// that an RPC that checks every disk (CreateVolume looking for its volume
// and placing it, the health and list RPCs) does not hang on one stuck
// disk, nor hold the volume's lock for good: a disk that did not answer
// the status observation or an earlier call in time is unhealthy at once,
// without a new call, until that call returns.
func (dk *disk) health(ctx context.Context) error {
	if err := dk.unavailable(); err != nil {
		return err
	}
	if err := dk.stuck(); err != nil {
		return err
	}
	f := dk.checking.join(ctx, dk.timeout, func(ctx context.Context) error {
		return timedOut(ctx, dk.backend.Health(ctx), checkingWhat, dk.timeout)
	})
	err, werr := f.wait(ctx, checkingWhat, dk.timeout)
	if werr != nil {
		return werr
	}
	return err
}

// stuck returns an error when a call to the disk is in flight past its
// deadline, nil otherwise.
func (dk *disk) stuck() error {
	if f := dk.observing.overdue(); f != nil {
		return stillNotAnswering(f.started, observingWhat, dk.timeout)
	}
	if f := dk.checking.overdue(); f != nil {
		return stillNotAnswering(f.started, checkingWhat, dk.timeout)
	}
	if f := dk.measuring.overdue(); f != nil {
		return stillNotAnswering(f.started, measuringWhat, dk.timeout)
	}
	return nil
}

type usageResult struct {
	u   backend.Usage
	err error
}

// usage is the backend's Usage, bounded like health.
func (dk *disk) usage(ctx context.Context) (backend.Usage, error) {
	f := dk.measuring.join(ctx, dk.timeout, func(ctx context.Context) usageResult {
		u, err := dk.backend.Usage(ctx)
		return usageResult{u, timedOut(ctx, err, measuringWhat, dk.timeout)}
	})
	r, err := f.wait(ctx, measuringWhat, dk.timeout)
	if err != nil {
		return backend.Usage{}, err
	}
	return r.u, r.err
}

// Driver serves the CSI services.
type Driver struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedControllerServer
	csi.UnimplementedNodeServer

	cfg        Config
	kubeletDir string
	// grows counts the offline filesystem grows running
	// (growExtOffline), which Run waits for before it returns.
	grows sync.WaitGroup
	// set is the disks served now; a reload replaces it (copy on write),
	// so readers need no lock.
	set atomic.Pointer[diskSet]
	// discovers is true while the node config in force discovers disks:
	// then a disk of the node's PVs that is not served may be one that
	// failed before it could be mounted; otherwise it is one the config
	// does not name (v1alpha1.DiskNotConfigured).
	discovers atomic.Bool
	// skipped is the node config's Skipped in force: disks discovery found
	// mounted but did not take, which are no failure.
	skipped atomic.Pointer[map[string]string]
	reloads reloadState
	locks   *keyLocks
	mounter *mount.SafeFormatAndMount
	exec    utilexec.Interface
	ready   atomic.Bool
	// kick asks the status loop for an early refresh.
	kick        chan struct{}
	metrics     metrics.CSIMetricsManager
	diskMetrics *diskMetrics
	// now is the clock the orphan sweep ages volumes by.
	now func() time.Time
	// late holds what was referred to while its disk was down (orphans.go).
	late lateRefs
}

// New validates cfg and builds the driver. Nothing touches the disks until Run.
func New(cfg Config) (*Driver, error) {
	var errs []error
	if cfg.Endpoint == "" {
		errs = append(errs, errors.New("endpoint is required"))
	}
	if cfg.NodeID == "" {
		errs = append(errs, errors.New("node ID is required"))
	}
	if cfg.Node == nil {
		errs = append(errs, errors.New("node config is required"))
	} else if cfg.NoDisksReason != nil && len(cfg.Node.Disks) > 0 {
		errs = append(errs, errors.New("a node config without disks cannot have disks"))
	} else if cfg.NoDisksReason == nil {
		if err := cfg.Node.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if cfg.ReloadInterval < 0 {
		errs = append(errs, errors.New("reload interval must not be negative"))
	} else if cfg.ReloadInterval == 0 {
		cfg.ReloadInterval = defaultReloadInterval
	}
	if cfg.DiskStatusTimeout < 0 {
		errs = append(errs, errors.New("disk status timeout must not be negative"))
	} else if cfg.DiskStatusTimeout == 0 {
		cfg.DiskStatusTimeout = DefaultDiskStatusTimeout
	}
	if !filepath.IsAbs(cfg.KubeletDir) {
		errs = append(errs, fmt.Errorf("kubelet directory %q is not absolute", cfg.KubeletDir))
	}
	if !filepath.IsAbs(cfg.LockDir) {
		errs = append(errs, fmt.Errorf("lock directory %q is not absolute", cfg.LockDir))
	}
	if cfg.StatusInterval <= 0 {
		errs = append(errs, errors.New("status interval must be positive"))
	}
	if cfg.OrphanGracePeriod < 0 {
		errs = append(errs, errors.New("orphan grace period must not be negative"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("invalid driver config: %w", err)
	}
	kubeletDir, err := filepath.EvalSymlinks(cfg.KubeletDir)
	if err != nil {
		return nil, fmt.Errorf("kubelet directory: %w", err)
	}
	ex := utilexec.New()
	d := &Driver{
		cfg:        cfg,
		kubeletDir: kubeletDir,
		locks:      newKeyLocks(),
		mounter:    mount.NewSafeFormatAndMount(mount.New(""), ex),
		exec:       ex,
		kick:       make(chan struct{}, 1),
		now:        time.Now,
		metrics:    metrics.NewCSIMetricsManagerForPlugin(diskfit.DriverName),
	}
	d.diskMetrics = newDiskMetrics(d.metrics.GetRegistry())
	var disks []*disk
	for _, dc := range cfg.Node.Disks {
		disks = append(disks, d.newDisk(dc))
	}
	d.set.Store(newDiskSet(disks, cfg.NoDisksReason))
	d.discovers.Store(cfg.Node.Discovers)
	d.skipped.Store(&cfg.Node.Skipped)
	d.reloads = reloadState{maxVolumes: cfg.Node.MaxVolumes, notes: cfg.Node.Notes}
	return d, nil
}

// newDisk makes the disk and its backend from its config.
func (d *Driver) newDisk(dc config.Disk) *disk {
	var b backend.Backend
	switch dc.Backend {
	case v1alpha1.BackendLVM:
		run := d.cfg.LVMRunner
		if run == nil {
			run = lvm.ExecRunner{Device: dc.Device}
		}
		l := backend.NewLVM(dc.Name, dc.VolumeGroup, dc.Device, dc.AllowInitialize, dc.ReservedBytes(), run, d.cfg.LockDir, filepath.Join(d.kubeletDir, "plugins", diskfit.DriverName, "volume-groups"))
		if d.cfg.DeviceMapperControl != "" {
			l.SetDeviceMapperControl(d.cfg.DeviceMapperControl)
		}
		b = l
	default:
		b = backend.NewFile(dc.Name, dc.Path, dc.ReservedBytes(), d.cfg.Faults)
	}
	dk := &disk{name: dc.Name, backend: b, conf: dc, timeout: d.cfg.DiskStatusTimeout}
	dk.deviceClass.Store(&dc.DeviceClass)
	return dk
}

// diskSet is the disks the driver serves. It never changes once made: a
// reload makes a new one.
type diskSet struct {
	list   []*disk
	byName map[string]*disk
	// noDisks is why there are no disks: no section of the node config
	// selects the node.
	noDisks error
}

func newDiskSet(list []*disk, noDisks error) *diskSet {
	s := &diskSet{list: list, byName: map[string]*disk{}}
	for _, dk := range list {
		s.byName[dk.name] = dk
	}
	if len(list) == 0 {
		s.noDisks = noDisks
	}
	return s
}

// current returns the disk set served now; a zero Driver serves none.
func (d *Driver) current() *diskSet {
	if s := d.set.Load(); s != nil {
		return s
	}
	return &diskSet{}
}

// disks returns the disks served now.
func (d *Driver) disks() []*disk { return d.current().list }

// Start starts every disk's backend and marks the driver ready. Run calls
// it; tests that call the services directly call it themselves.
func (d *Driver) Start(ctx context.Context) {
	logger := klog.FromContext(ctx)
	for _, n := range d.cfg.Node.Notes {
		logger.Info("Node config discovery", "note", n)
	}
	for _, dk := range d.disks() {
		if err := dk.start(ctx); err != nil {
			logger.Error(err, "Disk unavailable, starting it again at every status refresh", "disk", dk.name)
			continue
		}
		if err := dk.health(ctx); err != nil {
			logger.Info("Disk unhealthy", "disk", dk.name, "reason", err.Error())
		}
	}
	d.ready.Store(true)
}

// Run serves the CSI services on the endpoint until ctx is cancelled, then
// stops gracefully.
func (d *Driver) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	lis, err := listen(d.cfg.Endpoint)
	if err != nil {
		return err
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(
		loggingInterceptor(logger),
		d.readyInterceptor,
		connection.ExtendedCSIMetricsManager{CSIMetricsManager: d.metrics}.RecordMetricsServerInterceptor,
	))
	csi.RegisterIdentityServer(srv, d)
	csi.RegisterControllerServer(srv, d)
	csi.RegisterNodeServer(srv, d)

	// Serve before the disks are scanned: Probe answers "not ready" until
	// then, which is what the CSI spec asks for.
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(lis) }()
	var httpSrv *http.Server
	if d.cfg.MetricsAddress != "" {
		mux := http.NewServeMux()
		d.metrics.RegisterToServer(mux, "/metrics")
		httpSrv = &http.Server{Addr: d.cfg.MetricsAddress, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := httpSrv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				logger.Error(err, "Metrics server failed")
			}
		}()
	}
	d.Start(ctx)
	statusDone := make(chan struct{})
	go func() {
		defer close(statusDone)
		d.statusLoop(ctx)
	}()
	reloadDone := make(chan struct{})
	go func() {
		defer close(reloadDone)
		if d.cfg.Source != nil {
			d.reloadLoop(ctx)
		}
	}()
	orphansDone := make(chan struct{})
	go func() {
		defer close(orphansDone)
		if d.cfg.Orphans != nil {
			d.orphanLoop(ctx)
		}
	}()
	logger.Info("Serving CSI", "endpoint", d.cfg.Endpoint, "node", d.cfg.NodeID, "disks", len(d.disks()))

	select {
	case <-ctx.Done():
	case err := <-serveErr:
		return fmt.Errorf("serving gRPC: %w", err)
	}
	logger.Info("Shutting down")
	stopped := make(chan struct{})
	go func() {
		srv.GracefulStop()
		close(stopped)
	}()
	d.waitForGrows(logger)
	graceful := true
	select {
	case <-stopped:
	case <-time.After(shutdownGrace):
		srv.Stop()
		graceful = false
	}
	if httpSrv != nil {
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = httpSrv.Shutdown(shutdownCtx)
	}
	<-statusDone
	<-reloadDone
	<-orphansDone
	if graceful {
		// Every call has returned: let go of the disks, as the process's
		// exit would, so that another driver may take them. After a forced
		// stop calls may still be running; the exit releases them then.
		for _, dk := range d.disks() {
			if err := dk.backend.Close(); err != nil {
				logger.Error(err, "Releasing disk", "disk", dk.name)
			}
		}
	}
	return nil
}

// shutdownGrace is how long Run waits, once its context ends, for the calls
// in flight to return.
var shutdownGrace = 30 * time.Second

// growShutdownWait bounds how long Run waits, once its context ends, for
// the offline filesystem grows running: resize2fs killed while it moves
// blocks leaves the filesystem marked in error, and the driver's exit
// kills it with the rest of its container. The DaemonSet gives the pod
// 600 s (terminationGracePeriodSeconds) before it is killed for good.
const growShutdownWait = 9 * time.Minute

// waitForGrows waits, up to growShutdownWait, for the offline grows
// running to end.
func (d *Driver) waitForGrows(logger klog.Logger) {
	done := make(chan struct{})
	go func() {
		d.grows.Wait()
		close(done)
	}()
	select {
	case <-done:
		return
	case <-time.After(100 * time.Millisecond):
	}
	logger.Info("Waiting for the offline filesystem grows running to end before exiting", "atMost", growShutdownWait)
	select {
	case <-done:
	case <-time.After(growShutdownWait):
		logger.Error(nil, "Exiting while an offline filesystem grow still runs; e2fsck repairs its filesystem at the next stage")
	}
}

// Permissions of the CSI socket and of its directory when the driver makes
// it. Whoever can connect to the socket can mount any volume anywhere below
// the kubelet directory, so only root (the kubelet, the sidecars) and the
// socket's group may.
const (
	socketMode    os.FileMode = 0o660
	socketDirMode os.FileMode = 0o750
)

// listen opens the unix socket, replacing a stale one of a previous run.
func listen(endpoint string) (net.Listener, error) {
	path := strings.TrimPrefix(endpoint, "unix://")
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("endpoint %q is not an absolute unix socket path", endpoint)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("removing stale socket: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), socketDirMode); err != nil {
		return nil, fmt.Errorf("creating socket directory: %w", err)
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", path, err)
	}
	// net.Listen creates the socket with 0777 less the umask; nobody can
	// have connected before this chmod through a directory made above.
	if err := os.Chmod(path, socketMode); err != nil {
		lis.Close()
		return nil, fmt.Errorf("restricting socket %s: %w", path, err)
	}
	return lis, nil
}

// loggingInterceptor logs every call with secrets stripped, and attaches
// a logger naming the method to the call's context.
func loggingInterceptor(logger klog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		l := logger.WithValues("method", info.FullMethod)
		ctx = klog.NewContext(ctx, l)
		l.V(4).Info("Call", "request", protosanitizer.StripSecrets(req))
		start := time.Now()
		resp, err := handler(ctx, req)
		if err != nil {
			l.Error(err, "Call failed", "duration", time.Since(start))
		} else {
			l.V(4).Info("Call done", "response", protosanitizer.StripSecrets(resp), "duration", time.Since(start))
		}
		return resp, err
	}
}

// answersBeforeReady are the methods served while the disks are still
// being scanned: they do not touch the disks, and sidecars call them to
// find out whether the driver is ready.
var answersBeforeReady = map[string]bool{
	"/csi.v1.Identity/GetPluginInfo":         true,
	"/csi.v1.Identity/GetPluginCapabilities": true,
	"/csi.v1.Identity/Probe":                 true,
	"/csi.v1.Node/NodeGetInfo":               true,
	"/csi.v1.Node/NodeGetCapabilities":       true,
}

// readyInterceptor answers Unavailable until Start has scanned the disks,
// so no call sees a backend half-started.
func (d *Driver) readyInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if !d.ready.Load() && !answersBeforeReady[info.FullMethod] {
		return nil, status.Error(codes.Unavailable, "the driver is still scanning its disks")
	}
	if err := d.current().noDisks; err != nil && !answersBeforeReady[info.FullMethod] {
		return nil, status.Errorf(codes.Unavailable, "node %s has no disks: %v", d.cfg.NodeID, err)
	}
	return handler(ctx, req)
}

// disk returns the named disk or nil.
func (d *Driver) disk(name string) *disk { return d.current().byName[name] }

// triggerStatus asks for an early DiskNode refresh without waiting for it.
func (d *Driver) triggerStatus() {
	select {
	case d.kick <- struct{}{}:
	default:
	}
}
