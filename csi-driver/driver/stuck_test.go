package driver

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"k8s.io/klog/v2/ktesting"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
	"github.com/diskfit/diskfit/csi-driver/backend"
	"github.com/diskfit/diskfit/csi-driver/config"
	"github.com/diskfit/diskfit/csi-driver/lvm"
)

// hangingBackend is a disk's real backend whose Usage and ListVolumes hang
// while hang is set, as statfs and getdents do on a dying device: the
// call ignores its context and returns only when released.
type hangingBackend struct {
	backend.Backend
	hang       atomic.Bool
	release    chan struct{}
	once       sync.Once
	usageCalls atomic.Int32
	listCalls  atomic.Int32
}

func newHangingBackend(b backend.Backend) *hangingBackend {
	h := &hangingBackend{Backend: b, release: make(chan struct{})}
	h.hang.Store(true)
	return h
}

func (h *hangingBackend) Usage(ctx context.Context) (backend.Usage, error) {
	h.usageCalls.Add(1)
	if h.hang.Load() {
		<-h.release
	}
	return h.Backend.Usage(ctx)
}

func (h *hangingBackend) ListVolumes(ctx context.Context) ([]backend.Volume, error) {
	h.listCalls.Add(1)
	if h.hang.Load() {
		<-h.release
	}
	return h.Backend.ListVolumes(ctx)
}

// unblock lets the hanging calls return, and the next ones not hang.
func (h *hangingBackend) unblock() {
	h.hang.Store(false)
	h.once.Do(func() { close(h.release) })
}

// within runs f and fails the test when it does not return within limit,
// so that a call that hangs fails the test instead of the test binary.
func within[T any](t *testing.T, limit time.Duration, what string, f func() T) (T, time.Duration) {
	t.Helper()
	done := make(chan T, 1)
	start := time.Now()
	go func() { done <- f() }()
	select {
	case v := <-done:
		return v, time.Since(start)
	case <-time.After(limit):
		t.Fatalf("%s did not return within %s: it hangs on the stuck disk", what, limit)
		panic("unreachable")
	}
}

func abs(n int64) int64 { return max(n, -n) }

func diskOf(t *testing.T, st *v1alpha1.DiskNodeStatus, name string) v1alpha1.DiskStatus {
	t.Helper()
	ds := st.Disk(name)
	if ds == nil {
		t.Fatalf("disk %s is not in the status %+v", name, st.Disks)
	}
	return *ds
}

