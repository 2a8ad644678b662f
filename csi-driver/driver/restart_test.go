package driver

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2"

	"github.com/diskfit/diskfit/csi-driver/apis/diskfit/v1alpha1"
	"github.com/diskfit/diskfit/csi-driver/backend"
	"github.com/diskfit/diskfit/csi-driver/config"
)

// The crash child is this test binary run again with these variables: it
// serves the driver and SIGKILLs itself at the named point of CreateVolume.
const (
	crashEnvPoint   = "DISKFIT_TEST_CRASH_AT"
	crashEnvDisk    = "DISKFIT_TEST_CRASH_DISK"
	crashEnvKubelet = "DISKFIT_TEST_CRASH_KUBELET"
	crashEnvSocket  = "DISKFIT_TEST_CRASH_SOCKET"
)

func TestMain(m *testing.M) {
	if point := os.Getenv(crashEnvPoint); point != "" {
		runCrashChild(point)
		return
	}
	os.Exit(m.Run())
}

func runCrashChild(point string) {
	kill := func(string) { _ = syscall.Kill(os.Getpid(), syscall.SIGKILL) }
	var hooks backend.Hooks
	switch point {
	case "after-intent":
		hooks.AfterIntent = kill
	case "after-allocate":
		hooks.AfterAllocate = kill
	default:
		klog.Fatalf("unknown crash point %q", point)
	}
	d, err := New(Config{
		Endpoint: "unix://" + os.Getenv(crashEnvSocket), NodeID: testNode, KubeletDir: os.Getenv(crashEnvKubelet), StatusInterval: time.Hour,
		Node:  &config.NodeConfig{Disks: []config.Disk{{Name: "only", Backend: v1alpha1.BackendFile, Path: os.Getenv(crashEnvDisk)}}},
		Hooks: hooks,
	})
	if err != nil {
		klog.Fatal(err)
	}
	if err := d.Run(context.Background()); err != nil {
		klog.Fatal(err)
	}
}

// TestRestartAfterCrashInCreateVolume kills a driver process in the middle
// of CreateVolume, starts a new driver on the same disk and retries: there
// must be exactly one volume, no orphaned file, and the disk's free space
// must have shrunk by the volume's size only.
func TestRestartAfterCrashInCreateVolume(t *testing.T) {
	for _, point := range []string{"after-intent", "after-allocate"} {
		t.Run(point, func(t *testing.T) {
			e := newEnv(t, []testDisk{{name: "only", fsType: "xfs", size: 2 * gi}}, nil)
			before, err := e.d.disk("only").backend.Usage(e.ctx)
			if err != nil {
				t.Fatal(err)
			}
			sock := filepath.Join(t.TempDir(), "csi.sock")
			child := exec.Command(os.Args[0], "-test.run=^$")
			child.Env = append(os.Environ(), crashEnvPoint+"="+point, crashEnvDisk+"="+e.paths["only"], crashEnvKubelet+"="+e.kubelet, crashEnvSocket+"="+sock)
			child.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
			if err := child.Start(); err != nil {
				t.Fatal(err)
			}
			conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
			defer cancel()
			// WaitForReady rides out the child's start-up.
			_, err = csi.NewControllerClient(conn).CreateVolume(ctx, createReq("pvc-crash", 500*mi), grpc.WaitForReady(true))
			if err == nil {
				t.Fatal("CreateVolume succeeded although the driver was killed during it")
			}
			if werr := child.Wait(); werr == nil || !strings.Contains(werr.Error(), "killed") {
				t.Fatalf("driver process ended with %v, want killed", werr)
			}
			state := readState(t, filepath.Join(e.paths["only"], "diskfit", "volumes", "pvc-crash.json"))
			if state != string(backend.StateCreating) {
				t.Fatalf("after the crash the record says %q, want %q", state, backend.StateCreating)
			}

			// A new driver on the same disk, as after a restart.
			restarted := newDriverOn(t, e)
			vol, err := restarted.CreateVolume(e.ctx, createReq("pvc-crash", 500*mi))
			if err != nil {
				t.Fatalf("retry after restart: %v", err)
			}
			list, err := restarted.ListVolumes(e.ctx, &csi.ListVolumesRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if len(list.Entries) != 1 || list.Entries[0].Volume.VolumeId != vol.Volume.VolumeId {
				t.Errorf("volumes after retry: %v", list.Entries)
			}
			if files := e.volumeFiles(t); strings.Join(files, ",") != "only/volumes/pvc-crash.img,only/volumes/pvc-crash.json" {
				t.Errorf("files after retry: %v", files)
			}
			// XFS keeps a little metadata per file, hence the 1 MiB slack.
			// It frees the blocks of the file the restart removed in the
			// background, so a loaded machine may report them late.
			var used int64
			if err := waitFor(e.ctx, func() (bool, error) {
				after, err := restarted.disk("only").backend.Usage(e.ctx)
				used = before.FreeBytes - after.FreeBytes
				return err == nil && used >= 500*mi && used <= 501*mi, err
			}); err != nil {
				t.Errorf("the disk lost %d bytes for a %d-byte volume", used, 500*mi)
			}
		})
	}
}

// newDriverOn starts another driver on e's disks.
func newDriverOn(t *testing.T, e *env) *Driver {
	t.Helper()
	d, err := New(e.d.cfg)
	if err != nil {
		t.Fatal(err)
	}
	d.Start(e.ctx)
	return d
}

func readState(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		State string `json:"state"`
	}
	if err := json.Unmarshal(data, &rec); err != nil {
		t.Fatal(err)
	}
	return rec.State
}
