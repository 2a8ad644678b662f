// Command diskfit-scheduler is kube-scheduler with the DiskFit plugin. Run it
// with --config pointing at a KubeSchedulerConfiguration that has a
// diskfit-scheduler profile (manifests/scheduler/).
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register" // JSON log format
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version" // version metric

	"github.com/diskfit/diskfit/scheduler-plugin/app"
)

func main() {
	os.Exit(cli.Run(app.NewCommand()))
}
