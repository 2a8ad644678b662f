package driver

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
	"github.com/diskfit/diskfit/csi-driver/config"
	"github.com/diskfit/diskfit/csi-driver/fault"
	"github.com/diskfit/diskfit/csi-driver/internal/testdisk"
)

// The crash child is this test binary run again with fault.EnvVar naming a
// step and these variables naming its disk, kubelet directory and socket:
// it serves the driver as diskfit-csi does and SIGKILLs itself at the step.
const (
	crashEnvDisk    = "DISKFIT_TEST_CRASH_DISK"
	crashEnvKubelet = "DISKFIT_TEST_CRASH_KUBELET"
	crashEnvSocket  = "DISKFIT_TEST_CRASH_SOCKET"
)

func TestMain(m *testing.M) {
	if os.Getenv(fault.EnvVar) != "" {
		runCrashChild()
		return
	}
	os.Exit(m.Run())
}

func runCrashChild() {
	// The same call diskfit-csi's main makes.
	faults, err := fault.FromEnv()
	if err != nil {
		klog.Fatal(err)
	}
	d, err := New(Config{
		Endpoint: "unix://" + os.Getenv(crashEnvSocket), NodeID: testNode, KubeletDir: os.Getenv(crashEnvKubelet), StatusInterval: time.Hour,
		LockDir: os.TempDir(), // unused: no lvm disk
		Node:    &config.NodeConfig{Disks: []config.Disk{{Name: "only", Backend: v1alpha1.BackendFile, Path: os.Getenv(crashEnvDisk)}}},
		Faults:  faults,
	})
	if err != nil {
		klog.Fatal(err)
	}
	if err := d.Run(context.Background()); err != nil {
		klog.Fatal(err)
	}
}

// crashCase is one operation killed at each of its steps. prepare makes
// what the operation needs with an in-process driver and returns the
// request, which is sent to the driver process that is killed and then,
// unchanged, to a driver restarted on the same disk. check looks at the
// result through the restarted driver's socket and at the disk itself.
type crashCase struct {
	prepare func(t *testing.T, e *env) any
	check   func(t *testing.T, e *env, conn *grpc.ClientConn)
	// afterKill, when set, changes what the killed driver left at step
	// before the new driver starts: what a crash could have left besides
	// (a torn mkfs, when the whole container dies with the driver).
	afterKill func(t *testing.T, e *env, step fault.Step)
	// volumes and bytes are what the DiskNode must count afterwards.
	volumes int32
	bytes   int64
}

