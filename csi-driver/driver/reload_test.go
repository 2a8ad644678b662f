package driver

import (
	"context"
	"errors"
	"fmt"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
	"github.com/diskfit/diskfit/csi-driver/backend"
	"github.com/diskfit/diskfit/csi-driver/config"
)

// recordedEvent is one Event the driver recorded.
type recordedEvent struct{ eventType, reason, message string }

// fakeEvents records the driver's Events.
type fakeEvents struct {
	mu     sync.Mutex
	events []recordedEvent
}

func (f *fakeEvents) Event(_ context.Context, eventType, reason, message string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events = append(f.events, recordedEvent{eventType, reason, message})
}

// find returns the recorded events with reason.
func (f *fakeEvents) find(reason string) []recordedEvent {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []recordedEvent
	for _, ev := range f.events {
		if ev.reason == reason {
			out = append(out, ev)
		}
	}
	return out
}

// reloadEnv is a running driver whose node config lives in a directory laid
// out as the kubelet lays out a ConfigMap volume.
type reloadEnv struct {
	*env
	d      *Driver
	dir    string
	events *fakeEvents
	ctx    context.Context
	gen    int
}

// writeConfigMap writes node.yaml the way the kubelet updates a ConfigMap
// volume: a new timestamped directory, then the ..data symlink swapped
// atomically; node.yaml itself is a symlink through ..data.
func (r *reloadEnv) writeConfigMap(t *testing.T, content string) {
	t.Helper()
	r.gen++
	ts := fmt.Sprintf("..2026_01_01_00_00_%02d.%d", r.gen, r.gen)
	if err := os.Mkdir(filepath.Join(r.dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(r.dir, ts, "node.yaml"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(r.dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(r.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(r.dir, "node.yaml")); os.IsNotExist(err) {
		if err := os.Symlink("..data/node.yaml", filepath.Join(r.dir, "node.yaml")); err != nil {
			t.Fatal(err)
		}
	}
}

// diskYAML is a node config naming the given disks of e with class = name.
func (r *reloadEnv) diskYAML(maxVolumes int, disks ...string) string {
	s := fmt.Sprintf("maxVolumes: %d\ndisks:\n", maxVolumes)
	for _, name := range disks {
		s += fmt.Sprintf("- name: %s\n  deviceClass: %s\n  path: %s\n", name, name, r.paths[name])
	}
	return s
}

// newReloadEnv makes the disks, writes a node config naming only those in
// initial, and runs the driver on it with a fast reload.
func newReloadEnv(t *testing.T, disks []testDisk, initial ...string) *reloadEnv {
	t.Helper()
	r := &reloadEnv{env: newEnv(t, disks, nil), dir: t.TempDir(), events: &fakeEvents{}}
	r.writeConfigMap(t, r.diskYAML(100, initial...))
	src := &config.Source{Path: filepath.Join(r.dir, "node.yaml"), NodeName: testNode}
	nodeCfg, err := src.Load(r.env.ctx)
	if err != nil {
		t.Fatal(err)
	}
	cfg := r.env.d.cfg
	cfg.Node = nodeCfg
	cfg.Source = src
	cfg.ReloadInterval = 20 * time.Millisecond
	cfg.Events = r.events
	cfg.Endpoint = "unix://" + filepath.Join(t.TempDir(), "csi.sock")
	cfg.MetricsAddress = freePort(t)
	stopDisks(r.env.d)
	r.d, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(r.env.ctx)
	done := make(chan error, 1)
	go func() { done <- r.d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		stopDisks(r.d)
	})
	r.ctx = ctx
	r.wait(t, "the driver to be ready", func() bool { return r.d.ready.Load() })
	return r
}

func (r *reloadEnv) wait(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if err := waitFor(r.ctx, func() (bool, error) { return cond(), nil }); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// observed returns the disk's status in Observe(), nil when not there.
func (r *reloadEnv) observed(name string) *v1alpha1.DiskStatus {
	st := r.d.Observe(r.ctx)
	for i := range st.Disks {
		if st.Disks[i].Name == name {
			return &st.Disks[i]
		}
	}
	return nil
}

// createOn creates a volume of the device class that only the named disk
// has in these tests, so it must land there.
func (r *reloadEnv) createOn(t *testing.T, name, disk string) (*csi.Volume, error) {
	t.Helper()
	req := createReq(name, 300*mi)
	req.Parameters = map[string]string{diskfit.DeviceClassParameter: disk}
	resp, err := r.d.CreateVolume(r.ctx, req)
	if err != nil {
		return nil, err
	}
	if !strings.HasPrefix(resp.Volume.VolumeId, disk+":") {
		t.Fatalf("volume %s is not on disk %s", resp.Volume.VolumeId, disk)
	}
	return resp.Volume, nil
}

func twoSmallDisks() []testDisk {
	return []testDisk{{name: "one", fsType: "xfs", size: gi}, {name: "two", fsType: "xfs", size: gi}}
}

// TestReloadAddsDisk: a disk added to the config file while the driver
// runs is served: it takes a volume and appears in the node's status.
func TestReloadAddsDisk(t *testing.T) {
	r := newReloadEnv(t, twoSmallDisks(), "one")
	if r.observed("two") != nil {
		t.Fatal("disk two is served before it is configured")
	}
	if _, err := r.createOn(t, "pvc-early", "two"); err == nil {
		t.Fatal("a volume was made on disk two before it was configured")
	}
	r.writeConfigMap(t, r.diskYAML(100, "one", "two"))
	r.wait(t, "disk two in the status", func() bool { st := r.observed("two"); return st != nil && st.Healthy })
	if _, err := r.createOn(t, "pvc-new", "two"); err != nil {
		t.Fatal(err)
	}
	if st := r.observed("two"); st.VolumeCount != 1 {
		t.Errorf("disk two counts %d volumes, want 1", st.VolumeCount)
	}
	if len(r.events.find("ConfigChangeRefused")) != 0 || len(r.events.find("InvalidConfig")) != 0 {
		t.Errorf("warnings for a safe change: %+v", r.events.events)
	}
}

// TestReloadRefusesRemovingDiskWithVolumes: removing a disk that holds a
// volume is refused: the volume's data and space stay, the disk is still
// served, and a Warning Event says which disk, how many volumes and what
// to do.
func TestReloadRefusesRemovingDiskWithVolumes(t *testing.T) {
	r := newReloadEnv(t, twoSmallDisks(), "one", "two")
	vol, err := r.createOn(t, "pvc-keep", "two")
	if err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(r.paths["two"], "diskfit", "volumes", "pvc-keep.img")
	data := []byte("data that must survive a config change")
	f, err := os.OpenFile(img, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(data, 4096); err != nil {
		t.Fatal(err)
	}
	f.Close()

	r.writeConfigMap(t, r.diskYAML(100, "one"))
	r.wait(t, "the refusal", func() bool { return len(r.events.find("ConfigChangeRefused")) > 0 })
	ev := r.events.find("ConfigChangeRefused")[0]
	if ev.eventType != corev1.EventTypeWarning || !strings.Contains(ev.message, `"two"`) || !strings.Contains(ev.message, "1 volume") {
		t.Errorf("event %+v does not warn about disk two and its volume", ev)
	}
	// Several reloads later it is still served, and warned about once.
	time.Sleep(200 * time.Millisecond)
	if n := len(r.events.find("ConfigChangeRefused")); n != 1 {
		t.Errorf("%d refusal events for one refused change, want 1", n)
	}
	if st := r.observed("two"); st == nil || !st.Healthy || st.VolumeCount != 1 {
		t.Fatalf("disk two after the refused change: %+v", st)
	}
	got := make([]byte, len(data))
	f, err = os.Open(img)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.ReadAt(got, 4096); err != nil || string(got) != string(data) {
		t.Fatalf("volume data %q, %v; want %q", got, err, data)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != vol.CapacityBytes || st.Blocks*512 < vol.CapacityBytes {
		t.Errorf("volume file has %d bytes, %d allocated; want %d, all allocated", st.Size, st.Blocks*512, vol.CapacityBytes)
	}
	if _, err := r.createOn(t, "pvc-after", "two"); err != nil {
		t.Errorf("disk two no longer takes volumes after the refused change: %v", err)
	}
}

// TestReloadRemovesEmptyDisk: a disk without volumes or snapshots removed
// from the config is no longer served.
func TestReloadRemovesEmptyDisk(t *testing.T) {
	r := newReloadEnv(t, twoSmallDisks(), "one", "two")
	r.writeConfigMap(t, r.diskYAML(100, "one"))
	r.wait(t, "disk two to leave the status", func() bool { return r.observed("two") == nil })
	_, err := r.createOn(t, "pvc-gone", "two")
	wantCode(t, err, codes.ResourceExhausted)
	if len(r.events.find("ConfigChangeRefused")) != 0 {
		t.Errorf("removing an empty disk was refused: %+v", r.events.events)
	}
}

// TestReloadChangesReserved: a new reserve applies live: the free space
// reported drops by exactly the reserve.
func TestReloadChangesReserved(t *testing.T) {
	r := newReloadEnv(t, twoSmallDisks(), "one")
	before := r.observed("one").FreeBytes
	r.writeConfigMap(t, r.diskYAML(100, "one")+"  reserved: 64Mi\n")
	// The file system's own background work moves free space by a block
	// or two on its own: wait for the reserve itself, and allow that much.
	const slack = 64 << 10
	r.wait(t, "the new reserve", func() bool { return before-r.observed("one").FreeBytes > 64*mi-slack })
	if got := r.observed("one").FreeBytes; got < before-64*mi-slack || got > before-64*mi+slack {
		t.Errorf("free %d after reserving 64Mi, want %d (within %d bytes)", got, before-64*mi, slack)
	}
}

// TestReloadKeepsConfigWhenInvalid: a config that does not validate is
// not applied; the running disks stay and a Warning Event gives the error.
func TestReloadKeepsConfigWhenInvalid(t *testing.T) {
	r := newReloadEnv(t, twoSmallDisks(), "one", "two")
	r.writeConfigMap(t, "disks:\n- name: one\n  path: "+r.paths["one"]+"\n  size: 1Gi\n")
	r.wait(t, "the warning", func() bool { return len(r.events.find("InvalidConfig")) > 0 })
	ev := r.events.find("InvalidConfig")[0]
	if ev.eventType != corev1.EventTypeWarning || !strings.Contains(ev.message, `unknown field "size"`) {
		t.Errorf("event %+v", ev)
	}
	if r.observed("one") == nil || r.observed("two") == nil {
		t.Fatal("the running disks were dropped for an invalid config")
	}
	if _, err := r.createOn(t, "pvc-still", "two"); err != nil {
		t.Fatal(err)
	}
}

// TestReloadMaxVolumesNeedsRestart: maxVolumes is read once by the
// kubelet, so a change says it needs a restart and NodeGetInfo keeps the
// value the kubelet has.
func TestReloadMaxVolumesNeedsRestart(t *testing.T) {
	r := newReloadEnv(t, twoSmallDisks(), "one")
	r.writeConfigMap(t, r.diskYAML(7, "one"))
	r.wait(t, "the event", func() bool { return len(r.events.find("RestartNeeded")) > 0 })
	if ev := r.events.find("RestartNeeded")[0]; !strings.Contains(ev.message, "maxVolumes") {
		t.Errorf("event %+v", ev)
	}
	info, err := r.d.NodeGetInfo(r.ctx, &csi.NodeGetInfoRequest{})
	if err != nil || info.MaxVolumesPerNode != 100 {
		t.Fatalf("NodeGetInfo %v, %v; want the running 100", info, err)
	}
}

// TestRetireWaitsForCreation: a disk is retired only once no creation on
// it is in flight, so a volume made while its disk leaves the config is
// counted and keeps the disk; a retired disk takes nothing new.
func TestRetireWaitsForCreation(t *testing.T) {
	e := newEnv(t, twoSmallDisks(), nil)
	dk := e.d.disk("two")
	release, err := dk.hold()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan string, 1)
	go func() { done <- dk.retire(e.ctx) }()
	select {
	case msg := <-done:
		t.Fatalf("retired (%q) while a creation held the disk", msg)
	case <-time.After(100 * time.Millisecond):
	}
	if _, err := dk.backend.CreateVolume(e.ctx, backend.CreateRequest{Key: "pvc-inflight", Name: "pvc-inflight", SizeBytes: 300 * mi}); err != nil {
		t.Fatal(err)
	}
	release()
	if msg := <-done; !strings.Contains(msg, "1 volume") {
		t.Fatalf("retire said %q, want it to count the volume made meanwhile", msg)
	}
	empty := e.d.disk("one")
	if msg := empty.retire(e.ctx); msg != "" {
		t.Fatalf("an empty disk was not retired: %s", msg)
	}
	if _, err := empty.hold(); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a retired disk was held: %v", err)
	}
}

// TestNodeWithoutSection: a node no section selects runs without disks,
// answers Unavailable saying why, and takes its disks once the config
// selects it.
func TestNodeWithoutSection(t *testing.T) {
	e := newEnv(t, twoSmallDisks(), nil)
	r := &reloadEnv{env: e, dir: t.TempDir(), events: &fakeEvents{}}
	section := func(node string) string {
		return "nodes:\n- nodeNames: [" + node + "]\n  " + strings.ReplaceAll(r.diskYAML(100, "one"), "\n", "\n  ")
	}
	r.writeConfigMap(t, section("other-node"))
	src := &config.Source{Path: filepath.Join(r.dir, "node.yaml"), NodeName: testNode}
	_, noDisks := src.Load(e.ctx)
	if !errors.Is(noDisks, config.ErrNoSection) {
		t.Fatalf("got %v, want ErrNoSection", noDisks)
	}
	cfg := e.d.cfg
	cfg.Node, cfg.NoDisksReason, cfg.Source, cfg.ReloadInterval, cfg.Events = &config.NodeConfig{}, noDisks, src, 20*time.Millisecond, r.events
	cfg.Endpoint = "unix://" + filepath.Join(t.TempDir(), "csi.sock")
	r.ctx = runDriver(t, e, e.ctx, cfg)
	conn, err := grpc.NewClient(cfg.Endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	create := func() error {
		_, err := csi.NewControllerClient(conn).CreateVolume(r.ctx, createReq("pvc-x", 300*mi), grpc.WaitForReady(true))
		return err
	}
	r.wait(t, "an answer that names the reason", func() bool {
		err := create()
		return status.Code(err) == codes.Unavailable && strings.Contains(err.Error(), "no section of the node config selects this node")
	})
	r.writeConfigMap(t, section(testNode))
	r.wait(t, "the disk", func() bool { return create() == nil })
}

// TestReloadDropsMetricsOfGoneDisks: /metrics has no series of a disk no
// longer served, nor of a device class a disk no longer has.
func TestReloadDropsMetricsOfGoneDisks(t *testing.T) {
	r := newReloadEnv(t, twoSmallDisks(), "one", "two")
	addr := r.d.cfg.MetricsAddress
	has := func(disk, class string) bool {
		_, ok := scrape(t, addr)[diskSeries("diskfit_disk_free_bytes", disk, class)]
		return ok
	}
	r.wait(t, "both disks' series", func() bool { return has("one", "one") && has("two", "two") })
	r.writeConfigMap(t, strings.Replace(r.diskYAML(100, "one"), "deviceClass: one", "deviceClass: fast", 1))
	r.wait(t, "the new class's series", func() bool { return has("one", "fast") })
	if has("two", "two") || has("one", "one") {
		t.Errorf("series of a removed disk or an old class are still served: %v", scrape(t, addr))
	}
}

// A disk holding volumes renamed in the config (same path, new name) is
// kept under its old name, and the new name is not started: serving the
// same store under two names would let the second one's recovery roll back
// the first one's work, count its space twice and list its volumes as
// having no PV.
func TestReloadRefusesASecondNameForTheSameDisk(t *testing.T) {
	r := newReloadEnv(t, twoSmallDisks(), "one", "two")
	if _, err := r.createOn(t, "pvc-keep", "two"); err != nil {
		t.Fatal(err)
	}
	renamed := fmt.Sprintf("maxVolumes: 100\ndisks:\n- name: one\n  deviceClass: one\n  path: %s\n- name: three\n  deviceClass: three\n  path: %s\n", r.paths["one"], r.paths["two"])
	r.writeConfigMap(t, renamed)
	r.wait(t, "the refusals", func() bool { return len(r.events.find("ConfigChangeRefused")) >= 1 })
	time.Sleep(200 * time.Millisecond)
	if st := r.observed("three"); st != nil {
		t.Errorf("disk two's store is also served as disk three: %+v", st)
	}
	if st := r.observed("two"); st == nil || !st.Healthy || st.VolumeCount != 1 || st.VolumesWithoutPV != 0 {
		t.Errorf("disk two after the rename: %+v, want it served with its volume", st)
	}
	found := false
	for _, ev := range r.events.find("ConfigChangeRefused") {
		found = found || strings.Contains(ev.message, `"three"`)
	}
	if !found {
		t.Errorf("no event says why disk three was not started: %+v", r.events.find("ConfigChangeRefused"))
	}
}
