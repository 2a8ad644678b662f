// Package validation checks internal DiskFit plugin arguments.
//
// The arguments it sees are defaulted (v1.SetDefaults_DiskFitArgs), so a zero
// is one the user wrote, and each field gives it one meaning:
// bindTimeoutSeconds 0 is invalid, maxDiskNodeAge 0s disables the age check,
// maxExactClaims 0 turns the exact search off. The messages are built from
// the constants below and config.ScoringStrategyTypes, so they cannot drift
// from the checks.
package validation

import (
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/diskfit/diskfit/scheduler-plugin/apis/config"
	"github.com/diskfit/diskfit/scheduler-plugin/packing"
)

const (
	// MinBindTimeoutSeconds is the shortest bind timeout. A timeout of 0
	// would make PreBind give up before any volume is provisioned.
	MinBindTimeoutSeconds = 1
	// MaxExactClaimsLimit bounds exact packing: packing.ExactClaimsLimit,
	// the most claims the packing search is built and tested for (the
	// search is exponential in the number of claims).
	MaxExactClaimsLimit = packing.ExactClaimsLimit
	// MinWeight is the smallest device-class weight.
	MinWeight = 1
	// MaxWeight is the largest device-class weight.
	MaxWeight = 100
)

// The messages of the range checks, built from the bounds.
var (
	bindTimeoutSecondsMessage = fmt.Sprintf("must be at least %d", MinBindTimeoutSeconds)
	weightMessage             = fmt.Sprintf("must be between %d and %d", MinWeight, MaxWeight)
	maxDiskNodeAgeMessage     = "must not be negative; 0s disables the check"
	maxExactClaimsMessage     = fmt.Sprintf("must be between 0 (greedy only) and %d", MaxExactClaimsLimit)
)

// ValidateDiskFitArgs returns every problem with args, rooted at path.
func ValidateDiskFitArgs(path *field.Path, args *config.DiskFitArgs) error {
	if path == nil {
		path = field.NewPath("args")
	}
	var errs field.ErrorList
	if args.BindTimeoutSeconds < MinBindTimeoutSeconds {
		errs = append(errs, field.Invalid(path.Child("bindTimeoutSeconds"), args.BindTimeoutSeconds, bindTimeoutSecondsMessage))
	}
	strategy := path.Child("scoringStrategy")
	if !slices.Contains(config.ScoringStrategyTypes(), args.ScoringStrategy.Type) {
		var names []string
		for _, t := range config.ScoringStrategyTypes() {
			names = append(names, string(t))
		}
		errs = append(errs, field.NotSupported(strategy.Child("type"), args.ScoringStrategy.Type, names))
	}
	seen := map[string]bool{}
	for i, w := range args.ScoringStrategy.DeviceClassWeights {
		p := strategy.Child("deviceClassWeights").Index(i)
		if seen[w.DeviceClass] {
			errs = append(errs, field.Duplicate(p.Child("deviceClass"), w.DeviceClass))
		}
		seen[w.DeviceClass] = true
		if w.Weight < MinWeight || w.Weight > MaxWeight {
			errs = append(errs, field.Invalid(p.Child("weight"), w.Weight, weightMessage))
		}
	}
	if args.MaxDiskNodeAge.Duration < 0 {
		errs = append(errs, field.Invalid(path.Child("maxDiskNodeAge"), args.MaxDiskNodeAge.Duration.String(), maxDiskNodeAgeMessage))
	}
	if args.MaxExactClaims < 0 || args.MaxExactClaims > MaxExactClaimsLimit {
		errs = append(errs, field.Invalid(path.Child("maxExactClaims"), args.MaxExactClaims, maxExactClaimsMessage))
	}
	return errs.ToAggregate()
}