// crashCases holds a case for every operation that has fault steps.
func crashCases() map[string]crashCase {
	volume := func(name string, size int64) func(t *testing.T, e *env) *csi.Volume {
		return func(t *testing.T, e *env) *csi.Volume { return e.mustCreate(t, createReq(name, size)) }
	}
	return map[string]crashCase{
		"CreateVolume": {
			prepare: func(*testing.T, *env) any { return createReq("pvc-crash", 500*mi) },
			check: func(t *testing.T, e *env, conn *grpc.ClientConn) {
				wantVolumes(t, e, conn, map[string]int64{"only:pvc-crash": 500 * mi})
				wantFiles(t, e, "only/volumes/pvc-crash.img", "only/volumes/pvc-crash.json")
			},
			volumes: 1, bytes: 500 * mi,
		},
		"DeleteVolume": {
			prepare: func(t *testing.T, e *env) any {
				return &csi.DeleteVolumeRequest{VolumeId: volume("pvc-crash", 500*mi)(t, e).VolumeId}
			},
			check: func(t *testing.T, e *env, conn *grpc.ClientConn) {
				wantVolumes(t, e, conn, map[string]int64{})
				wantFiles(t, e)
			},
		},
		"NodeStageVolume": {
			prepare: func(t *testing.T, e *env) any {
				vol := volume("pvc-crash", 500*mi)(t, e)
				return &csi.NodeStageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: crashStaging(e), VolumeCapability: mountCap()}
			},
			afterKill: func(t *testing.T, e *env, step fault.Step) {
				if step != fault.NodeStageVolumeFormatting {
					return
				}
				loops := testdisk.LoopsBelow(e.paths["only"])
				if len(loops) != 1 {
					t.Fatalf("loop devices %v after the kill, want the volume's one", loops)
				}
				tearFilesystem(t, loops[0])
			},
			check: func(t *testing.T, e *env, conn *grpc.ClientConn) {
				wantVolumes(t, e, conn, map[string]int64{"only:pvc-crash": 500 * mi})
				wantFiles(t, e, "only/volumes/pvc-crash.img", "only/volumes/pvc-crash.json")
				if c := recordContent(t, e.paths["only"], "pvc-crash"); c != "filesystem" {
					t.Errorf("the record says the volume holds %q, want \"filesystem\"", c)
				}
				// The staged filesystem is whole: a pod can use it.
				node := csi.NewNodeClient(conn)
				target := filepath.Join(e.kubelet, "pods", "crash")
				if _, err := node.NodePublishVolume(e.ctx, &csi.NodePublishVolumeRequest{VolumeId: "only:pvc-crash", StagingTargetPath: crashStaging(e),
					TargetPath: target, VolumeCapability: mountCap()}); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(target, "data"), []byte("written after the crash"), 0o600); err != nil {
					t.Errorf("writing to the staged volume: %v", err)
				} else if data, err := os.ReadFile(filepath.Join(target, "data")); err != nil || string(data) != "written after the crash" {
					t.Errorf("the staged volume reads %q, %v", data, err)
				}
				if _, err := node.NodeUnpublishVolume(e.ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "only:pvc-crash", TargetPath: target}); err != nil {
					t.Fatal(err)
				}
				if _, err := node.NodeUnstageVolume(e.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "only:pvc-crash", StagingTargetPath: crashStaging(e)}); err != nil {
					t.Fatal(err)
				}
			},
			volumes: 1, bytes: 500 * mi,
		},
		"NodeExpandVolume": {
			prepare: func(t *testing.T, e *env) any {
				cap := mountCap()
				vol := volume("pvc-crash", 500*mi)(t, e)
				staging := e.stage(t, vol.VolumeId, cap)
				target, err := e.publish(t, vol.VolumeId, staging, "crash", cap, false)
				if err != nil {
					t.Fatal(err)
				}
				return &csi.NodeExpandVolumeRequest{VolumeId: vol.VolumeId, VolumePath: target, StagingTargetPath: staging,
					CapacityRange: &csi.CapacityRange{RequiredBytes: 800 * mi}, VolumeCapability: cap}
			},
			check: func(t *testing.T, e *env, conn *grpc.ClientConn) {
				wantVolumes(t, e, conn, map[string]int64{"only:pvc-crash": 800 * mi})
				wantFiles(t, e, "only/volumes/pvc-crash.img", "only/volumes/pvc-crash.json")
				img := filepath.Join(e.paths["only"], "diskfit", "volumes", "pvc-crash.img")
				if st, err := os.Stat(img); err != nil || st.Size() != 800*mi {
					t.Errorf("data file: %v, %v; want %d bytes", st.Size(), err, 800*mi)
				}
				loops := testdisk.LoopsBelow(e.paths["only"])
				if len(loops) != 1 {
					t.Fatalf("loop devices %v, want the volume's one", loops)
				}
				if size, err := blockDeviceSize(loops[0]); err != nil || size != 800*mi {
					t.Errorf("loop device has %d bytes (%v), want %d", size, err, 800*mi)
				}
				target := filepath.Join(e.kubelet, "pods", "crash")
				var st unix.Statfs_t
				if err := unix.Statfs(target, &st); err != nil {
					t.Fatal(err)
				}
				// XFS keeps its log and metadata out of f_blocks; a filesystem
				// still at 500 MiB would show less than 500 MiB.
				if fs := int64(st.Blocks) * st.Frsize; fs < 700*mi {
					t.Errorf("the filesystem has %d bytes, it was not grown to %d", fs, 800*mi)
				}
				node := csi.NewNodeClient(conn)
				if _, err := node.NodeUnpublishVolume(e.ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "only:pvc-crash", TargetPath: target}); err != nil {
					t.Fatal(err)
				}
				staging := filepath.Join(e.kubelet, "plugins", "staging", "only_pvc-crash")
				if _, err := node.NodeUnstageVolume(e.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "only:pvc-crash", StagingTargetPath: staging}); err != nil {
					t.Fatal(err)
				}
				if loops := testdisk.LoopsBelow(e.paths["only"]); len(loops) != 0 {
					t.Errorf("loop devices left after unstaging: %v", loops)
				}
			},
			volumes: 1, bytes: 800 * mi,
		},
		"CreateSnapshot": {
			prepare: func(t *testing.T, e *env) any {
				return &csi.CreateSnapshotRequest{Name: "snap-crash", SourceVolumeId: volume("pvc-crash", 500*mi)(t, e).VolumeId}
			},
			check: func(t *testing.T, e *env, conn *grpc.ClientConn) {
				wantSnapshots(t, e, conn, map[string]int64{"only:snap-crash": 500 * mi})
				wantFiles(t, e, "only/snapshots/snap-crash.img", "only/snapshots/snap-crash.json", "only/volumes/pvc-crash.img", "only/volumes/pvc-crash.json")
			},
			// A reflink copy takes no space until either side is written.
			volumes: 1, bytes: 500 * mi,
		},
		"DeleteSnapshot": {
			prepare: func(t *testing.T, e *env) any {
				vol := volume("pvc-crash", 500*mi)(t, e)
				snap, err := e.d.CreateSnapshot(e.ctx, &csi.CreateSnapshotRequest{Name: "snap-crash", SourceVolumeId: vol.VolumeId})
				if err != nil {
					t.Fatal(err)
				}
				return &csi.DeleteSnapshotRequest{SnapshotId: snap.Snapshot.SnapshotId}
			},
			check: func(t *testing.T, e *env, conn *grpc.ClientConn) {
				wantSnapshots(t, e, conn, map[string]int64{})
				wantVolumes(t, e, conn, map[string]int64{"only:pvc-crash": 500 * mi})
				wantFiles(t, e, "only/volumes/pvc-crash.img", "only/volumes/pvc-crash.json")
			},
			volumes: 1, bytes: 500 * mi,
		},
	}
}

