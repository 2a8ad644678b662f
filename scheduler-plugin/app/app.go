// Package app assembles the diskfit-scheduler: kube-scheduler with the
// DiskFit plugin registered and its arguments known to the configuration
// scheme. The binary's main and test harnesses both build on it.
package app

import (
	"github.com/spf13/cobra"
	schedapp "k8s.io/kubernetes/cmd/kube-scheduler/app"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"

	// Registers DiskFitArgs so configuration files can set them.
	_ "github.com/diskfit/diskfit/scheduler-plugin/apis/config/scheme"
	"github.com/diskfit/diskfit/scheduler-plugin/diskfit"
)

// ConfigFile is the repository path of the KubeSchedulerConfiguration with
// the diskfit-scheduler profile.
const ConfigFile = "manifests/scheduler/diskfit-scheduler-config.yaml"

// Options returns the kube-scheduler options that register DiskFit, for
// schedapp.NewSchedulerCommand or schedapp.Setup.
func Options() []schedapp.Option {
	return []schedapp.Option{schedapp.WithPlugin(diskfit.Name, diskfit.New)}
}

// Registry returns the out-of-tree plugin registry holding DiskFit, for
// scheduler.New(..., scheduler.WithFrameworkOutOfTreeRegistry(Registry())).
func Registry() frameworkruntime.Registry {
	return frameworkruntime.Registry{diskfit.Name: diskfit.New}
}

// NewCommand returns the diskfit-scheduler command: kube-scheduler's
// command, flags and all, with DiskFit registered.
func NewCommand() *cobra.Command {
	cmd := schedapp.NewSchedulerCommand(Options()...)
	cmd.Use = "diskfit-scheduler"
	return cmd
}
