// Package config holds the internal (unversioned) DiskFit plugin arguments.
// They are registered with kube-scheduler's internal config group, so a
// KubeSchedulerConfiguration's pluginConfig can carry them.
package config
