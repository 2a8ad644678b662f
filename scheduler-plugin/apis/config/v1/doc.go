// Package v1 holds the versioned DiskFit plugin arguments
// (kubescheduler.config.k8s.io/v1, kind DiskFitArgs), their defaults and
// their conversion to the internal type.
package v1
