package packing

import (
	"fmt"
	"strings"
	"testing"
)

const gi = int64(1) << 30

func disk(name string, free int64) Disk {
	return Disk{Name: name, Capacity: 10 * gi, Free: free, Healthy: true}
}

func classDisk(name, class string, free int64) Disk {
	d := disk(name, free)
	d.DeviceClass = class
	return d
}

func claims(sizes ...int64) []Claim {
	out := make([]Claim, len(sizes))
	for i, s := range sizes {
		out[i] = Claim{Key: fmt.Sprintf("c%d", i), Name: fmt.Sprintf("ns/c%d", i), Size: s}
	}
	SortClaims(out)
	return out
}

func TestPack(t *testing.T) {
	unhealthy := disk("bad", 100*gi)
	unhealthy.Healthy = false
	ssdClaim := Claim{Key: "s", Name: "ns/s", Size: 3 * gi, DeviceClass: "ssd"}

	tests := []struct {
		name     string
		disks    []Disk
		claims   []Claim
		opts     Options
		wantFit  bool
		wantDisk []string // expected disk per claim (in sorted claim order), when set
	}{
		{
			name:    "free space is not additive: two 1Gi disks reject a 2Gi claim",
			disks:   []Disk{disk("a", gi), disk("b", gi)},
			claims:  claims(2 * gi),
			wantFit: false,
		},
		{
			name:    "two 3Gi claims fit on 4Gi+4Gi",
			disks:   []Disk{disk("a", 4*gi), disk("b", 4*gi)},
			claims:  claims(3*gi, 3*gi),
			wantFit: true,
		},
		{
			name:    "two 3Gi claims do not fit on 4Gi+2Gi",
			disks:   []Disk{disk("a", 4*gi), disk("b", 2*gi)},
			claims:  claims(3*gi, 3*gi),
			wantFit: false,
		},
		{
			name:     "a copy goes to its source's disk even when another fits better",
			disks:    []Disk{disk("a", 2*gi), disk("b", 8*gi)},
			claims:   []Claim{{Key: "r", Name: "ns/r", Size: gi, Disk: "b"}},
			wantFit:  true,
			wantDisk: []string{"b"},
		},
		{
			name:    "a copy does not fit when its source's disk is full",
			disks:   []Disk{disk("a", 8*gi), disk("b", gi)},
			claims:  []Claim{{Key: "r", Name: "ns/r", Size: 2 * gi, Disk: "b"}},
			wantFit: false,
		},
		{
			name:  "other claims make room for a copy on its source's disk",
			disks: []Disk{disk("a", 3*gi), disk("b", 3*gi)},
			// Sorted order: the unpinned claim comes first and takes disk a
			// greedily; the exhaustive search moves it.
			claims:   []Claim{{Key: "o", Name: "ns/o", Size: 2 * gi}, {Key: "r", Name: "ns/r", Size: 2 * gi, Disk: "a"}},
			wantFit:  true,
			wantDisk: []string{"b", "a"},
		},
		{
			name:    "no claims always fit",
			disks:   nil,
			claims:  nil,
			wantFit: true,
		},
		{
			name:    "no disks reject a claim",
			claims:  claims(gi),
			wantFit: false,
		},
		{
			name:     "exact fit uses the whole disk",
			disks:    []Disk{disk("a", 3*gi)},
			claims:   claims(3 * gi),
			wantFit:  true,
			wantDisk: []string{"a"},
		},
		{
			name:    "unhealthy disks are skipped",
			disks:   []Disk{unhealthy, disk("a", gi)},
			claims:  claims(2 * gi),
			wantFit: false,
		},
		{
			name:     "device class restricts the disks",
			disks:    []Disk{classDisk("hdd0", "hdd", 10*gi), classDisk("ssd0", "ssd", 4*gi)},
			claims:   []Claim{ssdClaim},
			wantFit:  true,
			wantDisk: []string{"ssd0"},
		},
		{
			name:    "device class with too little room rejects though another class has room",
			disks:   []Disk{classDisk("hdd0", "hdd", 10*gi), classDisk("ssd0", "ssd", 2*gi)},
			claims:  []Claim{ssdClaim},
			wantFit: false,
		},
		{
			name:    "claims of different classes packed jointly",
			disks:   []Disk{classDisk("hdd0", "hdd", 3*gi), classDisk("ssd0", "ssd", 3*gi)},
			claims:  []Claim{ssdClaim, {Key: "h", Name: "ns/h", Size: 3 * gi, DeviceClass: "hdd"}},
			wantFit: true,
			// Both 3Gi; SortClaims is not applied, so order is as given.
			wantDisk: []string{"ssd0", "hdd0"},
		},
		{
			name:    "reservations already taken out of Free are respected",
			disks:   []Disk{{Name: "a", Capacity: 10 * gi, Free: 10*gi - 8*gi, Healthy: true}},
			claims:  claims(3 * gi),
			wantFit: false,
		},
		{
			name:     "MostAllocated picks the fullest disk that fits",
			disks:    []Disk{disk("big", 9*gi), disk("tight", 3*gi), disk("small", gi)},
			claims:   claims(2 * gi),
			wantFit:  true,
			wantDisk: []string{"tight"},
		},
		{
			name:     "LeastAllocated picks the emptiest disk",
			disks:    []Disk{disk("big", 9*gi), disk("tight", 3*gi), disk("small", gi)},
			claims:   claims(2 * gi),
			opts:     Options{Strategy: LeastAllocated},
			wantFit:  true,
			wantDisk: []string{"big"},
		},
		{
			// Best-fit decreasing puts 5 on the 5-disk, 4 on the 6-disk,
			// then 2+2 find 2 left on the 6-disk and nothing else... the
			// search must find 5+... a placement greedy misses.
			name:    "exact search finds what greedy misses",
			disks:   []Disk{disk("a", 6*gi), disk("b", 7*gi)},
			claims:  claims(4*gi, 3*gi, 3*gi, 3*gi),
			wantFit: true,
		},
		{
			name:    "beyond MaxExactClaims only the heuristic decides",
			disks:   []Disk{disk("a", 6*gi), disk("b", 7*gi)},
			claims:  claims(4*gi, 3*gi, 3*gi, 3*gi),
			opts:    Options{MaxExactClaims: 3},
			wantFit: false,
		},
		{
			name:    "eight claims on eight disks fit exactly",
			disks:   []Disk{disk("d0", 2*gi), disk("d1", 2*gi), disk("d2", 2*gi), disk("d3", 2*gi), disk("d4", 2*gi), disk("d5", 2*gi), disk("d6", 2*gi), disk("d7", 2*gi)},
			claims:  claims(2*gi, 2*gi, 2*gi, 2*gi, 2*gi, 2*gi, 2*gi, 2*gi),
			wantFit: true,
		},
		{
			name:    "total space suffices but the split does not",
			disks:   []Disk{disk("d0", 5*gi), disk("d1", 5*gi), disk("d2", 5*gi)},
			claims:  claims(4*gi, 4*gi, 4*gi, 3*gi),
			wantFit: false,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assign := make([]int, len(tc.claims))
			got := Pack(tc.disks, tc.claims, tc.opts, assign)
			if got != tc.wantFit {
				t.Fatalf("Pack() = %v, want %v", got, tc.wantFit)
			}
			if !got {
				return
			}
			checkAssignment(t, tc.disks, tc.claims, assign)
			for i, want := range tc.wantDisk {
				if name := tc.disks[assign[i]].Name; name != want {
					t.Errorf("claim %s on disk %s, want %s", tc.claims[i].Name, name, want)
				}
			}
		})
	}
}

