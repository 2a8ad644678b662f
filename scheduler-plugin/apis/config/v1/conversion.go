package v1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/conversion"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/diskfit/diskfit/scheduler-plugin/apis/config"
)

// RegisterConversions registers the conversions between v1 and internal
// DiskFitArgs with a scheme.
func RegisterConversions(s *runtime.Scheme) error {
	if err := s.AddConversionFunc((*DiskFitArgs)(nil), (*config.DiskFitArgs)(nil), func(a, b interface{}, scope conversion.Scope) error {
		return Convert_v1_DiskFitArgs_To_config_DiskFitArgs(a.(*DiskFitArgs), b.(*config.DiskFitArgs), scope)
	}); err != nil {
		return err
	}
	return s.AddConversionFunc((*config.DiskFitArgs)(nil), (*DiskFitArgs)(nil), func(a, b interface{}, scope conversion.Scope) error {
		return Convert_config_DiskFitArgs_To_v1_DiskFitArgs(a.(*config.DiskFitArgs), b.(*DiskFitArgs), scope)
	})
}

// Convert_v1_DiskFitArgs_To_config_DiskFitArgs converts defaulted v1 args to
// the internal type; unset pointers become zero values.
func Convert_v1_DiskFitArgs_To_config_DiskFitArgs(in *DiskFitArgs, out *config.DiskFitArgs, _ conversion.Scope) error { //nolint:revive // scheme naming convention
	*out = config.DiskFitArgs{}
	if in.BindTimeoutSeconds != nil {
		out.BindTimeoutSeconds = *in.BindTimeoutSeconds
	}
	if in.ScoringStrategy != nil {
		out.ScoringStrategy.Type = config.ScoringStrategyType(in.ScoringStrategy.Type)
		for _, w := range in.ScoringStrategy.DeviceClassWeights {
			out.ScoringStrategy.DeviceClassWeights = append(out.ScoringStrategy.DeviceClassWeights,
				config.DeviceClassWeight{DeviceClass: w.DeviceClass, Weight: w.Weight})
		}
	}
	if in.MaxDiskNodeAge != nil {
		out.MaxDiskNodeAge = *in.MaxDiskNodeAge
	}
	if in.MaxExactClaims != nil {
		out.MaxExactClaims = *in.MaxExactClaims
	}
	return nil
}

// Convert_config_DiskFitArgs_To_v1_DiskFitArgs converts internal args to v1.
func Convert_config_DiskFitArgs_To_v1_DiskFitArgs(in *config.DiskFitArgs, out *DiskFitArgs, _ conversion.Scope) error { //nolint:revive // scheme naming convention
	*out = DiskFitArgs{}
	bind := in.BindTimeoutSeconds
	out.BindTimeoutSeconds = &bind
	out.ScoringStrategy = &ScoringStrategy{Type: ScoringStrategyType(in.ScoringStrategy.Type)}
	for _, w := range in.ScoringStrategy.DeviceClassWeights {
		out.ScoringStrategy.DeviceClassWeights = append(out.ScoringStrategy.DeviceClassWeights,
			DeviceClassWeight{DeviceClass: w.DeviceClass, Weight: w.Weight})
	}
	age := metav1.Duration{Duration: in.MaxDiskNodeAge.Duration}
	out.MaxDiskNodeAge = &age
	exact := in.MaxExactClaims
	out.MaxExactClaims = &exact
	return nil
}
