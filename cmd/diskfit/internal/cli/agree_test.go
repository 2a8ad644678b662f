package cli

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	"k8s.io/utils/ptr"

	dffake "github.com/diskfit/diskfit/apis/client/clientset/versioned/fake"
	"github.com/diskfit/diskfit/scheduler-plugin/apis/config"
	configv1 "github.com/diskfit/diskfit/scheduler-plugin/apis/config/v1"
	plugin "github.com/diskfit/diskfit/scheduler-plugin/diskfit"
)

// agreementCase is one pod's claims on one cluster, with the scheduler's
// args.
type agreementCase struct {
	name      string
	diskNodes []runtime.Object
	// claims are "name size storageClass" of one pod, in namespace shop.
	claims []string
	args   func(*config.DiskFitArgs)
}

// agreementCases are the cases diskfit simulate and the DiskFit plugin
// must answer alike. node-a has a large NVMe and a small SSD disk, node-b
// two SSD disks (disks()).
func agreementCases() []agreementCase {
	// node-c's driver has never reported: only its disk could hold 11Gi.
	never := diskNode("node-c", -1, disk("ssd0", "ssd", 12*gi, 12*gi, 0))
	return []agreementCase{
		{name: "fits on both, MostAllocated", diskNodes: disks(), claims: []string{"data 3Gi diskfit"}},
		{name: "fits on both, LeastAllocated", diskNodes: disks(), claims: []string{"data 3Gi diskfit", "log 1Gi diskfit"},
			args: func(a *config.DiskFitArgs) { a.ScoringStrategy.Type = config.LeastAllocated }},
		{name: "fits nowhere", diskNodes: disks(), claims: []string{"data 11Gi diskfit"}},
		{name: "two claims that fit nowhere together", diskNodes: disks(), claims: []string{"data 6Gi diskfit", "log 5Gi diskfit"}},
		{name: "device class", diskNodes: disks(), claims: []string{"data 5Gi diskfit-ssd"}},
		{name: "missing DiskNode", diskNodes: disks()[:1], claims: []string{"data 1Gi diskfit"}},
		{name: "stale DiskNode", diskNodes: objects(disks()[:1], []runtime.Object{
			diskNode("node-b", 10*time.Minute, disk("ssd0", "ssd", 6*gi, 6*gi, 0))}), claims: []string{"data 1Gi diskfit"}},
		{name: "DiskNode never refreshed", diskNodes: objects(disks(), []runtime.Object{never}), claims: []string{"data 11Gi diskfit"}},
		{name: "staleness check off", diskNodes: objects(disks(), []runtime.Object{never}), claims: []string{"data 11Gi diskfit"},
			args: func(a *config.DiskFitArgs) { a.MaxDiskNodeAge = metav1.Duration{} }},
		{name: "device class weights", claims: []string{"fast 1Gi diskfit-nvme", "slow 1Gi diskfit-ssd"},
			diskNodes: []runtime.Object{
				// node-a's NVMe disk is nearly full, node-b's SSD disk: a
				// heavy NVMe weight makes node-a the better fit.
				diskNode("node-a", time.Second, disk("nvme0", "nvme", 10*gi, 2*gi, 0), disk("ssd0", "ssd", 10*gi, 10*gi, 0)),
				diskNode("node-b", time.Second, disk("nvme0", "nvme", 10*gi, 10*gi, 0), disk("ssd0", "ssd", 10*gi, 3*gi/2, 0)),
			},
			args: func(a *config.DiskFitArgs) {
				a.ScoringStrategy.DeviceClassWeights = []config.DeviceClassWeight{{DeviceClass: "nvme", Weight: 100}}
			}},
	}
}

