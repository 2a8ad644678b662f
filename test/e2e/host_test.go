package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// needLocal skips a test that must reach the nodes' disks or kubelet
// directories on this host, which only the local cluster allows.
func needLocal(t *testing.T) {
	t.Helper()
	if localDir == "" {
		t.Skip("needs the local cluster: it reaches the nodes' disks and kubelet directories on this host")
	}
}

// hostDiskPath is where a local node's disk is mounted on this host.
func hostDiskPath(node, disk string) string {
	return filepath.Join(localDir, "nodes", node, "disks", disk, "mnt")
}

// hostVolumePath is where the kubelet published a pod's filesystem volume.
func hostVolumePath(pod *v1.Pod, pvName string) string {
	return filepath.Join(localDir, "nodes", pod.Spec.NodeName, "kubelet", "pods", string(pod.UID),
		"volumes", "kubernetes.io~csi", pvName, "mount")
}

// takeSpace allocates bytes on a local node's disk behind diskfit's back,
// as another program on the node would, and removes it at the end of the test.
func takeSpace(t *testing.T, node, disk string, bytes int64) {
	t.Helper()
	name := strings.ReplaceAll(t.Name(), "/", "_")
	path := filepath.Join(hostDiskPath(node, disk), "e2e-junk-"+strconv.Itoa(os.Getpid())+"-"+name)
	if out, err := exec.Command("fallocate", "-l", strconv.FormatInt(bytes, 10), path).CombinedOutput(); err != nil {
		t.Fatalf("fallocate %s: %v: %s", path, err, out)
	}
	t.Cleanup(func() { _ = os.Remove(path) })
}

// hostFree is what statfs says is free on a local node's disk.
func hostFree(t *testing.T, node, disk string) int64 {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(hostDiskPath(node, disk), &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * st.Frsize
}

// pauseProvisioner stops a local node's external-provisioner (SIGSTOP) so
// that claims get a node and a disk from the scheduler but no volume yet,
// and returns the function that lets it go on (SIGCONT), also run at cleanup.
func pauseProvisioner(t *testing.T, node string) (resume func()) {
	t.Helper()
	pid := findProcess(t, "csi-provisioner", "--csi-address="+filepath.Join(localDir, "nodes", node, "csi.sock"))
	if pid == 0 {
		t.Fatalf("no external-provisioner process for %s", node)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	resume = func() { once.Do(func() { _ = syscall.Kill(pid, syscall.SIGCONT) }) }
	t.Cleanup(resume)
	return resume
}

// findProcess returns the pid of the local cluster's process whose binary
// name ends in binary and whose arguments include arg, or 0.
func findProcess(t *testing.T, binary, arg string) int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		if strings.HasSuffix(args[0], binary) && slices.Contains(args, arg) {
			return pid
		}
	}
	return 0
}

// killScheduler kills diskfit-scheduler as a crash would (SIGKILL) and
// waits until the local cluster has started it again, as a Deployment
// would.
func killScheduler(t *testing.T) {
	t.Helper()
	arg := "--config=" + filepath.Join(localDir, "scheduler-config.yaml")
	pid := findProcess(t, "diskfit-scheduler", arg)
	if pid == 0 {
		t.Fatal("no diskfit-scheduler process")
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(ctxFor(t, time.Minute), 200*time.Millisecond, 30*time.Second, false, func(context.Context) (bool, error) {
		next := findProcess(t, "diskfit-scheduler", arg)
		return next != 0 && next != pid, nil
	})
	if err != nil {
		t.Fatalf("diskfit-scheduler was not restarted: %v", err)
	}
}
