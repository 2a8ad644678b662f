// Package command holds what diskfit's long-running node and cluster
// commands (diskfit-csi, diskfit-webhook) share: component-base logging flags
// (text or JSON), and a context that ends on SIGTERM or SIGINT.
package command

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"
	"k8s.io/component-base/featuregate"
	"k8s.io/component-base/logs"
	logsapi "k8s.io/component-base/logs/api/v1"
	_ "k8s.io/component-base/logs/json/register" // --logging-format=json
	"k8s.io/klog/v2"
)

// Run adds the logging flags to fs, parses the process's arguments, applies
// the logging configuration and runs run with a context that ends on
// SIGTERM or SIGINT. It exits 2 on bad flags and 1 when run fails.
func Run(name string, fs *pflag.FlagSet, run func(context.Context) error) {
	logging := logsapi.NewLoggingConfiguration()
	logsapi.AddFlags(logging, fs)
	logs.InitLogs()
	defer logs.FlushLogs()
	if err := fs.Parse(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	gates := featuregate.NewFeatureGate()
	if err := logsapi.AddFeatureGates(gates); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if err := logsapi.ValidateAndApply(logging, gates); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx); err != nil {
		klog.FromContext(ctx).Error(err, name+" failed")
		logs.FlushLogs()
		os.Exit(1)
	}
}
