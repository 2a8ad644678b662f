package config

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ScoringStrategyType names how DiskFit rates nodes and picks disks. It is
// the one definition of the names: v1.ScoringStrategy uses this type, and
// validation lists ScoringStrategyTypes.
type ScoringStrategyType string

const (
	// MostAllocated bin-packs: it prefers the disk and the node where the
	// claims leave the least free space, so large holes stay free for
	// large volumes.
	MostAllocated ScoringStrategyType = "MostAllocated"
	// LeastAllocated spreads: it prefers the emptiest disk, for IO.
	LeastAllocated ScoringStrategyType = "LeastAllocated"
)

// ScoringStrategyTypes returns every supported strategy, the default
// (MostAllocated) first.
func ScoringStrategyTypes() []ScoringStrategyType {
	return []ScoringStrategyType{MostAllocated, LeastAllocated}
}

// DeviceClassWeight weighs the claims of one device class in a node's score.
type DeviceClassWeight struct {
	// DeviceClass is the disks' deviceClass ("" for claims without one).
	DeviceClass string
	// Weight is the relative weight, 1 to validation.MaxWeight.
	Weight int64
}

// ScoringStrategy configures scoring and disk choice.
type ScoringStrategy struct {
	// Type is MostAllocated or LeastAllocated.
	Type ScoringStrategyType
	// DeviceClassWeights weigh claims by device class; classes not listed
	// weigh 1.
	DeviceClassWeights []DeviceClassWeight
}

// DiskFitArgs are the arguments of the DiskFit plugin, defaulted: every
// field holds a value the user set or the v1 default, so a zero here is an
// explicit zero (see each field for what it means).
//
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type DiskFitArgs struct {
	metav1.TypeMeta

	// BindTimeoutSeconds is passed to the embedded VolumeBinding plugin: how
	// long PreBind waits for the volumes to be bound. At least 1; zero is
	// invalid, since PreBind would give up before any volume is provisioned.
	BindTimeoutSeconds int64
	// ScoringStrategy selects how nodes are scored and disks chosen.
	ScoringStrategy ScoringStrategy
	// MaxDiskNodeAge rejects nodes whose DiskNode was observed longer ago;
	// zero disables the check.
	MaxDiskNodeAge metav1.Duration
	// MaxExactClaims is the number of claims up to which packing is exact;
	// zero turns the exact search off (greedy only).
	MaxExactClaims int32
}