// TestCrashAtEveryStep kills a real driver process (this test binary run
// again as the driver) with SIGKILL at every step package fault declares,
// starts a new driver on the same disk and sends the same request again,
// as the sidecar or kubelet would. Afterwards exactly the right volumes
// and snapshots exist with the right sizes, the disk holds exactly their
// files (no temporary file, no data without a record), no loop device is
// left, and the DiskNode counts the right volumes and free space.
func TestCrashAtEveryStep(t *testing.T) {
	cases := crashCases()
	for _, step := range fault.Steps() {
		t.Run(step.String(), func(t *testing.T) {
			tc, ok := cases[step.Operation()]
			if !ok {
				t.Fatalf("no crash case for operation %s: add one to crashCases", step.Operation())
			}
			e := newEnv(t, []testDisk{{name: "only", fsType: "xfs", size: 2 * gi}}, nil)
			before, err := e.d.disk("only").backend.Usage(e.ctx)
			if err != nil {
				t.Fatal(err)
			}
			req := tc.prepare(t, e)

			// The driver process takes over the disk from the one that
			// prepared it.
			stopDisks(e.d)
			sock := filepath.Join(t.TempDir(), "csi.sock")
			child := exec.Command(os.Args[0], "-test.run=^$")
			child.Env = append(os.Environ(), fault.EnvVar+"="+step.String(),
				crashEnvDisk+"="+e.paths["only"], crashEnvKubelet+"="+e.kubelet, crashEnvSocket+"="+sock)
			child.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
			if err := child.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- child.Wait() }()
			conn := dial(t, "unix://"+sock)
			if err := invoke(e.ctx, conn, req); err == nil {
				_ = child.Process.Kill()
				<-exited
				t.Fatalf("%T succeeded: step %s was never reached", req, step)
			}
			var werr *exec.ExitError
			if err := <-exited; !errors.As(err, &werr) || werr.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("driver process ended with %v, want SIGKILL", err)
			}
			if tc.afterKill != nil {
				tc.afterKill(t, e, step)
			}

			cfg := e.d.cfg
			cfg.Endpoint = "unix://" + filepath.Join(t.TempDir(), "csi.sock")
			cfg.StatusInterval = 100 * time.Millisecond
			ctx := runDriver(t, e, e.ctx, cfg)
			restarted := dial(t, cfg.Endpoint)
			// Before the retry: whatever the crash left is finished or
			// undone, and no space is held that no record accounts for.
			wantDiskNode(t, e, ctx, -1, 0, before.FreeBytes)
			if err := invoke(ctx, restarted, req); err != nil {
				t.Fatalf("retry after restart: %v", err)
			}
			tc.check(t, e, restarted)
			if loops := testdisk.LoopsBelow(e.paths["only"]); len(loops) != 0 {
				t.Errorf("loop devices left: %v", loops)
			}
			wantDiskNode(t, e, ctx, tc.volumes, tc.bytes, before.FreeBytes)
		})
	}
}

