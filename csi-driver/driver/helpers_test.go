package driver

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"

	dffake "github.com/diskfit/diskfit/apis/client/clientset/versioned/fake"
	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
	"github.com/diskfit/diskfit/csi-driver/config"
	"github.com/diskfit/diskfit/csi-driver/fault"
	"github.com/diskfit/diskfit/csi-driver/internal/testdisk"
	"github.com/diskfit/diskfit/csi-driver/kube"
)

const (
	testNode = "node-a"
	gi       = int64(1) << 30
	mi       = int64(1) << 20
)

// testDisk describes a loop-mounted disk for a test driver.
type testDisk struct {
	name, class, fsType string
	size                int64
	// reserved is the disk's headroom; nil for none.
	reserved *resource.Quantity
}

// env is a driver on real loop-mounted disks with fake API clients.
type env struct {
	d       *Driver
	ctx     context.Context
	kubelet string
	paths   map[string]string
	kube    *k8sfake.Clientset
	diskfit *dffake.Clientset
}

// newEnv starts a driver on fresh disks. faults may be nil.
func newEnv(t testing.TB, disks []testDisk, faults *fault.Injector) *env {
	t.Helper()
	testdisk.Require(t)
	_, ctx := ktesting.NewTestContext(t)
	return newEnvContext(t, ctx, disks, faults)
}

// newEnvContext is newEnv with the context the driver runs and logs with.
// Fuzz targets need one not bound to the *testing.F, whose methods must
// not be called while the fuzz function runs.
func newEnvContext(t testing.TB, ctx context.Context, disks []testDisk, faults *fault.Injector) *env {
	t.Helper()
	testdisk.Require(t)
	e := &env{ctx: ctx, paths: map[string]string{}}
	cfg := &config.NodeConfig{MaxVolumes: 100}
	for _, td := range disks {
		p := testdisk.New(t, td.fsType, td.size)
		e.paths[td.name] = p
		cfg.Disks = append(cfg.Disks, config.Disk{Name: td.name, Backend: v1alpha1.BackendFile, DeviceClass: td.class, Path: p, Reserved: td.reserved})
	}
	e.kubelet = testdisk.KubeletDir(t)
	e.kube = k8sfake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode, UID: types.UID("uid-" + testNode)}})
	e.diskfit = dffake.NewSimpleClientset()
	diskNode := kube.DiskNodePublisher{Kube: e.kube, DiskFit: e.diskfit, NodeName: testNode}
	c := Config{
		Endpoint: "unix:///unused", NodeID: testNode, Node: cfg, KubeletDir: e.kubelet, LockDir: t.TempDir(), StatusInterval: time.Hour,
		PVCs:   kube.PVCGetter{Client: e.kube},
		Status: diskNode,
		Spec:   diskNode,
		Faults: faults,
	}
	d, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	d.Start(ctx)
	t.Cleanup(func() { stopDisks(d) })
	e.d = d
	return e
}

// stopDisks releases d's disks, as the exit of its process does, so that
// another driver can start on them.
func stopDisks(d *Driver) {
	for _, dk := range d.disks() {
		_ = dk.backend.Close()
	}
}

// twoDisks is the usual layout: a small and a big XFS disk.
func twoDisks() []testDisk {
	return []testDisk{
		{name: "small", class: "ssd", fsType: "xfs", size: 2 * gi},
		{name: "big", class: "hdd", fsType: "xfs", size: 4 * gi},
	}
}

func mountCap() *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
}

func blockCap() *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
}

func createReq(name string, size int64) *csi.CreateVolumeRequest {
	return &csi.CreateVolumeRequest{
		Name:               name,
		CapacityRange:      &csi.CapacityRange{RequiredBytes: size},
		VolumeCapabilities: []*csi.VolumeCapability{mountCap()},
		Parameters:         map[string]string{},
	}
}

// addPVC creates a PVC with the given annotations and returns the
// CreateVolume parameters naming it.
func (e *env) addPVC(t *testing.T, name string, annotations map[string]string) map[string]string {
	t.Helper()
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Annotations: annotations}}
	if _, err := e.kube.CoreV1().PersistentVolumeClaims("default").Create(e.ctx, pvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return map[string]string{diskfit.PVCNamespaceKey: "default", diskfit.PVCNameKey: name, diskfit.PVNameKey: "pv-" + name}
}

// createWith makes a volume of the given size for the capability.
func (e *env) createWith(t *testing.T, name string, size int64, cap *csi.VolumeCapability) *csi.Volume {
	t.Helper()
	req := createReq(name, size)
	req.VolumeCapabilities = []*csi.VolumeCapability{cap}
	return e.mustCreate(t, req)
}

func (e *env) mustCreate(t *testing.T, req *csi.CreateVolumeRequest) *csi.Volume {
	t.Helper()
	resp, err := e.d.CreateVolume(e.ctx, req)
	if err != nil {
		t.Fatalf("CreateVolume(%s): %v", req.Name, err)
	}
	return resp.Volume
}

// volumeFiles lists the files in every disk's volume state directory, so
// tests can check that a failed call left nothing behind.
func (e *env) volumeFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	for name, p := range e.paths {
		for _, sub := range []string{"volumes", "snapshots"} {
			entries, err := os.ReadDir(p + "/diskfit/" + sub)
			if err != nil {
				t.Fatal(err)
			}
			for _, en := range entries {
				files = append(files, name+"/"+sub+"/"+en.Name())
			}
		}
	}
	return files
}

func wantCode(t *testing.T, err error, want codes.Code) {
	t.Helper()
	if got := status.Code(err); got != want {
		t.Fatalf("got code %s (%v), want %s", got, err, want)
	}
}

// execOutput runs a command for a test.
var execOutput = testdisk.Output

// newDriverOn starts another driver on e's disks, as after a restart.
func newDriverOn(t *testing.T, e *env) *Driver {
	t.Helper()
	return e.restart(t, e.d.cfg)
}

// restart starts a driver from cfg in place of e.d, as after a restart:
// e.d's disks are released first. The new driver's are released when the
// test ends.
func (e *env) restart(t *testing.T, cfg Config) *Driver {
	t.Helper()
	stopDisks(e.d)
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	d.Start(e.ctx)
	t.Cleanup(func() { stopDisks(d) })
	return d
}
