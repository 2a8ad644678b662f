// Package e2e is diskfit's end-to-end suite. It takes a kubeconfig, so the
// same tests run against the local cluster (test/cluster, started here when
// no kubeconfig is given) and against a kind cluster (hack/kind-e2e.sh).
package e2e

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/diskfit/diskfit/apis/client/clientset/versioned"
)

var (
	kubeconfig = flag.String("kubeconfig", os.Getenv("DISKFIT_E2E_KUBECONFIG"),
		"cluster to test; empty starts the local cluster (needs root)")
	localDirFlag = flag.String("local-dir", "",
		"with -kubeconfig of a running localcluster: its run directory (/tmp/dfl/<pid>), for the tests that reach its disks")
	podImage = flag.String("pod-image", "registry.k8s.io/pause:3.10",
		"image of the test pods that only hold volumes; on a real cluster the nodes must have it or pull it")
	shellImage = flag.String("shell-image", "debian:bookworm-slim",
		"image with sh, head, dd and sha256sum, for the tests that write and read data in real containers")
)

// The clients every test uses, set up by TestMain.
var (
	restConfig *rest.Config
	kube       kubernetes.Interface
	diskfitAPI versioned.Interface
	// kubeconfigFile is the kubeconfig the suite's clients use.
	kubeconfigFile string
	// localBin holds the binaries TestMain built for the local cluster.
	localBin string
	// localDir is the local cluster's run directory when TestMain started
	// it: tests may then reach the nodes' disks and kubelet directories on
	// this host. Empty against any other cluster.
	localDir string
)

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if *kubeconfig != "" {
		localDir = *localDirFlag
		if err := setupClients(*kubeconfig); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return m.Run()
	}
	lc, err := startLocalCluster()
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting local cluster:", err)
		return 1
	}
	// test/cluster keeps each run under /tmp/dfl/<pid of localcluster>.
	localDir = filepath.Join("/tmp/dfl", strconv.Itoa(lc.cmd.Process.Pid))
	code := 1
	if err := setupClients(lc.kubeconfig); err != nil {
		fmt.Fprintln(os.Stderr, err)
	} else {
		code = m.Run()
	}
	lc.stop()
	if forbidden := forbiddenRequests(lc.logDir); len(forbidden) > 0 {
		// The components run with exactly their manifests' RBAC: a refused
		// request means a role lacks a verb, even if every test passed.
		fmt.Fprintf(os.Stderr, "FAIL: components were refused by RBAC:\n%s\n", strings.Join(forbidden, "\n"))
		code = 1
	}
	if code == 0 {
		_ = os.RemoveAll(lc.logDir)
	} else {
		fmt.Fprintf(os.Stderr, "component logs kept in %s\n", lc.logDir)
	}
	return code
}

// forbiddenRequests returns the log lines, one per component and message,
// in which a diskfit component or sidecar was refused by the API server's
// authorizer. The kubelets run as admin and are not checked.
func forbiddenRequests(logDir string) []string {
	logs, _ := filepath.Glob(filepath.Join(logDir, "*.log"))
	seen := map[string]bool{}
	var found []string
	for _, log := range logs {
		name := filepath.Base(log)
		if strings.HasPrefix(name, "kubelet-") || name == "localcluster.log" {
			continue
		}
		raw, err := os.ReadFile(log)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(raw), "\n") {
			if !strings.Contains(line, "is forbidden: User ") {
				continue
			}
			// The message after the klog header identifies the refusal.
			msg := line[strings.Index(line, "is forbidden"):]
			if key := name + msg; !seen[key] {
				seen[key] = true
				found = append(found, name+": "+msg)
			}
		}
	}
	return found
}

func setupClients(path string) error {
	var err error
	kubeconfigFile = path
	if restConfig, err = clientcmd.BuildConfigFromFlags("", path); err != nil {
		return err
	}
	restConfig.QPS, restConfig.Burst = 100, 200
	if kube, err = kubernetes.NewForConfig(restConfig); err != nil {
		return err
	}
	diskfitAPI, err = versioned.NewForConfig(restConfig)
	return err
}

// localCluster is a `localcluster up` child process.
type localCluster struct {
	cmd        *exec.Cmd
	exited     chan error
	kubeconfig string
	dir        string
	// logDir keeps the components' logs; removed when every test passed.
	logDir string
}

// startLocalCluster builds diskfit's binaries from this tree and starts the
// local cluster with them. The sidecars come from `make tools`.
func startLocalCluster() (*localCluster, error) {
	repo, err := filepath.Abs("../..")
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "diskfit-e2e-")
	if err != nil {
		return nil, err
	}
	logDir, err := os.MkdirTemp("", "diskfit-e2e-logs-")
	if err != nil {
		return nil, err
	}
	lc := &localCluster{dir: dir, kubeconfig: filepath.Join(dir, "kubeconfig"), logDir: logDir}
	bin := filepath.Join(dir, "bin")
	localBin = bin
	build := exec.Command("go", "build", "-o", bin+"/", "./cmd/diskfit-csi", "./cmd/diskfit-scheduler", "./cmd/diskfit-controller", "./cmd/diskfit", "./test/cmd/localcluster")
	build.Dir, build.Stdout, build.Stderr = repo, os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return nil, fmt.Errorf("building binaries: %w", err)
	}
	// test/cluster's Sidecars; not imported, so that this test binary does
	// not link the API server that the localcluster binary runs.
	for _, sidecar := range []string{"csi-provisioner", "csi-resizer", "csi-snapshotter", "snapshot-controller"} {
		if err := os.Symlink(filepath.Join(repo, "bin", sidecar), filepath.Join(bin, sidecar)); err != nil {
			return nil, err
		}
		if _, err := os.Stat(filepath.Join(bin, sidecar)); err != nil {
			return nil, fmt.Errorf("%s missing: run 'make tools': %w", sidecar, err)
		}
	}
	logPath := filepath.Join(logDir, "localcluster.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	lc.cmd = exec.Command(filepath.Join(bin, "localcluster"), "up", "--repo", repo, "--bin-dir", bin, "--kubeconfig-out", lc.kubeconfig, "--log-dir", logDir)
	lc.cmd.Stdout, lc.cmd.Stderr = logFile, logFile
	// The cluster must not outlive this test process, even when it is killed.
	lc.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := lc.cmd.Start(); err != nil {
		return nil, err
	}
	lc.exited = make(chan error, 1)
	go func() { lc.exited <- lc.cmd.Wait(); close(lc.exited) }()
	deadline := time.After(3 * time.Minute)
	for {
		if _, err := os.Stat(lc.kubeconfig); err == nil {
			return lc, nil
		}
		select {
		case err := <-lc.exited:
			return nil, fmt.Errorf("localcluster exited: %v; log %s:\n%s", err, logPath, tail(logPath, 30))
		case <-deadline:
			lc.stop()
			return nil, fmt.Errorf("local cluster not ready after 3 minutes; log %s:\n%s", logPath, tail(logPath, 30))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (lc *localCluster) stop() {
	if lc.exited != nil {
		// SIGTERM lets it unmount and detach everything it made.
		_ = lc.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-lc.exited:
		case <-time.After(time.Minute):
			_ = lc.cmd.Process.Kill()
			<-lc.exited
		}
	}
	_ = os.RemoveAll(lc.dir)
}

func tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var lines []string
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 1<<20), 1<<20)
	for s.Scan() {
		lines = append(lines, s.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}
