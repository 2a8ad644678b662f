package e2e

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/diskfit/diskfit/apis/client/clientset/versioned"
	"github.com/diskfit/diskfit/apis/diskfit"
)

// The local cluster leaves nothing behind: stopped with SIGTERM it removes
// every mount (the kubelets bind-mount their roots onto themselves), loop
// device, process and file it made; killed with SIGKILL, its children die
// with it and the next run (here `localcluster sweep`) removes the rest.
// Each run has a pod with a volume, so teardown meets a staged and
// published volume: its own loop device over a file on a disk, and its
// mounts under the kubelet's directory.
func TestLocalClusterLeavesNothingBehind(t *testing.T) {
	needLocal(t)
	for _, signal := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		t.Run(signal.String(), func(t *testing.T) {
			second := startSecondCluster(t)
			cmd, exited, dir := second.cmd, second.exited, second.dir
			if len(mountsUnder(t, dir)) == 0 || len(loopsUnder(t, dir)) == 0 || len(processesUsing(t, dir)) == 0 {
				t.Fatalf("a running cluster shows no mounts, loop devices or processes under %s", dir)
			}
			runPodWithVolume(t, second.client(t), dir)

			_ = cmd.Process.Signal(signal)
			select {
			case <-exited:
			case <-time.After(2 * time.Minute):
				_ = cmd.Process.Kill()
				t.Fatal("localcluster did not stop")
			}
			if signal == syscall.SIGKILL {
				// Its children die with it; what they made stays until the
				// next run sweeps it.
				waitGone(t, func() []string { return processesUsing(t, dir) }, "processes")
				if len(mountsUnder(t, dir)) == 0 && len(loopsUnder(t, dir)) == 0 {
					t.Fatalf("a killed cluster left no mounts or loop devices: nothing for the sweep to do")
				}
				sweep := exec.Command(filepath.Join(localBin, "localcluster"), "sweep")
				if out, err := sweep.CombinedOutput(); err != nil {
					t.Fatalf("sweep: %v: %s", err, out)
				}
			}
			waitGone(t, func() []string { return processesUsing(t, dir) }, "processes")
			if m := mountsUnder(t, dir); len(m) > 0 {
				t.Errorf("mounts left: %v", m)
			}
			if l := loopsUnder(t, dir); len(l) > 0 {
				t.Errorf("loop devices left: %v", l)
			}

			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				t.Errorf("run directory %s left: %v", dir, err)
			}
		})
	}
}

// secondCluster is a local cluster of a test's own, for tests that stop,
// kill or break it.
type secondCluster struct {
	cmd        *exec.Cmd
	exited     chan error
	dir        string
	kubeconfig string
}

// startSecondCluster starts `localcluster up` and waits until it is ready.
// Cleanup stops it (SIGTERM) unless the test already did.
func startSecondCluster(t *testing.T) *secondCluster {
	t.Helper()
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	c := &secondCluster{kubeconfig: filepath.Join(t.TempDir(), "kubeconfig"), exited: make(chan error, 1)}
	c.cmd = exec.Command(filepath.Join(localBin, "localcluster"), "up", "--repo", repo, "--bin-dir", localBin, "--kubeconfig-out", c.kubeconfig)
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { c.exited <- c.cmd.Wait(); close(c.exited) }()
	t.Cleanup(func() {
		select {
		case <-c.exited:
			// Stopped by the test.
		default:
			_ = c.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-c.exited:
			case <-time.After(2 * time.Minute):
				_ = c.cmd.Process.Kill()
			}
		}
	})
	c.dir = filepath.Join("/tmp/dfl", strconv.Itoa(c.cmd.Process.Pid))
	deadline := time.Now().Add(3 * time.Minute)
	for {
		if _, err := os.Stat(c.kubeconfig); err == nil {
			return c
		}
		select {
		case err := <-c.exited:
			t.Fatalf("localcluster exited before it was ready: %v", err)
		case <-time.After(500 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = c.cmd.Process.Kill()
			t.Fatal("second local cluster not ready after 3 minutes")
		}
	}
}

// client returns an admin clientset of the second cluster.
func (c *secondCluster) client(t *testing.T) kubernetes.Interface {
	t.Helper()
	client, err := kubernetes.NewForConfig(c.config(t))
	if err != nil {
		t.Fatal(err)
	}
	return client
}

// diskfit returns a client of the cluster's diskfit API.
func (c *secondCluster) diskfit(t *testing.T) versioned.Interface {
	t.Helper()
	client, err := versioned.NewForConfig(c.config(t))
	if err != nil {
		t.Fatal(err)
	}
	return client
}

func (c *secondCluster) config(t *testing.T) *rest.Config {
	t.Helper()
	config, err := clientcmd.BuildConfigFromFlags("", c.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	return config
}

// runPodWithVolume runs a pod with a diskfit volume in the cluster of
// kubeconfig and checks that its staged volume has a loop device under dir
// (over a file on a disk, not a disk image), which teardown must detach.
func runPodWithVolume(t *testing.T, client kubernetes.Interface, dir string) {
	t.Helper()
	ctx := ctxFor(t, 3*time.Minute)
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "teardown"}, Provisioner: diskfit.DriverName,
		VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer)}
	if _, err := client.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().PersistentVolumeClaims("default").Create(ctx, claim("staged", "teardown", 64*mi), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Pods("default").Create(ctx, podSpec("staged", diskfit.SchedulerName, "staged"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	err := wait.PollUntilContextCancel(ctx, 500*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		pod, err := client.CoreV1().Pods("default").Get(ctx, "staged", metav1.GetOptions{})
		return err == nil && pod.Status.Phase == v1.PodRunning, nil
	})
	if err != nil {
		t.Fatalf("pod with a volume not running in the second cluster: %v", err)
	}
	if !slices.ContainsFunc(loopsUnder(t, dir), func(l string) bool { return strings.Contains(l, "/diskfit/") }) {
		t.Fatalf("no volume loop device under %s: %v", dir, loopsUnder(t, dir))
	}
}

func waitGone(t *testing.T, list func() []string, what string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for len(list()) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%s left: %v", what, list())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func mountsUnder(t *testing.T, dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var found []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		if fields := strings.Fields(s.Text()); len(fields) > 4 && strings.HasPrefix(fields[4], dir+"/") {
			found = append(found, fields[4])
		}
	}
	return found
}

func loopsUnder(t *testing.T, dir string) []string {
	out, err := exec.Command("losetup", "--list", "--noheadings", "--output", "NAME,BACK-FILE").Output()
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, dir+"/") {
			found = append(found, line)
		}
	}
	return found
}

// processesUsing lists processes whose command line names dir.
func processesUsing(t *testing.T, dir string) []string {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(cmdline), dir+"/") {
			found = append(found, e.Name()+": "+strings.ReplaceAll(string(cmdline), "\x00", " ")[:min(len(cmdline), 80)])
		}
	}
	return found
}
