package v1

import (
	"fmt"

	"k8s.io/apimachinery/pkg/conversion"

	"github.com/diskfit/diskfit/scheduler-plugin/apis/config"
)

// The conversions below are the only hand-written ones: v1 has an optional
// *ScoringStrategy where the internal type has a value, a pair
// conversion-gen cannot convert by itself. It finds these functions by their
// signature and calls them from zz_generated.conversion.go; every other
// field, including the other pointers (through apimachinery's
// Convert_Pointer_* helpers), is converted by generated code.

// Convert_Pointer_v1_ScoringStrategy_To_config_ScoringStrategy converts an
// optional v1 strategy; nil (never seen after defaulting) becomes the zero
// value.
func Convert_Pointer_v1_ScoringStrategy_To_config_ScoringStrategy(in **ScoringStrategy, out *config.ScoringStrategy, s conversion.Scope) error { //nolint:revive // scheme naming convention
	if *in == nil {
		*out = config.ScoringStrategy{}
		return nil
	}
	return Convert_v1_ScoringStrategy_To_config_ScoringStrategy(*in, out, s)
}

// Convert_config_ScoringStrategy_To_Pointer_v1_ScoringStrategy converts the
// internal strategy to a newly allocated v1 one.
func Convert_config_ScoringStrategy_To_Pointer_v1_ScoringStrategy(in *config.ScoringStrategy, out **ScoringStrategy, s conversion.Scope) error { //nolint:revive // scheme naming convention
	*out = new(ScoringStrategy)
	return Convert_config_ScoringStrategy_To_v1_ScoringStrategy(in, *out, s)
}

// InternalArgs returns the internal args of v with every default applied,
// as the scheduler decodes a configuration file; v is not changed.
func InternalArgs(v *DiskFitArgs) (*config.DiskFitArgs, error) {
	v = v.DeepCopy()
	SetObjectDefaults_DiskFitArgs(v)
	out := &config.DiskFitArgs{}
	if err := Convert_v1_DiskFitArgs_To_config_DiskFitArgs(v, out, nil); err != nil {
		return nil, fmt.Errorf("converting DiskFit args: %w", err)
	}
	return out, nil
}

// DefaultArgs returns the internal args with every default applied: what
// DiskFit runs with when its configuration has no args.
func DefaultArgs() *config.DiskFitArgs {
	// The conversion cannot fail on defaulted input.
	out, _ := InternalArgs(&DiskFitArgs{})
	return out
}
