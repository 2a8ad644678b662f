package packing

import "math"

// SatAdd returns a+b clamped to the int64 range instead of wrapping around.
// Byte counts come from API objects and may be as large as int64 allows (a
// request of 8Ei or more counts as MaxInt64), and a sum that wrapped would
// turn a full disk into an empty one. Every sum of bytes in packing and in
// the ledger goes through SatAdd or SatSub.
func SatAdd(a, b int64) int64 {
	s := a + b
	switch {
	case a >= 0 && b >= 0 && s < 0:
		return math.MaxInt64
	case a < 0 && b < 0 && s >= 0:
		return math.MinInt64
	}
	return s
}

// SatSub returns a-b clamped to the int64 range instead of wrapping around.
func SatSub(a, b int64) int64 {
	s := a - b
	switch {
	case a >= 0 && b < 0 && s < 0:
		return math.MaxInt64
	case a < 0 && b > 0 && s >= 0:
		return math.MinInt64
	}
	return s
}