// checkAssignment verifies an assignment independently of Pack.
func checkAssignment(t *testing.T, disks []Disk, claims []Claim, assign []int) {
	t.Helper()
	used := make([]int64, len(disks))
	for i, c := range claims {
		d := disks[assign[i]]
		if !c.allows(&d) {
			t.Errorf("claim %s placed on unusable disk %s", c.Name, d.Name)
		}
		used[assign[i]] += c.Size
	}
	for i, d := range disks {
		if used[i] > d.Free {
			t.Errorf("disk %s overbooked: %d > %d", d.Name, used[i], d.Free)
		}
	}
}

// TestPackExhaustive compares Pack with brute force on small inputs.
func TestPackExhaustive(t *testing.T) {
	sizes := []int64{1, 2, 3, 4, 5}
	for seed := 0; seed < 400; seed++ {
		r := seed
		next := func(n int) int { r = (r*1103515245 + 12345) & 0x7fffffff; return r % n }
		var ds []Disk
		for i := 0; i < 1+next(4); i++ {
			ds = append(ds, Disk{Name: fmt.Sprintf("d%d", i), Capacity: 10, Free: int64(next(9)), Healthy: true})
		}
		var cs []Claim
		for i := 0; i < 1+next(5); i++ {
			cs = append(cs, Claim{Key: fmt.Sprintf("c%d", i), Size: sizes[next(len(sizes))]})
		}
		SortClaims(cs)
		want := bruteForce(ds, cs, make([]int64, len(ds)), 0)
		assign := make([]int, len(cs))
		if got := Pack(ds, cs, Options{}, assign); got != want {
			t.Fatalf("seed %d: Pack = %v, brute force = %v (disks %+v claims %+v)", seed, got, want, ds, cs)
		}
	}
}

