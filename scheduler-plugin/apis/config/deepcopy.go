package config

import "k8s.io/apimachinery/pkg/runtime"

// DeepCopyInto copies the receiver into out.
func (in *DiskFitArgs) DeepCopyInto(out *DiskFitArgs) {
	*out = *in
	out.TypeMeta = in.TypeMeta
	if in.ScoringStrategy.DeviceClassWeights != nil {
		out.ScoringStrategy.DeviceClassWeights = append([]DeviceClassWeight(nil), in.ScoringStrategy.DeviceClassWeights...)
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
