package config

import (
	"k8s.io/apimachinery/pkg/runtime"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
)

// SchemeGroupVersion is kube-scheduler's internal config group version, in
// which plugin arguments live.
var SchemeGroupVersion = schedconfig.SchemeGroupVersion

// AddToScheme registers the internal DiskFitArgs with a scheme.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(SchemeGroupVersion, &DiskFitArgs{})
	return nil
}

func init() {
	// kube-scheduler builds its plugin-argument conversion scheme lazily
	// from this builder, so registering here makes DiskFitArgs convertible
	// without touching that scheme directly.
	schedconfig.SchemeBuilder.Register(AddToScheme)
}
