package v1

import (
	"k8s.io/apimachinery/pkg/runtime"
	schedv1 "k8s.io/kube-scheduler/config/v1"
)

// SchemeGroupVersion is kubescheduler.config.k8s.io/v1, in which
// KubeSchedulerConfiguration files carry plugin arguments.
var SchemeGroupVersion = schedv1.SchemeGroupVersion

// AddToScheme registers the versioned DiskFitArgs, their defaults and
// conversions with a scheme.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(SchemeGroupVersion, &DiskFitArgs{})
	if err := RegisterDefaults(s); err != nil {
		return err
	}
	return RegisterConversions(s)
}

func init() {
	// kube-scheduler builds its plugin-argument defaulting and conversion
	// scheme lazily from this builder; registering here lets it default
	// and convert DiskFitArgs like in-tree arguments.
	schedv1.SchemeBuilder.Register(AddToScheme)
}
