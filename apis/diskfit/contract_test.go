package diskfit

import (
	"math"
	"testing"
)

func TestVolumeBytes(t *testing.T) {
	const mi = 1 << 20
	tests := []struct {
		name      string
		requested int64
		block     bool
		want      int64
	}{
		{name: "filesystem below the floor", requested: 128 * mi, want: 300 * mi},
		{name: "filesystem at the floor", requested: 300 * mi, want: 300 * mi},
		{name: "filesystem aligned", requested: 1 << 30, want: 1 << 30},
		{name: "filesystem rounded up", requested: 1_000_000_000, want: 954 * mi},
		{name: "block small", requested: 4096, block: true, want: mi},
		{name: "block rounded up", requested: 10*mi + 1, block: true, want: 11 * mi},
		{name: "zero", requested: 0, block: true, want: mi},
		// Rounding these up used to wrap around to the floor, so the
		// scheduler booked 300 MiB for an 8 EiB claim (FuzzPVCLocation).
		{name: "largest aligned", requested: math.MaxInt64 / mi * mi, want: math.MaxInt64 / mi * mi},
		{name: "too large to round up", requested: math.MaxInt64/mi*mi + 1, want: math.MaxInt64},
		{name: "max int64", requested: math.MaxInt64, block: true, want: math.MaxInt64},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := VolumeBytes(tt.requested, tt.block); got != tt.want {
				t.Fatalf("VolumeBytes(%d, %v) = %d, want %d", tt.requested, tt.block, got, tt.want)
			}
		})
	}
}