func bruteForce(ds []Disk, cs []Claim, used []int64, i int) bool {
	if i == len(cs) {
		return true
	}
	for d := range ds {
		if used[d]+cs[i].Size <= ds[d].Free {
			used[d] += cs[i].Size
			if bruteForce(ds, cs, used, i+1) {
				return true
			}
			used[d] -= cs[i].Size
		}
	}
	return false
}

func TestScore(t *testing.T) {
	tests := []struct {
		name     string
		disks    []Disk
		claims   []Claim
		strategy Strategy
		weigh    Weigher
		want     int64
	}{
		{
			name:     "MostAllocated: 1Gi left is one octave below the maximum",
			disks:    []Disk{disk("a", 4*gi)},
			claims:   claims(3 * gi),
			strategy: MostAllocated,
			want:     100 - 100/16,
		},
		{
			name:     "LeastAllocated: the same placement scores the complement",
			disks:    []Disk{disk("a", 4*gi)},
			claims:   claims(3 * gi),
			strategy: LeastAllocated,
			want:     10,
		},
		{
			name:     "MostAllocated: a full disk scores maximum",
			disks:    []Disk{disk("a", 2*gi)},
			claims:   claims(2 * gi),
			strategy: MostAllocated,
			want:     100,
		},
		{
			name:     "two claims on one disk both see what it has left",
			disks:    []Disk{disk("a", 10*gi)},
			claims:   claims(3*gi, 2*gi),
			strategy: MostAllocated,
			// 5Gi left: log2(6) octaves of 100/16.
			want: 84,
		},
		{
			name:     "weights by device class",
			disks:    []Disk{classDisk("s", "ssd", 10*gi), classDisk("h", "hdd", 2*gi)},
			claims:   []Claim{{Key: "a", Size: 2 * gi, DeviceClass: "ssd"}, {Key: "b", Size: 2 * gi, DeviceClass: "hdd"}},
			strategy: MostAllocated,
			weigh: func(c string) int64 {
				if c == "ssd" {
					return 3
				}
				return 1
			},
			// ssd disk: 8Gi left (log2(9) octaves), weight 3; hdd disk:
			// full, weight 1.
			want: (80*3 + 100) / 4,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assign := make([]int, len(tc.claims))
			if !Pack(tc.disks, tc.claims, Options{Strategy: tc.strategy}, assign) {
				t.Fatal("claims do not fit")
			}
			if got := Score(tc.disks, tc.claims, assign, tc.strategy, tc.weigh, 100); got != tc.want {
				t.Errorf("Score() = %d, want %d", got, tc.want)
			}
		})
	}
}

// TestScoreKeepsLargeHoles: a small claim scores higher in the tighter hole
// of two nodes, even when that hole is on a small disk and the other on a
// large disk that utilisation would call fuller. Taking 50Gi from the 8Ti
// disk's 1Ti would leave it unable to hold a 1Ti claim.
func TestScoreKeepsLargeHoles(t *testing.T) {
	large := Disk{Name: "large", Capacity: 8 << 40, Free: 1 << 40, Healthy: true}
	small := Disk{Name: "small", Capacity: 512 * gi, Free: 200 * gi, Healthy: true}
	c := claims(50 * gi)
	scoreOn := func(d Disk) int64 {
		return Score([]Disk{d}, c, []int{0}, MostAllocated, nil, 100)
	}
	if l, s := scoreOn(large), scoreOn(small); l >= s {
		t.Errorf("50Gi claim: 1Ti hole of an 8Ti disk scores %d, 200Gi hole of a 512Gi disk %d; want the tighter hole higher", l, s)
	}
}

func TestLeftoverScore(t *testing.T) {
	for _, tc := range []struct {
		left, want int64
	}{
		{0, 100},
		{-1, 100},
		{gi, 94},
		{64 << 40, 0},
		{1 << 62, 0},
	} {
		if got := LeftoverScore(tc.left, 100); got != tc.want {
			t.Errorf("LeftoverScore(%d) = %d, want %d", tc.left, got, tc.want)
		}
	}
}

