package v1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/diskfit/diskfit/scheduler-plugin/apis/config"
)

// The strategy names are defined once, in the internal package
// (config.ScoringStrategyType); ScoringStrategy.Type uses that type, and
// these constants are the same values under the v1 package's name.
const (
	// MostAllocated bin-packs (config.MostAllocated).
	MostAllocated = config.MostAllocated
	// LeastAllocated spreads (config.LeastAllocated).
	LeastAllocated = config.LeastAllocated
)

// DeviceClassWeight weighs the claims of one device class in a node's score.
type DeviceClassWeight struct {
	// DeviceClass is the disks' deviceClass ("" for claims without one).
	DeviceClass string `json:"deviceClass"`
	// Weight is the relative weight, 1 to 100; unset (0) defaults to 1.
	Weight int64 `json:"weight,omitempty"`
}

// ScoringStrategy configures scoring and disk choice.
type ScoringStrategy struct {
	// Type is MostAllocated (default) or LeastAllocated.
	Type config.ScoringStrategyType `json:"type,omitempty"`
	// DeviceClassWeights weigh claims by device class; classes not listed
	// weigh 1.
	DeviceClassWeights []DeviceClassWeight `json:"deviceClassWeights,omitempty"`
}

// DiskFitArgs are the arguments of the DiskFit plugin. An unset (nil) field
// takes its default; an explicit zero keeps the meaning given per field.
//
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type DiskFitArgs struct {
	metav1.TypeMeta `json:",inline"`

	// BindTimeoutSeconds is passed to the embedded VolumeBinding plugin: how
	// long PreBind waits for the volumes to be bound. Default 600; 0 is
	// invalid.
	BindTimeoutSeconds *int64 `json:"bindTimeoutSeconds,omitempty"`
	// ScoringStrategy selects how nodes are scored and disks chosen.
	// Default MostAllocated.
	ScoringStrategy *ScoringStrategy `json:"scoringStrategy,omitempty"`
	// MaxDiskNodeAge rejects nodes whose DiskNode status was observed
	// longer ago; "0s" disables the check. Default 5m.
	MaxDiskNodeAge *metav1.Duration `json:"maxDiskNodeAge,omitempty"`
	// MaxExactClaims is the number of claims per pod up to which packing
	// is exact; beyond it a greedy heuristic decides, and 0 means greedy
	// only. Default 8, at most 12.
	MaxExactClaims *int32 `json:"maxExactClaims,omitempty"`
}