// TestSimulateAgreesWithThePlugin checks that diskfit simulate says what
// diskfit-scheduler would do: for one replica, on every case, the node it
// picks is the one the plugin's Score rates highest among the nodes its
// Filter passes (ties: the first by name), with the disks the plugin's
// Reserve picks there; and when no node fits, it gives every node the
// plugin's own reason.
func TestSimulateAgreesWithThePlugin(t *testing.T) {
	for _, tc := range agreementCases() {
		t.Run(tc.name, func(t *testing.T) {
			args := configv1.DefaultArgs()
			if tc.args != nil {
				tc.args(args)
			}
			var pvcs []*corev1.PersistentVolumeClaim
			kubeObjs := objects(waitForFirstConsumer(classes()), []runtime.Object{
				readyNode("node-a", nil), readyNode("node-b", nil), readyNode("node-c", nil)})
			w := &workload{kind: "PersistentVolumeClaim", namespace: "shop", replicas: []replica{{name: "replica-0"}}}
			for _, c := range tc.claims {
				f := strings.Fields(c)
				pvc := &corev1.PersistentVolumeClaim{
					ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: f[0], UID: types.UID(f[0] + "-uid")},
					Spec: corev1.PersistentVolumeClaimSpec{
						StorageClassName: ptr.To(f[2]),
						AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
						Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(f[1])}},
					},
				}
				pvcs = append(pvcs, pvc)
				w.replicas[0].claims = append(w.replicas[0].claims, workloadClaim{template: pvc.Name, pvc: pvc.DeepCopy()})
			}
			nodes := []string{"node-a", "node-b", "node-c"}

			// What the plugin says, node by node.
			wantNode, wantScore := "", int64(-1)
			wantReasons := map[string]string{}
			pl, pod, state := pluginCycle(t, args, objects(kubeObjs, pvcsAsObjects(pvcs)), tc.diskNodes)
			ctx := context.Background()
			for _, n := range nodes {
				ni := framework.NewNodeInfo()
				ni.SetNode(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}})
				if status := pl.Filter(ctx, state, pod, ni); !status.IsSuccess() {
					// The plugin names a claim namespace/name, simulate
					// by its name in the workload.
					wantReasons[n] = strings.ReplaceAll(strings.TrimPrefix(status.Message(), "node "+n+": "), "shop/", "")
					continue
				}
				score, status := pl.Score(ctx, state, pod, ni)
				if !status.IsSuccess() {
					t.Fatalf("Score %s: %v", n, status)
				}
				if score > wantScore {
					wantNode, wantScore = n, score
				}
			}
			wantDisks := map[string]string{}
			if wantNode != "" {
				if status := pl.Reserve(ctx, state, pod, wantNode); !status.IsSuccess() {
					t.Fatalf("Reserve %s: %v", wantNode, status)
				}
				for _, pvc := range pvcs {
					disk, _ := pl.Ledger().ReservedDisk(pod.UID, wantNode, string(pvc.UID))
					wantDisks[pvc.Name] = disk
				}
			}

			// What simulate says.
			c := &Clients{Kube: kubefake.NewClientset(kubeObjs...), DiskFit: dffake.NewSimpleClientset(tc.diskNodes...), Namespace: "shop"}
			report, err := simulate(ctx, c, w, args, testNow)
			if err != nil {
				t.Fatal(err)
			}
			got := report.Replicas[0]
			if got.Node != wantNode {
				t.Errorf("simulate picks node %q, the plugin %q", got.Node, wantNode)
			}
			for _, claim := range got.Claims {
				if claim.Disk != wantDisks[claim.Name] {
					t.Errorf("simulate puts claim %s on disk %q, the plugin on %q", claim.Name, claim.Disk, wantDisks[claim.Name])
				}
			}
			if wantNode == "" {
				gotReasons := map[string]string{}
				for _, r := range got.Rejections {
					gotReasons[r.Node] = r.Reason
				}
				for _, n := range nodes {
					if gotReasons[n] != wantReasons[n] {
						t.Errorf("node %s: simulate says %q, the plugin %q", n, gotReasons[n], wantReasons[n])
					}
				}
			}
		})
	}
}

// waitForFirstConsumer sets the binding mode of the classes to
// WaitForFirstConsumer, as diskfit's classes have it.
func waitForFirstConsumer(classes []runtime.Object) []runtime.Object {
	for _, o := range classes {
		if sc, ok := o.(*storagev1.StorageClass); ok {
			sc.VolumeBindingMode = ptr.To(storagev1.VolumeBindingWaitForFirstConsumer)
		}
	}
	return classes
}

func pvcsAsObjects(pvcs []*corev1.PersistentVolumeClaim) []runtime.Object {
	out := make([]runtime.Object, len(pvcs))
	for i, p := range pvcs {
		out[i] = p
	}
	return out
}