func TestExplain(t *testing.T) {
	unhealthy := disk("bad", 100*gi)
	unhealthy.Healthy = false
	tests := []struct {
		name   string
		disks  []Disk
		claims []Claim
		want   string
	}{
		{
			name:   "names the largest disk and the shortfall",
			disks:  []Disk{disk("nvme0", 5*gi), disk("nvme1", 9*gi)},
			claims: claims(10 * gi),
			want:   "largest free disk nvme1 has 9Gi, pod needs 10Gi on one disk",
		},
		{
			name:   "device class without disks",
			disks:  []Disk{classDisk("hdd0", "hdd", 10*gi)},
			claims: []Claim{{Key: "a", Name: "ns/a", Size: gi, DeviceClass: "ssd"}},
			want:   `no healthy disk of device class "ssd"`,
		},
		{
			name:   "only unhealthy disks",
			disks:  []Disk{unhealthy},
			claims: claims(gi),
			want:   "no healthy disk",
		},
		{
			name:   "a copy whose source disk is missing",
			disks:  []Disk{disk("a", 10*gi)},
			claims: []Claim{{Key: "r", Name: "ns/r", Size: gi, Disk: "gone"}},
			want:   "claim ns/r copies data held on disk gone, which is not a healthy disk of this node",
		},
		{
			name:   "a copy larger than its source disk's free space",
			disks:  []Disk{disk("a", 10*gi), disk("b", gi)},
			claims: []Claim{{Key: "r", Name: "ns/r", Size: 2 * gi, Disk: "b"}},
			want:   "disk b holds the source of claim ns/r and has 1Gi free, the claim needs 2Gi",
		},
		{
			name:   "copies that do not fit together name only their source's disk",
			disks:  []Disk{disk("a", 10*gi), disk("b", 3*gi)},
			claims: []Claim{{Key: "r", Name: "ns/r", Size: 2 * gi, Disk: "b"}, {Key: "c", Name: "ns/c", Size: 2 * gi, Disk: "b"}},
			want:   "claims 2Gi+2Gi do not fit together on disks b (3Gi free)",
		},
		{
			name:   "claims that fit alone but not together",
			disks:  []Disk{disk("a", 4*gi), disk("b", 2*gi)},
			claims: claims(3*gi, 3*gi),
			want:   "claims 3Gi+3Gi do not fit together on disks a (4Gi free), b (2Gi free)",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Explain(tc.disks, tc.claims); !strings.Contains(got, tc.want) {
				t.Errorf("Explain() = %q, want it to contain %q", got, tc.want)
			}
		})
	}
}

func TestFormatBytes(t *testing.T) {
	for in, want := range map[int64]string{0: "0", 512: "512", 1 << 20: "1Mi", 3 << 30: "3Gi", 3<<30 + 1<<29: "3.5Gi", 2 << 40: "2Ti"} {
		if got := FormatBytes(in); got != want {
			t.Errorf("FormatBytes(%d) = %q, want %q", in, got, want)
		}
	}
}

// Sums of free space and of claim sizes saturate: two disks with nearly
// the whole int64 range free each used to add up to a negative total, and
// the exact search then pruned a placement that exists.
func TestPackSumsDoNotWrap(t *testing.T) {
	const maxInt64 = int64(^uint64(0) >> 1)
	disks := []Disk{
		{Name: "a", Capacity: maxInt64, Free: maxInt64, Healthy: true},
		{Name: "b", Capacity: maxInt64, Free: maxInt64 - 1, Healthy: true},
	}
	// Greedy best fit puts the big claim on the fuller disk b, where the
	// claim restricted to b no longer fits; the search finds big on a.
	claims := []Claim{
		{Key: "big", Name: "ns/big", Size: maxInt64 - 1},
		{Key: "copy", Name: "ns/copy", Size: 1, Disk: "b"},
	}
	SortClaims(claims)
	assign := make([]int, len(claims))
	if !Pack(disks, claims, Options{}, assign) {
		t.Fatalf("Pack: does not fit, want big on a and copy on b")
	}
	if got := []string{disks[assign[0]].Name, disks[assign[1]].Name}; got[0] != "a" || got[1] != "b" {
		t.Errorf("assignment %v, want [a b]", got)
	}
}
