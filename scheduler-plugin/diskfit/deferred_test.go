package diskfit

import (
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/volumebinding"

	"github.com/diskfit/diskfit/apis/diskfit"
)

// assumedVolumes records what VolumeBinding's AssumePodVolumes is given:
// how many claims it binds to existing PVs, and which it provisions.
type assumedVolumes struct {
	volumebinding.SchedulerVolumeBinder
	static      int
	provisioned []string
}

func (a *assumedVolumes) AssumePodVolumes(logger klog.Logger, pod *v1.Pod, nodeName string, pv *volumebinding.PodVolumes) (bool, error) {
	a.static += len(pv.StaticBindings)
	for _, dp := range pv.DynamicProvisions {
		a.provisioned = append(a.provisioned, dp.PVC.Name)
	}
	slices.Sort(a.provisioned)
	return a.SchedulerVolumeBinder.AssumePodVolumes(logger, pod, nodeName, pv)
}

// staticPV is a PV of class on node, bound to claim when claim is set.
func staticPV(name, class, node, claim string, phase v1.PersistentVolumePhase) *v1.PersistentVolume {
	pv := &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1.PersistentVolumeSpec{
			StorageClassName: class,
			AccessModes:      []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			Capacity:         v1.ResourceList{v1.ResourceStorage: *resource.NewQuantity(5*gi, resource.BinarySI)},
			PersistentVolumeSource: v1.PersistentVolumeSource{
				Local: &v1.LocalVolumeSource{Path: "/mnt/" + name},
			},
			NodeAffinity: &v1.VolumeNodeAffinity{Required: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
				MatchExpressions: []v1.NodeSelectorRequirement{{Key: v1.LabelHostname, Operator: v1.NodeSelectorOpIn, Values: []string{node}}},
			}}}},
		},
		Status: v1.PersistentVolumeStatus{Phase: phase},
	}
	if claim != "" {
		pv.Spec.ClaimRef = &v1.ObjectReference{Namespace: "ns", Name: claim}
	}
	return pv
}

