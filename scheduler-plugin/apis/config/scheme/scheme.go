// Package scheme adds the DiskFit plugin arguments to kube-scheduler's
// configuration scheme, so KubeSchedulerConfiguration files that set
// pluginConfig for DiskFit decode, default and validate. Import it for its
// side effect in any binary or test that loads such a file.
package scheme

import (
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	schedscheme "k8s.io/kubernetes/pkg/scheduler/apis/config/scheme"

	"github.com/diskfit/diskfit/scheduler-plugin/apis/config"
	configv1 "github.com/diskfit/diskfit/scheduler-plugin/apis/config/v1"
)

func init() {
	// kube-scheduler's Scheme is built in its package's init, which may
	// run before the SchemeBuilder registrations in config and configv1;
	// adding the types again is harmless.
	utilruntime.Must(config.AddToScheme(schedscheme.Scheme))
	utilruntime.Must(configv1.AddToScheme(schedscheme.Scheme))
}
