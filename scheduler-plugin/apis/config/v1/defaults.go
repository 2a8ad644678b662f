package v1

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/diskfit/diskfit/scheduler-plugin/packing"
)

const (
	// DefaultBindTimeoutSeconds matches VolumeBinding's default.
	DefaultBindTimeoutSeconds int64 = 600
	// DefaultMaxDiskNodeAge is several of the node plugin's periodic
	// refreshes, so one missed refresh does not make a node unschedulable.
	DefaultMaxDiskNodeAge = 5 * time.Minute
	// DefaultDeviceClassWeight is the weight of a listed device class whose
	// weight is unset, and of every class not listed.
	DefaultDeviceClassWeight int64 = 1
)

// SetDefaults_DiskFitArgs fills unset fields: a nil pointer (and a zero
// weight, which cannot be told apart from an unset one) takes the default;
// an explicit zero elsewhere is kept, for validation to accept (0s
// maxDiskNodeAge, 0 maxExactClaims: off) or reject (0 bindTimeoutSeconds).
// The generated SetObjectDefaults_DiskFitArgs calls it, and the scheme
// through RegisterDefaults.
//
// MaxExactClaims defaults to packing.DefaultMaxExactClaims, the packing
// package's own default, so both name one number.
func SetDefaults_DiskFitArgs(obj *DiskFitArgs) { //nolint:revive // scheme naming convention
	if obj.BindTimeoutSeconds == nil {
		obj.BindTimeoutSeconds = ptr.To(DefaultBindTimeoutSeconds)
	}
	if obj.ScoringStrategy == nil {
		obj.ScoringStrategy = &ScoringStrategy{}
	}
	if obj.ScoringStrategy.Type == "" {
		obj.ScoringStrategy.Type = MostAllocated
	}
	for i := range obj.ScoringStrategy.DeviceClassWeights {
		if obj.ScoringStrategy.DeviceClassWeights[i].Weight == 0 {
			obj.ScoringStrategy.DeviceClassWeights[i].Weight = DefaultDeviceClassWeight
		}
	}
	if obj.MaxDiskNodeAge == nil {
		obj.MaxDiskNodeAge = &metav1.Duration{Duration: DefaultMaxDiskNodeAge}
	}
	if obj.MaxExactClaims == nil {
		obj.MaxExactClaims = ptr.To[int32](packing.DefaultMaxExactClaims)
	}
}
