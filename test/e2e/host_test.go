package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	v1 "k8s.io/api/core/v1"
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
	socket := "--csi-address=" + filepath.Join(localDir, "nodes", node, "csi.sock")
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	pid := 0
	for _, e := range entries {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		if strings.HasSuffix(args[0], "csi-provisioner") && slices.Contains(args, socket) {
			pid = n
			break
		}
	}
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