// A disk whose calls hang (a dying device leaves statfs and getdents in D
// state) does not hold up the DiskNode: Observe returns within the disk
// status timeout with that disk unhealthy and saying why, and the other
// disk's status complete and right. A second Observe while the first call
// still hangs starts no second one (the hung call is remembered) and says
// since when the disk does not answer; CreateVolume and the health RPCs
// answer at once, placing the volume on the other disk. Once the calls
// return, the next Observe finds the disk healthy with its numbers.
func TestStuckDiskDoesNotHoldUpTheStatus(t *testing.T) {
	const timeout = time.Second
	const slack = 3 * time.Second
	e := newEnv(t, twoDisks(), nil)
	setDiskStatusTimeout(e.d, timeout)

	req := createReq("on-big", 100*mi)
	req.Parameters = e.addPVC(t, "on-big", map[string]string{diskfit.SelectedNodeAnnotation: testNode, diskfit.SelectedDiskAnnotation: "big"})
	onBig := e.mustCreate(t, req).CapacityBytes

	small, big := e.d.disk("small"), e.d.disk("big")
	h := newHangingBackend(small.backend)
	small.backend = h
	t.Cleanup(h.unblock)

	checkBig := func(st *v1alpha1.DiskNodeStatus) {
		t.Helper()
		got := diskOf(t, st, "big")
		u, err := big.backend.Usage(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		// XFS settles its metadata a block or so at a time after the
		// create: free space may move by that much between two statfs.
		if !got.Healthy || got.VolumeCount != 1 || abs(got.FreeBytes-u.FreeBytes) > mi ||
			got.CapacityBytes != min(got.FreeBytes+onBig, u.CapacityBytes) {
			t.Errorf("disk big: %+v, want healthy with 1 volume, %d bytes free and capacity free + %d", got, u.FreeBytes, onBig)
		}
	}

	st, took := within(t, timeout+slack, "Observe", func() *v1alpha1.DiskNodeStatus { return e.d.Observe(e.ctx) })
	if took > timeout+slack {
		t.Errorf("Observe took %s, want about the disk status timeout %s", took, timeout)
	}
	got := diskOf(t, st, "small")
	if got.Healthy || !strings.Contains(got.Message, "did not answer within 1s") {
		t.Errorf("stuck disk small: %+v, want it unhealthy, not answering within 1s", got)
	}
	checkBig(st)
	if st.HealthyDisks != 1 || st.DiskCount != 2 {
		t.Errorf("summary %d healthy of %d, want 1 of 2", st.HealthyDisks, st.DiskCount)
	}

	st, took = within(t, timeout+slack, "second Observe", func() *v1alpha1.DiskNodeStatus { return e.d.Observe(e.ctx) })
	if took > timeout+slack {
		t.Errorf("second Observe took %s", took)
	}
	got = diskOf(t, st, "small")
	t.Logf("stuck disk at the second Observe: %s", got.Message)
	if got.Healthy || !strings.Contains(got.Message, "still not answering since") {
		t.Errorf("stuck disk small at the second Observe: %+v, want it unhealthy, still not answering", got)
	}
	checkBig(st)
	if n := h.usageCalls.Load(); n != 1 {
		t.Errorf("Usage of the stuck disk called %d times, want 1: a new call is stacked on the hung one", n)
	}

	// Best fit would choose small; it does not answer, so big it is.
	vol, _ := within(t, slack, "CreateVolume", func() *csi.Volume { return e.mustCreate(t, createReq("while-stuck", 100*mi)) })
	if !strings.HasPrefix(vol.VolumeId, "big"+idSeparator) {
		t.Errorf("volume %s placed on the stuck disk", vol.VolumeId)
	}
	health, _ := within(t, slack, "NodeGetStorageHealth", func() *csi.NodeGetStorageHealthResponse {
		resp, err := e.d.NodeGetStorageHealth(e.ctx, &csi.NodeGetStorageHealthRequest{})
		if err != nil {
			t.Error(err)
		}
		return resp
	})
	if bh := health.GetBackendHealth(); len(bh) != 1 || !strings.Contains(bh[0].Message, "disk small") {
		t.Errorf("storage health %v, want disk small unreachable", bh)
	}
	if n := h.usageCalls.Load(); n != 1 {
		t.Errorf("Usage of the stuck disk called %d times, want still 1", n)
	}

	h.unblock()
	waitNotObserving(t, small)
	st = e.d.Observe(e.ctx)
	got = diskOf(t, st, "small")
	u, err := h.Backend.Usage(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Healthy || abs(got.FreeBytes-u.FreeBytes) > mi || got.VolumeCount != 0 {
		t.Errorf("disk small after its calls returned: %+v, want healthy with %d bytes free", got, u.FreeBytes)
	}
	if n := h.usageCalls.Load(); n != 2 {
		t.Errorf("Usage of the disk called %d times, want 2", n)
	}
	vol = e.mustCreate(t, createReq("after", 100*mi))
	if !strings.HasPrefix(vol.VolumeId, "small"+idSeparator) {
		t.Errorf("volume %s not placed on small, the best fit, once it answers again", vol.VolumeId)
	}
}

// setDiskStatusTimeout gives every disk of d the status timeout.
func setDiskStatusTimeout(d *Driver, timeout time.Duration) {
	d.cfg.DiskStatusTimeout = timeout
	for _, dk := range d.disks() {
		dk.timeout = timeout
	}
}

// waitNotObserving waits until the disk's hung status observation returned.
func waitNotObserving(t *testing.T, dk *disk) {
	t.Helper()
	for start := time.Now(); dk.observing.busy(); time.Sleep(10 * time.Millisecond) {
		if time.Since(start) > 10*time.Second {
			t.Fatal("the status observation of the disk did not return once its calls were let go")
		}
	}
}

// lvmHangRunner answers vgs and lvs for an empty volume group vg0; while
// hang is set, vgs is a real command that hangs (sleep) run by
// lvm.ExecRunner, as lvm hangs reading a dying device.
type lvmHangRunner struct {
	hang     atomic.Bool
	vgsCalls atomic.Int32
}

func (r *lvmHangRunner) Run(ctx context.Context, name string, args ...string) (string, error) {
	switch name {
	case "vgs":
		r.vgsCalls.Add(1)
		if r.hang.Load() {
			return lvm.ExecRunner{}.Run(ctx, "sleep", "60")
		}
		return `{"report":[{"vg":[{"vg_name":"vg0","vg_size":"1073741824","vg_free":"536870912","vg_uuid":"u1"}]}]}`, nil
	case "lvs":
		return `{"report":[{"lv":[]}]}`, nil
	}
	return "", fmt.Errorf("unexpected command %s %v", name, args)
}

// An lvm command of the status observation that hangs is killed at the
// observation's deadline: the disk is reported not answering, the
// observation returns by itself (no goroutine is left waiting on it), and
// the next one finds the disk healthy once lvm answers again.
func TestHungLVMCommandIsKilledAtTheDeadline(t *testing.T) {
	const timeout = time.Second
	const slack = 3 * time.Second
	_, ctx := ktesting.NewTestContext(t)
	dm := filepath.Join(t.TempDir(), "control")
	if err := os.WriteFile(dm, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	run := &lvmHangRunner{}
	d, err := New(Config{
		Endpoint: "unix:///unused", NodeID: testNode, KubeletDir: t.TempDir(), LockDir: t.TempDir(), StatusInterval: time.Hour,
		Node:                &config.NodeConfig{MaxVolumes: 10, Disks: []config.Disk{{Name: "lvm", Backend: v1alpha1.BackendLVM, VolumeGroup: "vg0"}}},
		LVMRunner:           run,
		DeviceMapperControl: dm,
		DiskStatusTimeout:   timeout,
	})
	if err != nil {
		t.Fatal(err)
	}
	d.Start(ctx)
	if st := d.Observe(ctx); !diskOf(t, st, "lvm").Healthy {
		t.Fatalf("lvm disk before the hang: %+v", st.Disks)
	}

	run.hang.Store(true)
	before := run.vgsCalls.Load()
	st, took := within(t, timeout+slack, "Observe", func() *v1alpha1.DiskNodeStatus { return d.Observe(ctx) })
	got := diskOf(t, st, "lvm")
	t.Logf("lvm disk with vgs hanging: %s", got.Message)
	if got.Healthy || !strings.Contains(got.Message, "did not answer within 1s") || took > timeout+slack {
		t.Errorf("lvm disk with vgs hanging: %+v after %s, want it unhealthy, not answering within 1s", got, took)
	}
	// Killed at the deadline, the command returns and so does the
	// observation, at once rather than when sleep would have ended.
	start := time.Now()
	waitNotObserving(t, d.disk("lvm"))
	if waited := time.Since(start); waited > slack {
		t.Errorf("the observation returned %s after its deadline: the hung command was not killed", waited)
	}
	if n := run.vgsCalls.Load() - before; n != 1 {
		t.Errorf("vgs run %d times by one observation, want 1", n)
	}

	run.hang.Store(false)
	got = diskOf(t, d.Observe(ctx), "lvm")
	if !got.Healthy || got.FreeBytes != 512<<20 {
		t.Errorf("lvm disk once vgs answers again: %+v, want healthy with 512 MiB free", got)
	}
}
