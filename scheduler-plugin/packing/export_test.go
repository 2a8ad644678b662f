package packing

// PackForTest is Pack that also says whether the exact search ran out of
// steps.
func PackForTest(disks []Disk, claims []Claim, opts Options, assign []int) (fits, exhausted bool) {
	return pack(disks, claims, opts, assign)
}
