package packing

import "testing"

func TestSatAddSub(t *testing.T) {
	const maxInt64, minInt64 = int64(^uint64(0) >> 1), -int64(^uint64(0)>>1) - 1
	for _, tc := range []struct {
		a, b, sum, diff int64
	}{
		{a: 1, b: 2, sum: 3, diff: -1},
		{a: maxInt64, b: 1, sum: maxInt64, diff: maxInt64 - 1},
		{a: maxInt64/2 + 1, b: maxInt64/2 + 1, sum: maxInt64, diff: 0},
		{a: minInt64, b: -1, sum: minInt64, diff: minInt64 + 1},
		{a: 0, b: minInt64, sum: minInt64, diff: maxInt64},
		{a: -1, b: maxInt64, sum: maxInt64 - 1, diff: minInt64},
		{a: -2, b: maxInt64, sum: maxInt64 - 2, diff: minInt64},
		{a: 10 * gi, b: minInt64, sum: minInt64 + 10*gi, diff: maxInt64},
	} {
		if got := SatAdd(tc.a, tc.b); got != tc.sum {
			t.Errorf("SatAdd(%d, %d) = %d, want %d", tc.a, tc.b, got, tc.sum)
		}
		if got := SatSub(tc.a, tc.b); got != tc.diff {
			t.Errorf("SatSub(%d, %d) = %d, want %d", tc.a, tc.b, got, tc.diff)
		}
	}
}