// TestDeferredVolumeBindingDecidesAsVolumeBinding: for the pods whose
// claims VolumeBinding's Filter would answer alike on every node, DiskFit
// leaves it out of Filter and runs it in Reserve for the chosen node
// (deferred.go). Whether it does or not, every node's verdict is the one of
// DiskFit's disk check and VolumeBinding together, and VolumeBinding
// assumes the same bindings on the reserved node as on its own.
func TestDeferredVolumeBindingDecidesAsVolumeBinding(t *testing.T) {
	wffc := storagev1.VolumeBindingWaitForFirstConsumer
	zoned := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "diskfit-zoned"}, Provisioner: diskfit.DriverName, VolumeBindingMode: &wffc,
		AllowedTopologies: []v1.TopologySelectorTerm{{MatchLabelExpressions: []v1.TopologySelectorLabelRequirement{{Key: diskfit.TopologyKey, Values: []string{"n1"}}}}}}
	boundOther := makePVC("bound", otherClass, gi).PersistentVolumeClaim
	boundOther.Spec.VolumeName = "pv-bound"
	boundOther.Status.Phase = v1.ClaimBound
	boundOther.Annotations = map[string]string{"pv.kubernetes.io/bind-completed": "yes"}
	boundOtherPV := staticPV("pv-bound", otherClass, "n1", "bound", v1.VolumeBound)
	boundOtherPV.Spec.ClaimRef.UID = boundOther.UID

	for _, tc := range []struct {
		name     string
		objs     []runtime.Object
		claims   []string
		deferred bool
	}{{
		name:     "one claim, no PVs",
		objs:     []runtime.Object{makePVC("a", diskfitClass, 2*gi).PersistentVolumeClaim},
		claims:   []string{"a"},
		deferred: true,
	}, {
		name: "claims of two diskfit classes",
		objs: []runtime.Object{makePVC("a", diskfitClass, 2*gi).PersistentVolumeClaim,
			makePVC("b", ssdClass, 3*gi).PersistentVolumeClaim},
		claims:   []string{"a", "b"},
		deferred: true,
	}, {
		name: "PVs of the class bound to other claims, released, or of another class",
		objs: []runtime.Object{makePVC("a", diskfitClass, 2*gi).PersistentVolumeClaim,
			staticPV("pv-taken", diskfitClass, "n1", "someone-else", v1.VolumeBound),
			staticPV("pv-released", diskfitClass, "n2", "gone", v1.VolumeReleased),
			staticPV("pv-other", otherClass, "n1", "", v1.VolumeAvailable)},
		claims:   []string{"a"},
		deferred: true,
	}, {
		name: "an available PV of the class on one node",
		objs: []runtime.Object{makePVC("a", diskfitClass, 2*gi).PersistentVolumeClaim,
			staticPV("pv-free", diskfitClass, "n2", "", v1.VolumeAvailable)},
		claims: []string{"a"},
	}, {
		name: "a PV pre-bound to the claim",
		objs: []runtime.Object{makePVC("a", diskfitClass, 2*gi).PersistentVolumeClaim,
			staticPV("pv-pre", diskfitClass, "n1", "a", v1.VolumeAvailable)},
		claims: []string{"a"},
	}, {
		name: "beside a claim of another provisioner",
		objs: []runtime.Object{makePVC("a", diskfitClass, 2*gi).PersistentVolumeClaim,
			makePVC("o", otherClass, gi).PersistentVolumeClaim},
		claims: []string{"a", "o"},
	}, {
		name:   "beside a bound claim",
		objs:   []runtime.Object{makePVC("a", diskfitClass, 2*gi).PersistentVolumeClaim, boundOther, boundOtherPV},
		claims: []string{"a", "bound"},
	}, {
		name:   "a class with allowed topologies",
		objs:   []runtime.Object{zoned, makePVC("a", zoned.Name, 2*gi).PersistentVolumeClaim},
		claims: []string{"a"},
	}, {
		name:   "a claim with a selected node",
		objs:   []runtime.Object{makePVC("a", diskfitClass, 2*gi).annotate(diskfit.SelectedNodeAnnotation, "n2").PersistentVolumeClaim},
		claims: []string{"a"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			objs := append(slices.Clone(tc.objs), node("n1"), node("n2"), node("n3"))
			// n2 has no ssd disk, n3 no DiskNode: DiskFit rejects both for
			// some pods, whatever VolumeBinding says.
			env := newTestEnv(t, nil, objs,
				diskNode("n1", freeDisk("d0", 10*gi), diskSpec{name: "s0", class: "ssd", capacity: 10 * gi, free: 10 * gi}),
				diskNode("n2", freeDisk("d0", 10*gi)))
			vbPlugin, err := volumebinding.New(env.ctx, &schedconfig.VolumeBindingArgs{BindTimeoutSeconds: 600}, env.handle, feature.Features{})
			if err != nil {
				t.Fatal(err)
			}
			vb := vbPlugin.(*volumebinding.VolumeBinding)
			pod := makePod("p", tc.claims...)
			nodes := nodeInfos("n1", "n2", "n3")

			dfState, vbState := framework.NewCycleState(), framework.NewCycleState()
			_, dfStatus := env.pl.PreFilter(env.ctx, dfState, pod, nodes)
			_, vbStatus := vb.PreFilter(env.ctx, vbState, pod, nodes)
			if !dfStatus.IsSuccess() || !vbStatus.IsSuccess() {
				t.Fatalf("PreFilter: DiskFit %v, VolumeBinding %v", dfStatus, vbStatus)
			}
			s, err := readState(dfState)
			if err != nil {
				t.Fatal(err)
			}
			if s.deferVolumeBinding != tc.deferred {
				t.Errorf("VolumeBinding's Filter deferred: %v, want %v", s.deferVolumeBinding, tc.deferred)
			}

			reserveOn := ""
			for _, ni := range nodes {
				name := ni.Node().Name
				disksFit, _, _ := env.pl.filterDisks(env.ctx, s.claims, name)
				want := disksFit.IsSuccess() && vb.Filter(env.ctx, vbState, pod, ni).IsSuccess()
				got := env.pl.Filter(env.ctx, dfState, pod, ni)
				if got.IsSuccess() != want {
					t.Errorf("Filter on %s: %v, want success %v (disk check %v, VolumeBinding's Filter)", name, got, want, disksFit)
				}
				if want && reserveOn == "" {
					reserveOn = name
				}
			}
			if reserveOn == "" {
				t.Fatal("no node fits; every case needs one")
			}

			dfBinder := env.pl.vb.Binder.(*diskBinder)
			dfAssumed := &assumedVolumes{SchedulerVolumeBinder: dfBinder.SchedulerVolumeBinder}
			dfBinder.SchedulerVolumeBinder = dfAssumed
			vbAssumed := &assumedVolumes{SchedulerVolumeBinder: vb.Binder}
			vb.Binder = vbAssumed
			if status := env.pl.Reserve(env.ctx, dfState, pod, reserveOn); !status.IsSuccess() {
				t.Fatalf("DiskFit Reserve on %s: %v", reserveOn, status)
			}
			if status := vb.Reserve(env.ctx, vbState, pod, reserveOn); !status.IsSuccess() {
				t.Fatalf("VolumeBinding Reserve on %s: %v", reserveOn, status)
			}
			if dfAssumed.static != vbAssumed.static || !slices.Equal(dfAssumed.provisioned, vbAssumed.provisioned) {
				t.Errorf("assumed on %s: DiskFit %d static bindings, provisions %v; VolumeBinding %d, %v",
					reserveOn, dfAssumed.static, dfAssumed.provisioned, vbAssumed.static, vbAssumed.provisioned)
			}
			if dfAssumed.static+len(dfAssumed.provisioned) == 0 {
				t.Error("nothing assumed: PreBind would bind nothing")
			}
		})
	}
}
