package v1

import (
	"k8s.io/apimachinery/pkg/runtime"
	schedv1 "k8s.io/kube-scheduler/config/v1"
)

// SchemeGroupVersion is kubescheduler.config.k8s.io/v1, in which
// KubeSchedulerConfiguration files carry plugin arguments.
var SchemeGroupVersion = schedv1.SchemeGroupVersion

var (
	// localSchemeBuilder collects this package's registrations: the
	// hand-written ones in init below and, from zz_generated.conversion.go,
	// RegisterConversions.
	localSchemeBuilder = &runtime.SchemeBuilder{}
	// AddToScheme registers the versioned DiskFitArgs, their defaults and
	// conversions with a scheme.
	AddToScheme = localSchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(SchemeGroupVersion, &DiskFitArgs{})
	return nil
}

// addDefaultingFuncs registers the generated defaulters (RegisterDefaults,
// zz_generated.defaults.go), which call SetDefaults_DiskFitArgs.
func addDefaultingFuncs(s *runtime.Scheme) error {
	return RegisterDefaults(s)
}

func init() {
	localSchemeBuilder.Register(addKnownTypes, addDefaultingFuncs)
	// kube-scheduler builds its plugin-argument defaulting and conversion
	// scheme lazily from this builder; registering here lets it default
	// and convert DiskFitArgs like in-tree arguments.
	schedv1.SchemeBuilder.Register(AddToScheme)
}
