package cluster

import (
	"net"
	"os"
	"path/filepath"
	"strconv"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/test/cluster/controlplane"
)

// startScheduler runs diskfit-scheduler with the shipped configuration
// (manifests/scheduler), changed only in where it finds the API server, plus
// the default profile beside it so tests can compare the two.
func (c *Cluster) startScheduler() error {
	bin, err := c.binary("diskfit-scheduler")
	if err != nil {
		return err
	}
	path := filepath.Join(c.Dir, "scheduler-config.yaml")
	if err := controlplane.WriteSchedulerConfig(path, c.opts.RepoRoot, c.schedulerKubeconfig,
		map[string]any{"schedulerName": "default-scheduler"}); err != nil {
		return err
	}
	port, err := FreePort()
	if err != nil {
		return err
	}
	// Tests read the scheduler's /metrics on this port.
	if err := os.WriteFile(filepath.Join(c.Dir, SchedulerPortFile), []byte(strconv.Itoa(port)), 0o644); err != nil {
		return err
	}
	// Supervised: tests kill the scheduler to prove that its ledger is
	// rebuilt from API objects, and it comes back as a Deployment's would.
	c.scheduler, err = startSupervised(diskfit.SchedulerName, c.LogDir, bin, []string{
		"--config=" + path,
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--authentication-kubeconfig=" + c.schedulerKubeconfig,
		"--authorization-kubeconfig=" + c.schedulerKubeconfig,
		"-v=4",
	}, nil)
	return err
}

// SchedulerPortFile, in the run directory, holds the secure port of
// diskfit-scheduler (/metrics, for a client allowed to get it).
const SchedulerPortFile = "scheduler-port"

// FreePort returns a TCP port on 127.0.0.1 that is free right now.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