// pluginCycle builds the DiskFit plugin with args on fake clientsets
// holding kubeObjs and diskNodes, runs PreFilter for a pod using every PVC
// among kubeObjs, and returns the plugin, the pod and the cycle state.
func pluginCycle(t *testing.T, args *config.DiskFitArgs, kubeObjs, diskNodes []runtime.Object) (*plugin.DiskFit, *corev1.Pod, fwk.CycleState) {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	client := kubefake.NewClientset(kubeObjs...)
	factory := informers.NewSharedInformerFactory(client, 0)
	fh, err := frameworkruntime.NewFramework(ctx, nil, nil,
		frameworkruntime.WithClientSet(client),
		frameworkruntime.WithInformerFactory(factory),
		frameworkruntime.WithPodActivator(noQueue{}))
	if err != nil {
		t.Fatal(err)
	}
	pl, err := plugin.NewWithOptions(ctx, args, fh, plugin.Options{
		Features:       &feature.Features{},
		DiskNodeClient: dffake.NewSimpleClientset(diskNodes...),
		Now:            func() time.Time { return testNow },
	})
	if err != nil {
		t.Fatal(err)
	}
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "replica-0", UID: "replica-0-uid"}}
	for _, o := range kubeObjs {
		if pvc, ok := o.(*corev1.PersistentVolumeClaim); ok {
			pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: pvc.Name, VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: pvc.Name}}})
		}
	}
	// The ledger's handlers see the informers' lists before the cycle.
	if !cache.WaitForCacheSync(ctx.Done(), func() bool {
		_, err := factory.Core().V1().PersistentVolumeClaims().Lister().PersistentVolumeClaims("shop").Get(pod.Spec.Volumes[0].Name)
		return err == nil
	}) {
		t.Fatal("PVC informer did not sync")
	}
	state := framework.NewCycleState()
	if _, status := pl.PreFilter(ctx, state, pod, nil); !status.IsSuccess() {
		t.Fatalf("PreFilter: %v", status)
	}
	return pl, pod, state
}

// noQueue is the pod activator of a framework without a scheduling queue.
type noQueue struct{}

func (noQueue) Activate(klog.Logger, map[string]*corev1.Pod) {}

// TestSimulateUsesTheSchedulersArgs checks that diskfit simulate --config
// places with the DiskFit args of diskfit-scheduler's configuration file:
// its device-class weights change the node a replica goes to, as they
// change the plugin's choice (TestSimulateAgreesWithThePlugin), and the
// shipped file is read as the scheduler reads it.
func TestSimulateUsesTheSchedulersArgs(t *testing.T) {
	var weights agreementCase
	for _, tc := range agreementCases() {
		if tc.name == "device class weights" {
			weights = tc
		}
	}
	claims := `apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: fast}
spec:
  storageClassName: diskfit-nvme
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: slow}
spec:
  storageClassName: diskfit-ssd
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
`
	weighted := writeFile(t, "weighted.yaml", `apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
  - schedulerName: default-scheduler
  - schedulerName: diskfit-scheduler
    pluginConfig:
      - name: DiskFit
        args:
          scoringStrategy:
            type: MostAllocated
            deviceClassWeights: [{deviceClass: nvme, weight: 100}]
`)
	kubeObjs := objects(classes(), []runtime.Object{readyNode("node-a", nil), readyNode("node-b", nil)})
	for _, tc := range []struct {
		flags    []string
		wantNode string
		wantErr  string
	}{
		{nil, "node-b", ""},
		{[]string{"--config", weighted}, "node-a", ""},
		{[]string{"--config", "../../../../manifests/scheduler/diskfit-scheduler-config.yaml"}, "node-b", ""},
		{[]string{"--config", writeFile(t, "other.yaml", "profiles: [{schedulerName: default-scheduler}]\n")}, "",
			"has no profile with schedulerName diskfit-scheduler"},
	} {
		args := append([]string{"simulate", "-f", "-", "-o", "json"}, tc.flags...)
		out, _, err := runCommandWithInput(t, claims, "shop", kubeObjs, weights.diskNodes, args...)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%v: error %v, want %q", tc.flags, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%v: %v", tc.flags, err)
		}
		var report SimulateReport
		if err := json.Unmarshal([]byte(out), &report); err != nil {
			t.Fatal(err)
		}
		if got := report.Replicas[0].Node; got != tc.wantNode {
			t.Errorf("%v: replica placed on %q, want %q", tc.flags, got, tc.wantNode)
		}
	}
}
