package main

import (
	"fmt"
	"strconv"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
	"github.com/diskfit/diskfit/scheduler-plugin/apis/config"
	configv1 "github.com/diskfit/diskfit/scheduler-plugin/apis/config/v1"
	"github.com/diskfit/diskfit/scheduler-plugin/fit"
	"github.com/diskfit/diskfit/scheduler-plugin/ledger"
	"github.com/diskfit/diskfit/scheduler-plugin/packing"
)

// diskFitModel is the DiskFit plugin's decision path without the
// framework around it, on the plugin's own packages: Filter and Score are
// the plugin's fit.Evaluator (filter.go, score.go), Reserve is
// ledger.Reserve (reserve.go). Made volumes reach the ledger as the
// scheduler would learn of them: a PV on the disk and a DiskNode update
// from the node plugin.
type diskFitModel struct {
	l  *ledger.Ledger
	ev *fit.Evaluator
	// halveScore averages the disk score with a VolumeBinding score of 0,
	// as the plugin's Score does when VolumeBinding's PreScore asks to
	// score (StorageCapacityScoring on, the default since 1.37) while it
	// is blind to diskfit capacity, so it scores diskfit claims 0.
	halveScore bool
	in         *Input
	diskNodes  []*v1alpha1.DiskNode
	version    uint64
	buf        fit.Buffers
}

// diskFitArgs are a DiskFit plugin's default args; strategy overrides the
// scoring strategy when not empty. The DiskNodes of a simulation are always
// current, so no age limit applies.
func diskFitArgs(strategy config.ScoringStrategyType) *config.DiskFitArgs {
	args := configv1.DefaultArgs()
	if strategy != "" {
		args.ScoringStrategy.Type = strategy
	}
	args.MaxDiskNodeAge.Duration = 0
	return args
}

func newDiskFitModel(in *Input, args *config.DiskFitArgs) *diskFitModel {
	m := &diskFitModel{l: ledger.New(), in: in, diskNodes: make([]*v1alpha1.DiskNode, len(in.Nodes))}
	m.ev = fit.New(m.l, args, nil)
	for i, n := range in.Nodes {
		dn := &v1alpha1.DiskNode{ObjectMeta: metav1.ObjectMeta{Name: n.Name}}
		for _, d := range n.Disks {
			dn.Status.Disks = append(dn.Status.Disks, v1alpha1.DiskStatus{
				Name:          d.Name,
				Backend:       v1alpha1.BackendFile,
				DeviceClass:   d.DeviceClass,
				CapacityBytes: d.Capacity,
				FreeBytes:     d.Free,
				Healthy:       true,
			})
		}
		m.diskNodes[i] = dn
		m.publish(i)
	}
	return m
}

// publish hands node i's DiskNode to the ledger with a newer
// resourceVersion, as an informer update would.
func (m *diskFitModel) publish(i int) {
	m.version++
	m.diskNodes[i].ResourceVersion = strconv.FormatUint(m.version, 10)
	m.l.SetDiskNode(m.diskNodes[i])
}

func (m *diskFitModel) filter(n int, claims []packing.Claim) bool {
	return m.ev.Evaluate(m.in.Nodes[n].Name, claims, &m.buf).Reason == fit.Fits
}

func (m *diskFitModel) score(n int, claims []packing.Claim) int64 {
	score := fwk.MinScore + m.ev.Score(m.ev.Evaluate(m.in.Nodes[n].Name, claims, &m.buf), claims)
	if m.halveScore {
		score /= 2
	}
	return score
}

func (m *diskFitModel) reserve(pod *Pod, n int, claims []packing.Claim) []int {
	names, err := m.l.Reserve(types.UID(pod.Name), m.in.Nodes[n].Name, claims, m.ev.Options)
	if err != nil {
		// Filter passed on the same ledger a moment ago; a failure here
		// is a bug the run must not hide.
		panic(fmt.Sprintf("ledger.Reserve after a passing Filter: %v", err))
	}
	chosen := make([]int, len(names))
	for i, name := range names {
		chosen[i] = diskIndex(m.in.Nodes[n].Disks, name)
	}
	return chosen
}

func diskIndex(disks []packing.Disk, name string) int {
	for j := range disks {
		if disks[j].Name == name {
			return j
		}
	}
	panic("unknown disk " + name)
}

func (m *diskFitModel) unreserve(pod *Pod) { m.l.Unreserve(types.UID(pod.Name)) }

