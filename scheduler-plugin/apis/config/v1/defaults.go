package v1

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

const (
	// DefaultBindTimeoutSeconds matches VolumeBinding's default.
	DefaultBindTimeoutSeconds int64 = 600
	// DefaultMaxDiskNodeAge is several of the node plugin's periodic
	// refreshes, so one missed refresh does not make a node unschedulable.
	DefaultMaxDiskNodeAge = 5 * time.Minute
	// DefaultMaxExactClaims covers pods with up to 8 volumes exactly.
	DefaultMaxExactClaims int32 = 8
)

// SetDefaults_DiskFitArgs fills unset fields. The generated
// SetObjectDefaults_DiskFitArgs calls it, and the scheme through
// RegisterDefaults.
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
			obj.ScoringStrategy.DeviceClassWeights[i].Weight = 1
		}
	}
	if obj.MaxDiskNodeAge == nil {
		obj.MaxDiskNodeAge = &metav1.Duration{Duration: DefaultMaxDiskNodeAge}
	}
	if obj.MaxExactClaims == nil {
		obj.MaxExactClaims = ptr.To(DefaultMaxExactClaims)
	}
}
