package packing

import (
	"fmt"
	"strconv"
	"strings"
)

// Explain says, for an operator reading a pod's events, why claims do not
// fit on disks. It names the disks and the shortfall, e.g. "largest free
// disk nvme1 has 9Gi, pod needs 10Gi on one disk". It is only called on
// the failure path, so it may allocate.
func Explain(disks []Disk, claims []Claim) string {
	// A claim with no healthy disk it may use at all.
	for ci := range claims {
		c := &claims[ci]
		any := false
		var closed []string
		for di := range disks {
			d := &disks[di]
			if c.allows(d) {
				any = true
				break
			}
			if d.Healthy && d.Unschedulable && (c.DeviceClass == "" || d.DeviceClass == c.DeviceClass) && (c.Disk == "" || c.Disk == d.Name) {
				closed = append(closed, d.Name)
			}
		}
		if !any {
			if len(closed) > 0 {
				return fmt.Sprintf("claim %s: disk %s is unschedulable (taken out of service in the node's DiskNode spec)", c.Name, strings.Join(closed, ", "))
			}
			if c.Disk != "" {
				return fmt.Sprintf("claim %s copies data held on disk %s, which is not a healthy disk of this node", c.Name, c.Disk)
			}
			if c.DeviceClass != "" {
				return fmt.Sprintf("no healthy disk of device class %q for claim %s", c.DeviceClass, c.Name)
			}
			if len(disks) == 0 {
				return "node reports no disks"
			}
			return "no healthy disk"
		}
	}
	// A claim larger than the largest usable disk's free space.
	for ci := range claims {
		c := &claims[ci]
		largest := -1
		for di := range disks {
			if !c.allows(&disks[di]) {
				continue
			}
			if largest < 0 || disks[di].Free > disks[largest].Free {
				largest = di
			}
		}
		if disks[largest].Free < c.Size && c.Disk != "" {
			return fmt.Sprintf("disk %s holds the source of claim %s and has %s free, the claim needs %s",
				c.Disk, c.Name, FormatBytes(max(disks[largest].Free, 0)), FormatBytes(c.Size))
		}
		if disks[largest].Free < c.Size {
			class := ""
			if c.DeviceClass != "" {
				class = " of device class " + strconv.Quote(c.DeviceClass)
			}
			return fmt.Sprintf("largest free disk%s %s has %s, pod needs %s on one disk (claim %s)",
				class, disks[largest].Name, FormatBytes(max(disks[largest].Free, 0)), FormatBytes(c.Size), c.Name)
		}
	}
	// Every claim fits alone, but not all of them together.
	var b strings.Builder
	b.WriteString("claims ")
	for ci := range claims {
		if ci > 0 {
			b.WriteString("+")
		}
		b.WriteString(FormatBytes(claims[ci].Size))
	}
	b.WriteString(" do not fit together on disks ")
	n := 0
	for di := range disks {
		if !anyAllows(claims, &disks[di]) {
			continue
		}
		if n > 0 {
			b.WriteString(", ")
		}
		n++
		fmt.Fprintf(&b, "%s (%s free)", disks[di].Name, FormatBytes(max(disks[di].Free, 0)))
	}
	return b.String()
}

// FormatBytes renders a byte count the way Kubernetes quantities read:
// "10Gi", "1.5Gi", "512Mi", "4096".
func FormatBytes(n int64) string {
	units := []struct {
		suffix string
		size   int64
	}{{"Ti", 1 << 40}, {"Gi", 1 << 30}, {"Mi", 1 << 20}, {"Ki", 1 << 10}}
	for _, u := range units {
		if n < u.size {
			continue
		}
		if n%u.size == 0 {
			return strconv.FormatInt(n/u.size, 10) + u.suffix
		}
		return strconv.FormatFloat(float64(n)/float64(u.size), 'f', 1, 64) + u.suffix
	}
	return strconv.FormatInt(n, 10)
}

// anyAllows reports whether some claim may be placed on d.
func anyAllows(claims []Claim, d *Disk) bool {
	for ci := range claims {
		if claims[ci].allows(d) {
			return true
		}
	}
	return false
}