func (m *diskFitModel) provisioned(n, d int, c *packing.Claim) {
	node, disk := m.in.Nodes[n].Name, m.in.Nodes[n].Disks[d].Name
	m.l.SetPV(&v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "pv-" + c.Key},
		Spec: v1.PersistentVolumeSpec{
			Capacity: v1.ResourceList{v1.ResourceStorage: *resource.NewQuantity(c.Size, resource.BinarySI)},
			PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{
				Driver:           diskfit.DriverName,
				VolumeHandle:     disk + "/" + c.Key,
				VolumeAttributes: map[string]string{diskfit.VolumeContextDiskKey: disk},
			}},
			ClaimRef: &v1.ObjectReference{Namespace: "default", Name: c.Key, UID: types.UID(c.Key)},
			NodeAffinity: &v1.VolumeNodeAffinity{Required: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
				MatchExpressions: []v1.NodeSelectorRequirement{{Key: diskfit.TopologyKey, Operator: v1.NodeSelectorOpIn, Values: []string{node}}},
			}}}},
		},
	})
	m.diskNodes[n].Status.Disks[d].FreeBytes -= c.Size
	m.publish(n)
}

func (m *diskFitModel) deleted(n, d int, c *packing.Claim) {
	m.l.DeletePV("pv-" + c.Key)
	m.diskNodes[n].Status.Disks[d].FreeBytes += c.Size
	m.publish(n)
}

// capacityModel is a scheduler that knows one or two numbers per node,
// always current (the most generous assumption: a real
// CSIStorageCapacity is up to a poll interval old), and leaves the disk
// to the driver.
//
// With joint false it is kube-scheduler's VolumeBinding with storage
// capacity tracking: every claim is checked on its own against
// maximumVolumeSize (binder.go hasEnoughCapacity via volumeLimit, which
// prefers maximumVolumeSize over capacity). With joint true it is a
// TopoLVM-style node capacity: the sum of the pod's claims against the
// sum of the node's free space.
//
// Both score as VolumeBinding does with StorageCapacityScoring (beta, on
// by default since 1.37) and its default shape {0%: 10, 100%: 0}: 100
// minus the percentage of the node's capacity the pod's claims request
// (scorer.go, one storage class), so emptier nodes win. Other score
// plugins are taken to rate every node alike: the simulated pods request
// no CPU or memory and carry no affinity.
type capacityModel struct {
	c     *cluster
	joint bool
	// unscored leaves every node the same score, as VolumeBinding does for
	// dynamic provisioning without StorageCapacityScoring (off by default
	// before 1.37): the choice is random.
	unscored bool
}

func (m *capacityModel) filter(n int, claims []packing.Claim) bool {
	if m.joint {
		// One sum per device class (TopoLVM's device classes).
		for i, c := range claims {
			if classSeen(claims[:i], c.DeviceClass) {
				continue
			}
			var sum int64
			for _, o := range claims[i:] {
				if o.DeviceClass == c.DeviceClass {
					sum += o.Size
				}
			}
			if total, _ := m.c.capacity(n, c.DeviceClass); sum > total {
				return false
			}
		}
		return true
	}
	for _, c := range claims {
		if _, largest := m.c.capacity(n, c.DeviceClass); c.Size > largest {
			return false
		}
	}
	return true
}

// classSeen reports whether a claim of claims has the device class.
func classSeen(claims []packing.Claim, class string) bool {
	for _, c := range claims {
		if c.DeviceClass == class {
			return true
		}
	}
	return false
}

// score takes the pod's requested bytes over the capacity of the
// StorageClasses (device classes) it requests; with one class, as in the
// churn-free runs, this is VolumeBinding's score exactly.
func (m *capacityModel) score(n int, claims []packing.Claim) int64 {
	if m.unscored {
		return 0
	}
	var requested, total int64
	for i, c := range claims {
		requested += c.Size
		if !classSeen(claims[:i], c.DeviceClass) {
			t, _ := m.c.capacity(n, c.DeviceClass)
			total += t
		}
	}
	return volumeBindingScore(requested, total)
}

// volumeBindingScore is VolumeBinding's capacity score with the default
// shape, scaled to the framework's range as VolumeBinding's New scales it.
func volumeBindingScore(requested, capacity int64) int64 {
	const maxUtilization = 100
	if capacity == 0 || requested > capacity {
		return 0
	}
	// Bytes times 100 stay far below 2^63 for any real disk.
	util := requested * maxUtilization / capacity
	return fwk.MaxScore - util*fwk.MaxScore/maxUtilization
}

func (m *capacityModel) reserve(*Pod, int, []packing.Claim) []int { return nil }
func (m *capacityModel) unreserve(*Pod)                           {}
func (m *capacityModel) provisioned(int, int, *packing.Claim)     {}
func (m *capacityModel) deleted(int, int, *packing.Claim)         {}
