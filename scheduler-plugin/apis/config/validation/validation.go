// Package validation checks internal DiskFit plugin arguments.
package validation

import (
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/diskfit/diskfit/scheduler-plugin/apis/config"
)

// MaxExactClaimsLimit bounds exact packing; the search is exponential in the
// number of claims, so more would make a single Filter call expensive.
const MaxExactClaimsLimit = 12

// MaxWeight is the largest device-class weight.
const MaxWeight = 100

// ValidateDiskFitArgs returns every problem with args, rooted at path.
func ValidateDiskFitArgs(path *field.Path, args *config.DiskFitArgs) error {
	if path == nil {
		path = field.NewPath("args")
	}
	var errs field.ErrorList
	if args.BindTimeoutSeconds < 0 {
		errs = append(errs, field.Invalid(path.Child("bindTimeoutSeconds"), args.BindTimeoutSeconds, "must not be negative"))
	}
	strategy := path.Child("scoringStrategy")
	switch args.ScoringStrategy.Type {
	case config.MostAllocated, config.LeastAllocated:
	default:
		errs = append(errs, field.NotSupported(strategy.Child("type"), args.ScoringStrategy.Type,
			[]string{string(config.MostAllocated), string(config.LeastAllocated)}))
	}
	seen := map[string]bool{}
	for i, w := range args.ScoringStrategy.DeviceClassWeights {
		p := strategy.Child("deviceClassWeights").Index(i)
		if seen[w.DeviceClass] {
			errs = append(errs, field.Duplicate(p.Child("deviceClass"), w.DeviceClass))
		}
		seen[w.DeviceClass] = true
		if w.Weight < 1 || w.Weight > MaxWeight {
			errs = append(errs, field.Invalid(p.Child("weight"), w.Weight, "must be between 1 and 100"))
		}
	}
	if args.MaxDiskNodeAge.Duration < 0 {
		errs = append(errs, field.Invalid(path.Child("maxDiskNodeAge"), args.MaxDiskNodeAge.Duration.String(), "must not be negative; 0s disables the check"))
	}
	if args.MaxExactClaims < 0 || args.MaxExactClaims > MaxExactClaimsLimit {
		errs = append(errs, field.Invalid(path.Child("maxExactClaims"), args.MaxExactClaims, "must be between 0 and 12"))
	}
	return errs.ToAggregate()
}
