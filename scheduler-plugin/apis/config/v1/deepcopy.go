package v1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// DeepCopyInto copies the receiver into out.
func (in *DiskFitArgs) DeepCopyInto(out *DiskFitArgs) {
	*out = *in
	if in.BindTimeoutSeconds != nil {
		v := *in.BindTimeoutSeconds
		out.BindTimeoutSeconds = &v
	}
	if in.ScoringStrategy != nil {
		s := *in.ScoringStrategy
		if s.DeviceClassWeights != nil {
			s.DeviceClassWeights = append([]DeviceClassWeight(nil), s.DeviceClassWeights...)
		}
		out.ScoringStrategy = &s
	}
	if in.MaxDiskNodeAge != nil {
		v := metav1.Duration{Duration: in.MaxDiskNodeAge.Duration}
		out.MaxDiskNodeAge = &v
	}
	if in.MaxExactClaims != nil {
		v := *in.MaxExactClaims
		out.MaxExactClaims = &v
	}
}

// DeepCopy returns a deep copy of the receiver.
func (in *DiskFitArgs) DeepCopy() *DiskFitArgs {
	if in == nil {
		return nil
	}
	out := new(DiskFitArgs)
	in.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements runtime.Object.
func (in *DiskFitArgs) DeepCopyObject() runtime.Object {
	if c := in.DeepCopy(); c != nil {
		return c
	}
	return nil
}