// dial connects to a driver socket and waits until the driver is ready.
func dial(t *testing.T, endpoint string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx := context.Background()
	if err := waitFor(ctx, func() (bool, error) {
		resp, err := csi.NewIdentityClient(conn).Probe(ctx, &csi.ProbeRequest{}, grpc.WaitForReady(true))
		return err == nil && resp.GetReady().GetValue(), nil
	}); err != nil {
		t.Fatalf("waiting for the driver at %s: %v", endpoint, err)
	}
	return conn
}

// invoke sends a CSI request over conn.
func invoke(ctx context.Context, conn *grpc.ClientConn, req any) error {
	ctrl, node := csi.NewControllerClient(conn), csi.NewNodeClient(conn)
	var err error
	switch r := req.(type) {
	case *csi.CreateVolumeRequest:
		_, err = ctrl.CreateVolume(ctx, r)
	case *csi.DeleteVolumeRequest:
		_, err = ctrl.DeleteVolume(ctx, r)
	case *csi.CreateSnapshotRequest:
		_, err = ctrl.CreateSnapshot(ctx, r)
	case *csi.DeleteSnapshotRequest:
		_, err = ctrl.DeleteSnapshot(ctx, r)
	case *csi.NodeStageVolumeRequest:
		_, err = node.NodeStageVolume(ctx, r)
	case *csi.NodeExpandVolumeRequest:
		_, err = node.NodeExpandVolume(ctx, r)
	default:
		return fmt.Errorf("no way to send %T", req)
	}
	return err
}

func wantVolumes(t *testing.T, e *env, conn *grpc.ClientConn, want map[string]int64) {
	t.Helper()
	list, err := csi.NewControllerClient(conn).ListVolumes(e.ctx, &csi.ListVolumesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, en := range list.Entries {
		got[en.Volume.VolumeId] = en.Volume.CapacityBytes
	}
	wantSizes(t, "volumes", got, want)
}

func wantSnapshots(t *testing.T, e *env, conn *grpc.ClientConn, want map[string]int64) {
	t.Helper()
	list, err := csi.NewControllerClient(conn).ListSnapshots(e.ctx, &csi.ListSnapshotsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, en := range list.Entries {
		got[en.Snapshot.SnapshotId] = en.Snapshot.SizeBytes
	}
	wantSizes(t, "snapshots", got, want)
}

func wantSizes(t *testing.T, kind string, got, want map[string]int64) {
	t.Helper()
	if !maps.Equal(got, want) {
		t.Errorf("%s %v, want %v", kind, got, want)
	}
}

// wantFiles checks the exact set of files in the disks' state directories.
func wantFiles(t *testing.T, e *env, want ...string) {
	t.Helper()
	got := e.volumeFiles(t)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("files %v, want %v", got, want)
	}
}

// wantDiskNode waits for the published DiskNode to count volumes on disk
// "only", free space of freeBefore less bytes and capacity freeBefore
// (what the disk offers volumes: free space plus what the volumes' records
// say they hold, so any space held without a record shrinks it). With
// volumes < 0 only the capacity is checked. XFS keeps a little metadata per file,
// hence the 2 MiB slack, and frees the blocks of removed files in the
// background, hence the wait for a later refresh.
func wantDiskNode(t *testing.T, e *env, ctx context.Context, volumes int32, bytes, freeBefore int64) {
	t.Helper()
	var last *v1alpha1.DiskStatus
	if err := waitFor(ctx, func() (bool, error) {
		dn, err := e.diskfit.DiskfitV1alpha1().DiskNodes().Get(ctx, testNode, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		last = dn.Status.Disk("only")
		if last == nil {
			return false, nil
		}
		near := func(a, b int64) bool { return a-b <= 2*mi && b-a <= 2*mi }
		return last.Healthy && near(last.CapacityBytes, freeBefore) &&
			(volumes < 0 || last.VolumeCount == volumes && near(freeBefore-last.FreeBytes, bytes)), nil
	}); err != nil {
		t.Errorf("DiskNode disk status %+v, want %d volumes, %d bytes free of about %d", last, volumes, freeBefore-bytes, freeBefore)
	}
}

// crashStaging is the staging path of the crash cases' volume.
func crashStaging(e *env) string {
	return filepath.Join(e.kubelet, "plugins", "staging", "only_pvc-crash")
}

// blockDeviceSize reads a block device's size from sysfs.
func blockDeviceSize(dev string) (int64, error) {
	data, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "size"))
	if err != nil {
		return 0, err
	}
	var sectors int64
	_, err = fmt.Sscan(strings.TrimSpace(string(data)), &sectors)
	return sectors * 512, err
}
