package ledger

import (
	"math"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/diskfit/diskfit/apis/diskfit"
)

// FuzzPVCLocation checks PVCLocation and ClaimSize on arbitrary
// annotations and requests: never a panic, a location only for an unbound
// PVC with a node and a well-formed disk name, and never fewer bytes booked
// than requested.
func FuzzPVCLocation(f *testing.F) {
	f.Add("node-a", "nvme0", true, true, "", int64(10), int8(9), false)
	f.Add("node-a", "nvme0", true, true, "pv-1", int64(1<<20), int8(0), true)
	f.Add("", "nvme0", false, true, "", int64(1), int8(0), false)
	f.Add("node-a", "", true, true, "", int64(0), int8(0), false)
	f.Add("node-a", "../../x", true, true, "", int64(1), int8(9), false)
	f.Add("node-a", "NVMe0", true, true, "", int64(1), int8(9), false)
	f.Add("node-a", "a..b", true, true, "", int64(1), int8(9), true)
	f.Add("node-a", "nvme0", true, true, "", int64(math.MaxInt64), int8(0), false)
	f.Add("node-a", "nvme0", true, true, "", int64(1), int8(100), false)
	f.Add("node-a", "nvme0", true, true, "", int64(5), int8(-3), true)
	// The request is mantissa×10^scale: parsing arbitrary quantity strings
	// would mostly fuzz apimachinery (ParseQuantity("1e-999999999") does
	// not return), and PVCs reach the scheduler already parsed.
	f.Fuzz(func(t *testing.T, node, disk string, hasNode, hasDisk bool, volumeName string, mantissa int64, scale int8, block bool) {
		c := pvc("uid-1", 0, "", "")
		if hasNode {
			c.Annotations[diskfit.SelectedNodeAnnotation] = node
		}
		if hasDisk {
			c.Annotations[diskfit.SelectedDiskAnnotation] = disk
		}
		c.Spec.VolumeName = volumeName
		if block {
			mode := v1.PersistentVolumeBlock
			c.Spec.VolumeMode = &mode
		}
		q := *resource.NewScaledQuantity(mantissa, resource.Scale(scale))
		c.Spec.Resources.Requests[v1.ResourceStorage] = q
		loc, ok := diskfit.PVCLocation(c)
		if ok {
			if volumeName != "" || !hasNode || node == "" || !hasDisk {
				t.Fatalf("PVCLocation placed %+v: node %q (%v), disk %q (%v), volume %q", loc, node, hasNode, disk, hasDisk, volumeName)
			}
			if loc.Node != node || loc.Disk != disk {
				t.Fatalf("PVCLocation = %+v, want %s/%s", loc, node, disk)
			}
			if err := diskfit.ValidateDiskName(loc.Disk); err != nil {
				t.Fatalf("PVCLocation accepted a malformed disk name: %v", err)
			}
		} else if loc != (diskfit.Location{}) {
			t.Fatalf("PVCLocation returned %+v with false", loc)
		}
		size := ClaimSize(c)
		if size <= 0 {
			t.Fatalf("ClaimSize of request %s = %d", q.String(), size)
		}
		if q.Sign() > 0 && size != math.MaxInt64 && q.Cmp(*resource.NewQuantity(size, resource.BinarySI)) > 0 {
			t.Fatalf("ClaimSize of request %s = %d, less than requested", q.String(), size)
		}
		// The ledger takes whatever PVCLocation says without panicking.
		New().SetPVC(c)
	})
}

// FuzzPVLocation checks PVLocation on arbitrary PV sources and node
// affinities: never a panic, a location only for a diskfit PV with a
// well-formed disk name and exactly one node in a topology term.
func FuzzPVLocation(f *testing.F) {
	f.Add(diskfit.DriverName, "nvme0", true, diskfit.TopologyKey, "In", "node-a", 1)
	f.Add("other.csi", "nvme0", true, diskfit.TopologyKey, "In", "node-a", 1)
	f.Add(diskfit.DriverName, "", true, diskfit.TopologyKey, "In", "node-a", 1)
	f.Add(diskfit.DriverName, "nvme0", false, diskfit.TopologyKey, "In", "node-a", 1)
	f.Add(diskfit.DriverName, "nvme0", true, "kubernetes.io/hostname", "In", "node-a", 1)
	f.Add(diskfit.DriverName, "nvme0", true, diskfit.TopologyKey, "NotIn", "node-a", 1)
	f.Add(diskfit.DriverName, "nvme0", true, diskfit.TopologyKey, "In", "node-a", 2)
	f.Add(diskfit.DriverName, "nvme0", true, diskfit.TopologyKey, "In", "", 1)
	f.Add(diskfit.DriverName, "../x", true, diskfit.TopologyKey, "In", "node-a", 1)
	f.Add(diskfit.DriverName, "a..b", true, diskfit.TopologyKey, "In", "node-a", 0)
	f.Fuzz(func(t *testing.T, driver, disk string, csi bool, key, op, node string, values int) {
		p := pv("pv-1", node, disk, 1<<30, "uid-1")
		p.Spec.CSI.Driver = driver
		if !csi {
			p.Spec.CSI = nil
		}
		expr := &p.Spec.NodeAffinity.Required.NodeSelectorTerms[0].MatchExpressions[0]
		expr.Key, expr.Operator = key, v1.NodeSelectorOperator(op)
		switch {
		case values < 0:
			p.Spec.NodeAffinity = nil
		case values == 0:
			expr.Values = nil
		default:
			for i := 1; i < values%4; i++ {
				expr.Values = append(expr.Values, node)
			}
		}
		loc, ok := diskfit.PVLocation(p)
		if !ok {
			if loc != (diskfit.Location{}) {
				t.Fatalf("PVLocation returned %+v with false", loc)
			}
			New().SetPV(p)
			return
		}
		if !csi || driver != diskfit.DriverName || loc.Disk != disk || loc.Node != node || node == "" {
			t.Fatalf("PVLocation = %+v for driver %q (csi %v), disk %q, node %q", loc, driver, csi, disk, node)
		}
		if key != diskfit.TopologyKey || op != string(v1.NodeSelectorOpIn) || len(expr.Values) != 1 {
			t.Fatalf("PVLocation = %+v from %s %s %v", loc, key, op, expr.Values)
		}
		if err := diskfit.ValidateDiskName(loc.Disk); err != nil {
			t.Fatalf("PVLocation accepted a malformed disk name: %v", err)
		}
		New().SetPV(p)
	})
}
