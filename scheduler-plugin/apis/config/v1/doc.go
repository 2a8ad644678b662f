// +k8s:deepcopy-gen=package
// +k8s:conversion-gen=github.com/diskfit/diskfit/scheduler-plugin/apis/config
// +k8s:defaulter-gen=TypeMeta
// +groupName=kubescheduler.config.k8s.io

// Package v1 holds the versioned DiskFit plugin arguments
// (kubescheduler.config.k8s.io/v1, kind DiskFitArgs), their defaults and
// their conversion to the internal type.
//
// Deep-copy, conversion and defaulting registration are generated
// (zz_generated.*.go, hack/update-codegen.sh); the hand-written parts are
// SetDefaults_DiskFitArgs (defaults.go) and the two conversions between the
// optional *ScoringStrategy and the internal value (conversion.go).
package v1
