package cluster

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"

	"sigs.k8s.io/yaml"

	"github.com/diskfit/diskfit/apis/diskfit"
)

// startScheduler runs diskfit-scheduler with the shipped configuration
// (manifests/scheduler), changed only in where it finds the API server, plus
// the default profile beside it so tests can compare the two.
func (c *Cluster) startScheduler() error {
	bin, err := c.binary("diskfit-scheduler")
	if err != nil {
		return err
	}
	raw, err := os.ReadFile(filepath.Join(c.opts.RepoRoot, "manifests", "scheduler", "diskfit-scheduler-config.yaml"))
	if err != nil {
		return err
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(raw, &cfg); err != nil {
		return fmt.Errorf("parsing scheduler config: %w", err)
	}
	cfg["clientConnection"] = map[string]any{"kubeconfig": c.schedulerKubeconfig, "qps": 200, "burst": 400}
	cfg["leaderElection"] = map[string]any{"leaderElect": false}
	profiles, _ := cfg["profiles"].([]any)
	cfg["profiles"] = append([]any{map[string]any{"schedulerName": "default-scheduler"}}, profiles...)
	out, err := yaml.Marshal(cfg)
	if err != nil {
		return err
	}
	path := filepath.Join(c.Dir, "scheduler-config.yaml")
	if err := os.WriteFile(path, out, 0o644); err != nil {
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
