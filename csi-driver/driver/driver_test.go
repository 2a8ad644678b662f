package driver

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/diskfit/diskfit/apis/diskfit"
)

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestRunServesAndPublishes runs the driver on its socket: the services
// answer over gRPC, /metrics counts the calls, the DiskNode is published
// at start and again after a create, and cancelling the context stops the
// driver cleanly.
func TestRunServesAndPublishes(t *testing.T) {
	e := newEnv(t, []testDisk{{name: "only", fsType: "xfs", size: gi}}, nil)
	cfg := e.d.cfg
	cfg.Endpoint = "unix://" + filepath.Join(t.TempDir(), "csi.sock")
	cfg.MetricsAddress = freePort(t)
	ctx := runDriver(t, e, e.ctx, cfg)

	conn, err := grpc.NewClient(cfg.Endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	wait := func(what string, cond func() (bool, error)) {
		t.Helper()
		if err := waitFor(ctx, cond); err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
	}
	wait("the driver to be ready", func() (bool, error) {
		resp, err := csi.NewIdentityClient(conn).Probe(ctx, &csi.ProbeRequest{}, grpc.WaitForReady(true))
		return err == nil && resp.GetReady().GetValue(), nil
	})
	info, err := csi.NewIdentityClient(conn).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	if err != nil || info.Name != diskfit.DriverName {
		t.Fatalf("plugin info %v, %v", info, err)
	}
	node, err := csi.NewNodeClient(conn).NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
	if err != nil || node.NodeId != testNode || node.AccessibleTopology.Segments[diskfit.TopologyKey] != testNode || node.MaxVolumesPerNode != 100 {
		t.Fatalf("node info %v, %v", node, err)
	}
	wait("the DiskNode at start", func() (bool, error) {
		dn, err := e.diskfit.DiskfitV1alpha1().DiskNodes().Get(ctx, testNode, metav1.GetOptions{})
		return err == nil && len(dn.Status.Disks) == 1, nil
	})
	if _, err := csi.NewControllerClient(conn).CreateVolume(ctx, createReq("pvc-run", 400*mi)); err != nil {
		t.Fatal(err)
	}
	wait("the DiskNode to count the new volume", func() (bool, error) {
		dn, err := e.diskfit.DiskfitV1alpha1().DiskNodes().Get(ctx, testNode, metav1.GetOptions{})
		return err == nil && dn.Status.Disk("only").VolumeCount == 1, nil
	})
	resp, err := http.Get("http://" + cfg.MetricsAddress + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `method_name="/csi.v1.Controller/CreateVolume"`) {
		t.Errorf("/metrics does not count CreateVolume:\n%s", body)
	}
}

// waitFor polls cond until it holds or ctx ends; no test asserts on how
// long that takes.
func waitFor(ctx context.Context, cond func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return wait.PollUntilContextCancel(ctx, 20*time.Millisecond, true, func(context.Context) (bool, error) { return cond() })
}

// TestConcurrentCreateSameName races creations of one name: the per-volume
// lock makes them one volume.
func TestConcurrentCreateSameName(t *testing.T) {
	e := newEnv(t, twoDisks(), nil)
	var wg sync.WaitGroup
	ids := make([]string, 8)
	errs := make([]error, 8)
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := e.d.CreateVolume(e.ctx, createReq("pvc-race", 300*mi))
			if err == nil {
				ids[i] = resp.Volume.VolumeId
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for i := range ids {
		if errs[i] != nil || ids[i] != ids[0] {
			t.Errorf("call %d: %q, %v (first %q)", i, ids[i], errs[i], ids[0])
		}
	}
	list, err := e.d.ListVolumes(e.ctx, &csi.ListVolumesRequest{})
	if err != nil || len(list.Entries) != 1 {
		t.Errorf("volumes %v, %v", list, err)
	}
	if files := e.volumeFiles(t); len(files) != 2 {
		t.Errorf("files %v", files)
	}
}

// TestAttachmentsSurviveRestartAndReboot stages a volume, starts a new
// driver (a restart) that must find the loop device again by its backing
// file, then detaches and unmounts everything behind the driver's back (a
// reboot) and stages again, which must re-create the attachment.
func TestAttachmentsSurviveRestartAndReboot(t *testing.T) {
	e := newEnv(t, []testDisk{{name: "xfs", fsType: "xfs", size: 2 * gi}}, nil)
	cap := mountCap()
	vol := e.mustCreate(t, createReq("pvc-restart", 400*mi))
	staging := e.stage(t, vol.VolumeId, cap)
	dev, err := e.d.disk("xfs").backend.Device(e.ctx, "pvc-restart")
	if err != nil || dev == "" {
		t.Fatalf("device %q, %v", dev, err)
	}

	restarted := newDriverOn(t, e)
	e.d = restarted
	if again, _ := restarted.disk("xfs").backend.Device(e.ctx, "pvc-restart"); again != dev {
		t.Errorf("after a restart the volume is on %q, was %q", again, dev)
	}
	target, err := e.publish(t, vol.VolumeId, staging, "after-restart", cap, false)
	if err != nil {
		t.Fatal(err)
	}

	// The reboot: mounts and loop devices are gone, the files stay.
	for _, args := range [][]string{{"umount", target}, {"umount", staging}, {"losetup", "--detach", dev}} {
		if _, err := runCmd(args...); err != nil {
			t.Fatal(err)
		}
	}
	if d, _ := restarted.disk("xfs").backend.Device(e.ctx, "pvc-restart"); d != "" {
		t.Fatalf("still attached to %s after detaching", d)
	}
	staging = e.stage(t, vol.VolumeId, cap)
	target, err = e.publish(t, vol.VolumeId, staging, "after-reboot", cap, false)
	if err != nil {
		t.Fatal(err)
	}
	e.teardown(t, vol.VolumeId, staging, target)
}

func runCmd(args ...string) (string, error) {
	out, err := execOutput(args[0], args[1:]...)
	if err != nil {
		return out, fmt.Errorf("%v: %w", args, err)
	}
	return out, nil
}

// TestNotReadyUntilStarted checks that only identity and node-info calls
// are answered while the disks are being scanned.
func TestNotReadyUntilStarted(t *testing.T) {
	d := &Driver{}
	handler := func(context.Context, any) (any, error) { return "answered", nil }
	tests := []struct {
		method string
		want   codes.Code
	}{
		{"/csi.v1.Identity/Probe", codes.OK},
		{"/csi.v1.Identity/GetPluginInfo", codes.OK},
		{"/csi.v1.Node/NodeGetInfo", codes.OK},
		{"/csi.v1.Controller/CreateVolume", codes.Unavailable},
		{"/csi.v1.Controller/ControllerGetCapabilities", codes.Unavailable},
		{"/csi.v1.Node/NodeStageVolume", codes.Unavailable},
	}
	for _, tt := range tests {
		t.Run(tt.method, func(t *testing.T) {
			_, err := d.readyInterceptor(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: tt.method}, handler)
			wantCode(t, err, tt.want)
		})
	}
	probe, err := d.Probe(context.Background(), &csi.ProbeRequest{})
	if err != nil || probe.GetReady().GetValue() {
		t.Errorf("Probe before start: %v, %v", probe, err)
	}
	d.ready.Store(true)
	if _, err := d.readyInterceptor(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/csi.v1.Controller/CreateVolume"}, handler); err != nil {
		t.Errorf("after start: %v", err)
	}
}

// TestStatusRetriesUntilNodeExists starts the driver before its Node
// object exists, as happens when the driver's pod beats the node's
// registration: the DiskNode appears soon after the Node does, without
// waiting for the (here one hour) status interval.
func TestStatusRetriesUntilNodeExists(t *testing.T) {
	e := newEnv(t, []testDisk{{name: "only", fsType: "xfs", size: gi}}, nil)
	if err := e.kube.CoreV1().Nodes().Delete(e.ctx, testNode, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg := e.d.cfg
	cfg.Endpoint = "unix://" + filepath.Join(t.TempDir(), "csi.sock")
	ctx := runDriver(t, e, e.ctx, cfg)
	if err := waitFor(ctx, func() (bool, error) {
		acts := e.kube.Actions()
		return len(acts) > 0 && acts[len(acts)-1].GetResource().Resource == "nodes", nil
	}); err != nil {
		t.Fatalf("waiting for the first publish attempt: %v", err)
	}
	if _, err := e.diskfit.DiskfitV1alpha1().DiskNodes().Get(ctx, testNode, metav1.GetOptions{}); err == nil {
		t.Fatal("a DiskNode exists without its Node")
	}
	if _, err := e.kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode, UID: "uid-new"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := waitFor(ctx, func() (bool, error) {
		dn, err := e.diskfit.DiskfitV1alpha1().DiskNodes().Get(ctx, testNode, metav1.GetOptions{})
		return err == nil && len(dn.Status.Disks) > 0, nil
	}); err != nil {
		t.Fatalf("waiting for the DiskNode after the Node appeared: %v", err)
	}
}

// runDriver builds a driver from cfg and runs it in place of e.d, whose
// disks it releases first, until the test ends, when Run must return
// without error. It returns the driver's context.
func runDriver(t *testing.T, e *env, parent context.Context, cfg Config) context.Context {
	t.Helper()
	stopDisks(e.d)
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.d = d
	ctx, cancel := context.WithCancel(parent)
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		stopDisks(d)
	})
	return ctx
}
