package controlplane

import (
	"fmt"
	"os"
	"path/filepath"

	"sigs.k8s.io/yaml"
)

// WriteSchedulerConfig writes diskfit-scheduler's shipped configuration
// (manifests/scheduler under repoRoot) to path, changed only in where it
// finds the API server (kubeconfig) and in electing no leader, with the
// given profiles before the shipped one (for example the default profile,
// so tests can compare the two).
func WriteSchedulerConfig(path, repoRoot, kubeconfig string, profiles ...map[string]any) error {
	raw, err := os.ReadFile(filepath.Join(repoRoot, "manifests", "scheduler", "diskfit-scheduler-config.yaml"))
	if err != nil {
		return err
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(raw, &cfg); err != nil {
		return fmt.Errorf("parsing scheduler config: %w", err)
	}
	cfg["clientConnection"] = map[string]any{"kubeconfig": kubeconfig, "qps": 200, "burst": 400}
	cfg["leaderElection"] = map[string]any{"leaderElect": false}
	shipped, _ := cfg["profiles"].([]any)
	all := make([]any, 0, len(profiles)+len(shipped))
	for _, p := range profiles {
		all = append(all, p)
	}
	cfg["profiles"] = append(all, shipped...)
	out, err := yaml.Marshal(cfg)
	if err != nil {
		return err
	}
	return os.WriteFile(path, out, 0o644)
}
