// +k8s:deepcopy-gen=package

// Package config holds the internal (unversioned) DiskFit plugin arguments.
// They are registered with kube-scheduler's internal config group, so a
// KubeSchedulerConfiguration's pluginConfig can carry them.
//
// This package is the one home of the scoring strategy names
// (ScoringStrategyType); the v1 package uses them. Deep-copy functions
// are generated (zz_generated.deepcopy.go, hack/update-codegen.sh).
package config
