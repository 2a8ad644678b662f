// Package v1alpha1 is the v1alpha1 version of the diskfit.io API: DiskNode,
// the per-node disk inventory that the diskfit CSI driver publishes and the
// DiskFit scheduler plugin reads.
//
// +k8s:deepcopy-gen=package
// +groupName=diskfit.io
package v1alpha1
