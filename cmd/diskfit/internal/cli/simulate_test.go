package cli

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"sigs.k8s.io/yaml"

	"github.com/diskfit/diskfit/apis/diskfit"
)

func readyNode(name string, labels map[string]string) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
			{Type: corev1.NodeReady, Status: corev1.ConditionTrue},
		}},
	}
}

func diskfitClass(name, deviceClass string) *storagev1.StorageClass {
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: diskfit.DriverName}
	if deviceClass != "" {
		sc.Parameters = map[string]string{diskfit.DeviceClassParameter: deviceClass}
	}
	return sc
}

// classes are the shipped StorageClasses and a default class of another
// provisioner, as many clusters have.
func classes() []runtime.Object {
	standard := &storagev1.StorageClass{
		ObjectMeta:  metav1.ObjectMeta{Name: "standard", Annotations: map[string]string{diskfit.IsDefaultClassAnnotation: "true"}},
		Provisioner: "rancher.io/local-path",
	}
	return []runtime.Object{diskfitClass("diskfit", ""), diskfitClass("diskfit-ssd", "ssd"), diskfitClass("diskfit-nvme", "nvme"), standard}
}

// diskfitPV is a diskfit volume of size on node's disk, bound to claim
// (namespace shop) when claim is not empty.
func diskfitPV(name, node, disk string, size int64, claim string) *corev1.PersistentVolume {
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity: corev1.ResourceList{corev1.ResourceStorage: *resource.NewQuantity(size, resource.BinarySI)},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: diskfit.DriverName, VolumeHandle: disk + ":" + name,
				VolumeAttributes: map[string]string{diskfit.VolumeContextDiskKey: disk},
			}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: diskfit.TopologyKey, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
			}}}},
		},
	}
	if claim != "" {
		pv.Spec.ClaimRef = &corev1.ObjectReference{Namespace: "shop", Name: claim, UID: types.UID(claim + "-uid")}
	}
	return pv
}

// disks: node-a has a large NVMe and a small SSD disk, node-b two SSD
// disks.
func disks() []runtime.Object {
	return []runtime.Object{
		diskNode("node-a", 10*time.Second, disk("nvme0", "nvme", 10*gi, 10*gi, 0), disk("ssd0", "ssd", 4*gi, 4*gi, 0)),
		diskNode("node-b", 10*time.Second, disk("ssd0", "ssd", 6*gi, 6*gi, 0), disk("ssd1", "ssd", 6*gi, 6*gi, 0)),
	}
}

func objects(groups ...[]runtime.Object) []runtime.Object {
	var out []runtime.Object
	for _, g := range groups {
		out = append(out, g...)
	}
	return out
}

const statefulSetYAML = `# A file as kubectl apply takes it: a Service and the StatefulSet.
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: shop
spec:
  clusterIP: None
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: web
  namespace: shop
spec:
  serviceName: web
  replicas: 3
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      schedulerName: diskfit-scheduler
      nodeSelector:
        disks: fast
      containers:
      - name: app
        image: registry.k8s.io/pause:3.10
  volumeClaimTemplates:
  - metadata:
      name: data
    spec:
      storageClassName: diskfit-ssd
      accessModes: [ReadWriteOnce]
      resources:
        requests:
          storage: 2Gi
  - metadata:
      name: log
    spec:
      storageClassName: diskfit
      accessModes: [ReadWriteOnce]
      resources:
        requests:
          storage: 512Mi
`

// statefulSetCluster is the cluster statefulSetYAML meets: only node-b is
// labelled for it, and web-0's data volume already exists on node-b's
// ssd1, whose DiskNode does not show it yet.
func statefulSetCluster() []runtime.Object {
	dataWeb0 := bound(makePVC("data-web-0", "diskfit-ssd", "2Gi", nil), "pv-data-web-0")
	dataWeb0.UID = "data-web-0-uid"
	return objects(classes(), []runtime.Object{
		readyNode("node-a", nil),
		readyNode("node-b", map[string]string{"disks": "fast"}),
		dataWeb0,
		diskfitPV("pv-data-web-0", "node-b", "ssd1", 2*gi, "data-web-0"),
	})
}

// forgedClaims are PVCs annotated by hand with node-a's nvme0, each asking
// for the whole disk or more, whose class does not exist, belongs to another
// provisioner, or is not named.
func forgedClaims() []runtime.Object {
	on := func() map[string]string {
		return map[string]string{diskfit.SelectedNodeAnnotation: "node-a", diskfit.SelectedDiskAnnotation: "nvme0"}
	}
	missing := makePVC("forged-missing", "no-such-class", "10Gi", on())
	other := makePVC("forged-other", "standard", "10Gi", on())
	noClass := makePVC("forged-no-class", "", "8Ei", on())
	noClass.Spec.StorageClassName = nil
	for _, c := range []*corev1.PersistentVolumeClaim{missing, other, noClass} {
		c.UID = types.UID(c.Name + "-uid")
	}
	return []runtime.Object{missing, other, noClass}
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestSimulate(t *testing.T) {
	stsFile := writeFile(t, "web.yaml", statefulSetYAML)
	deployment := writeFile(t, "deploy.yaml", "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\n")
	badSize := writeFile(t, "bad.yaml", strings.Replace(statefulSetYAML, "storage: 2Gi", "storage: lots", 1))
	twoNodes := []runtime.Object{readyNode("node-a", nil), readyNode("node-b", nil)}

	tests := []struct {
		name        string
		namespace   string
		stdin       string
		kubeObjs    []runtime.Object
		diskfitObjs []runtime.Object
		args        []string
		wantOut     string
		wantErrOut  string
		// wantErr is the whole error; wantErrContains a part of it.
		wantErr         string
		wantErrContains string
		wantExit        int
	}{
		{
			name:        "all fit",
			kubeObjs:    objects(classes(), twoNodes),
			diskfitObjs: disks(),
			args:        []string{"simulate", "--claims", "3Gi,1Gi", "--replicas", "3", "--storage-class", "diskfit"},
			// replica-0 fills node-a's ssd0 exactly (the best fit);
			// then node-b's fuller disks score higher than node-a's
			// barely used NVMe.
			wantOut: `claims in namespace default, 3 replica(s), strategy MostAllocated

REPLICA    NODE    CLAIM    CLASS    SIZE  DISK
replica-0  node-a  claim-0  diskfit  3Gi   ssd0
                   claim-1  diskfit  1Gi   ssd0
replica-1  node-b  claim-0  diskfit  3Gi   ssd0
                   claim-1  diskfit  1Gi   ssd0
replica-2  node-b  claim-0  diskfit  3Gi   ssd1
                   claim-1  diskfit  1Gi   ssd0

fits: 3/3 replicas
`,
		},
		{
			name:        "LeastAllocated spreads",
			kubeObjs:    objects(classes(), twoNodes),
			diskfitObjs: disks(),
			args:        []string{"simulate", "--claims", "3Gi,1Gi", "--replicas", "2", "--storage-class", "diskfit", "--strategy", "LeastAllocated"},
			// LeastAllocated scores a node by how empty its disks stay:
			// node-b, with a claim on each disk, wins the first replica,
			// node-a's NVMe the second.
			wantOut: `claims in namespace default, 2 replica(s), strategy LeastAllocated

REPLICA    NODE    CLAIM    CLASS    SIZE  DISK
replica-0  node-b  claim-0  diskfit  3Gi   ssd0
                   claim-1  diskfit  1Gi   ssd1
replica-1  node-a  claim-0  diskfit  3Gi   nvme0
                   claim-1  diskfit  1Gi   nvme0

fits: 2/2 replicas
`,
		},
		{
			name:     "free space on two disks does not add up",
			kubeObjs: objects(classes(), []runtime.Object{readyNode("node-c", nil)}),
			diskfitObjs: []runtime.Object{
				diskNode("node-c", time.Second, disk("d0", "", 2*gi, gi, 1), disk("d1", "", 2*gi, gi, 1)),
			},
			args: []string{"simulate", "--claims", "2Gi", "--storage-class", "diskfit"},
			wantOut: `claims in namespace default, 1 replica(s), strategy MostAllocated

REPLICA    NODE  CLAIM    CLASS    SIZE  DISK
replica-0  -     claim-0  diskfit  2Gi   -

replica-0 does not fit:
  node-c: largest free disk d0 has 1Gi, pod needs 2Gi on one disk (claim claim-0)

fits: 0/1 replicas
`,
			wantErr:  ErrDoesNotFit.Error(),
			wantExit: 1,
		},
		{
			name:        "device class restricts the disks",
			kubeObjs:    objects(classes(), twoNodes),
			diskfitObjs: disks(),
			// node-a's NVMe disk has room, but not for an SSD claim.
			args: []string{"simulate", "--claims", "5Gi", "--replicas", "4", "--storage-class", "diskfit-ssd"},
			wantOut: `claims in namespace default, 4 replica(s), strategy MostAllocated

REPLICA    NODE    CLAIM    CLASS        SIZE  DISK
replica-0  node-b  claim-0  diskfit-ssd  5Gi   ssd0
replica-1  node-b  claim-0  diskfit-ssd  5Gi   ssd1
replica-2  -       claim-0  diskfit-ssd  5Gi   -
replica-3  -       claim-0  diskfit-ssd  5Gi   -

replica-2, replica-3 do not fit:
  node-a: largest free disk of device class "ssd" ssd0 has 4Gi, pod needs 5Gi on one disk (claim claim-0)
  node-b: largest free disk of device class "ssd" ssd0 has 1Gi, pod needs 5Gi on one disk (claim claim-0)

fits: 2/4 replicas
`,
			wantErr:  ErrDoesNotFit.Error(),
			wantExit: 1,
		},
		{
			// Annotations anyone may write book nothing: claims whose
			// class does not exist, is another provisioner's or is not
			// named, each asking for all of node-a's NVMe disk.
			name:        "forged claims book nothing",
			kubeObjs:    objects(classes(), twoNodes, forgedClaims()),
			diskfitObjs: disks(),
			args:        []string{"simulate", "--claims", "3Gi", "--storage-class", "diskfit-nvme"},
			wantOut: `claims in namespace default, 1 replica(s), strategy MostAllocated

REPLICA    NODE    CLAIM    CLASS         SIZE  DISK
replica-0  node-a  claim-0  diskfit-nvme  3Gi   nvme0

fits: 1/1 replicas
`,
		},
		{
			name: "existing volumes and placed claims take space the DiskNode does not show yet",
			kubeObjs: objects(classes(), twoNodes, []runtime.Object{
				diskfitPV("pv-1", "node-a", "nvme0", 6*gi, "old-data"),
				makePVC("placed", "diskfit-nvme", "2Gi", map[string]string{
					diskfit.SelectedNodeAnnotation: "node-a", diskfit.SelectedDiskAnnotation: "nvme0"}),
			}),
			diskfitObjs: disks(),
			args:        []string{"simulate", "--claims", "3Gi", "--storage-class", "diskfit-nvme"},
			wantOut: `claims in namespace default, 1 replica(s), strategy MostAllocated

REPLICA    NODE  CLAIM    CLASS         SIZE  DISK
replica-0  -     claim-0  diskfit-nvme  3Gi   -

replica-0 does not fit:
  node-a: largest free disk of device class "nvme" nvme0 has 2Gi, pod needs 3Gi on one disk (claim claim-0)
  node-b: no healthy disk of device class "nvme" for claim claim-0

fits: 0/1 replicas
`,
			wantErr:  ErrDoesNotFit.Error(),
			wantExit: 1,
		},
		{
			name: "nodes the scheduler would not use are skipped",
			kubeObjs: objects(classes(), []runtime.Object{
				readyNode("node-a", nil),
				func() runtime.Object { n := readyNode("node-b", nil); n.Spec.Unschedulable = true; return n }(),
				func() runtime.Object {
					n := readyNode("node-c", nil)
					n.Status.Conditions[0].Status = corev1.ConditionUnknown
					return n
				}(),
				func() runtime.Object {
					n := readyNode("node-d", nil)
					n.Spec.Taints = []corev1.Taint{{Key: "dedicated", Value: "db", Effect: corev1.TaintEffectNoSchedule}}
					return n
				}(),
				readyNode("node-e", nil),
				readyNode("node-f", nil),
			}),
			diskfitObjs: objects(disks(), []runtime.Object{
				diskNode("node-c", time.Second, disk("ssd0", "ssd", 6*gi, 6*gi, 0)),
				diskNode("node-d", time.Second, disk("ssd0", "ssd", 6*gi, 6*gi, 0)),
				diskNode("node-f", 10*time.Minute, disk("ssd0", "ssd", 6*gi, 6*gi, 0)),
			}),
			args: []string{"simulate", "--claims", "3Gi", "--replicas", "2", "--storage-class", "diskfit-ssd"},
			wantOut: `claims in namespace default, 2 replica(s), strategy MostAllocated

REPLICA    NODE    CLAIM    CLASS        SIZE  DISK
replica-0  node-a  claim-0  diskfit-ssd  3Gi   ssd0
replica-1  -       claim-0  diskfit-ssd  3Gi   -

replica-1 does not fit:
  node-a: largest free disk of device class "ssd" ssd0 has 1Gi, pod needs 3Gi on one disk (claim claim-0)
  node-b: cordoned
  node-c: not Ready
  node-d: untolerated taint dedicated=db:NoSchedule
  node-e: no DiskNode, the diskfit node plugin has not reported this node's disks
  node-f: DiskNode is stale (observed 10m0s ago, maximum 5m0s)

fits: 1/2 replicas
`,
			wantErr:  ErrDoesNotFit.Error(),
			wantExit: 1,
		},
		{
			name:        "StatefulSet file",
			kubeObjs:    statefulSetCluster(),
			diskfitObjs: disks(),
			args:        []string{"simulate", "-f", stsFile, "--replicas", "5"},
			// web-0's data volume ties it to node-b; the last replica's
			// claims each fit a disk alone but not both at once.
			wantOut: `StatefulSet shop/web, 5 replica(s), strategy MostAllocated

REPLICA  NODE    CLAIM       CLASS        SIZE   DISK
web-0    node-b  data-web-0  diskfit-ssd  2Gi    ssd1 (existing)
                 log-web-0   diskfit      512Mi  ssd1
web-1    node-b  data-web-1  diskfit-ssd  2Gi    ssd1
                 log-web-1   diskfit      512Mi  ssd1
web-2    node-b  data-web-2  diskfit-ssd  2Gi    ssd0
                 log-web-2   diskfit      512Mi  ssd1
web-3    node-b  data-web-3  diskfit-ssd  2Gi    ssd0
                 log-web-3   diskfit      512Mi  ssd1
web-4    -       data-web-4  diskfit-ssd  2Gi    -
                 log-web-4   diskfit      512Mi  -

web-4 does not fit:
  node-a: does not match the pod's node selector or affinity
  node-b: claims 2Gi+512Mi do not fit together on disks ssd0 (2Gi free), ssd1 (0 free)

fits: 4/5 replicas
`,
			wantErrOut: "Ignoring Service web: simulate reads StatefulSets and PersistentVolumeClaims.\n",
			wantErr:    ErrDoesNotFit.Error(),
			wantExit:   1,
		},
		{
			name: "existing claims tie a replica to their node",
			kubeObjs: func() []runtime.Object {
				objs := statefulSetCluster()
				for _, o := range objs {
					if n, ok := o.(*corev1.Node); ok && n.Name == "node-b" {
						n.Spec.Unschedulable = true
					}
				}
				// web-1's data claim is placed but not provisioned yet;
				// its log claim exists but was never placed.
				return append(objs,
					makePVC("data-web-1", "diskfit-ssd", "2Gi", map[string]string{
						diskfit.SelectedNodeAnnotation: "node-b", diskfit.SelectedDiskAnnotation: "ssd0"}),
					makePVC("log-web-1", "diskfit", "1Gi", nil))
			}(),
			diskfitObjs: disks(),
			args:        []string{"simulate", "-f", stsFile, "--replicas", "2"},
			wantOut: `StatefulSet shop/web, 2 replica(s), strategy MostAllocated

REPLICA  NODE  CLAIM       CLASS        SIZE   DISK
web-0    -     data-web-0  diskfit-ssd  2Gi    ssd1 (existing)
               log-web-0   diskfit      512Mi  -
web-1    -     data-web-1  diskfit-ssd  2Gi    ssd0 (existing)
               log-web-1   diskfit      1Gi    -

web-0 does not fit:
  node-a: volume node affinity conflict: claim data-web-0 is on node node-b
  node-b: cordoned

web-1 does not fit:
  node-a: volume node affinity conflict: claim data-web-1 is on node node-b
  node-b: cordoned

fits: 0/2 replicas
`,
			wantErrOut: "Ignoring Service web: simulate reads StatefulSets and PersistentVolumeClaims.\n",
			wantErr:    ErrDoesNotFit.Error(),
			wantExit:   1,
		},
		{
			name: "PersistentVolumeClaims from stdin, one of another provisioner",
			stdin: `apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: PersistentVolumeClaim
  metadata: {name: db}
  spec:
    storageClassName: diskfit-nvme
    resources: {requests: {storage: 8Gi}}
- apiVersion: v1
  kind: PersistentVolumeClaim
  metadata: {name: cache}
  spec:
    resources: {requests: {storage: 1Gi}}
`,
			kubeObjs:    objects(classes(), twoNodes),
			diskfitObjs: disks(),
			namespace:   "shop",
			args:        []string{"simulate", "-f", "-"},
			wantOut: `PersistentVolumeClaims in namespace shop, 1 replica(s), strategy MostAllocated

REPLICA    NODE    CLAIM  CLASS         SIZE  DISK
replica-0  node-a  db     diskfit-nvme  8Gi   nvme0
                   cache  standard      1Gi   (not diskfit's)

Not placed by diskfit:
  cache: StorageClass standard is provisioned by rancher.io/local-path, not local.diskfit.io

fits: 1/1 replicas
`,
		},
		{
			name:            "unparseable size",
			kubeObjs:        objects(classes(), twoNodes),
			args:            []string{"simulate", "--claims", "10Gi,2Gx"},
			wantErrContains: `invalid size "2Gx" in --claims: quantities must match the regular expression`,
			wantExit:        2,
		},
		{
			name:            "unparseable size in a file",
			kubeObjs:        objects(classes(), twoNodes),
			args:            []string{"simulate", "-f", badSize},
			wantErrContains: badSize + ", document 2: reading StatefulSet: ",
			wantExit:        2,
		},
		{
			name:     "unknown kind",
			kubeObjs: objects(classes(), twoNodes),
			args:     []string{"simulate", "-f", deployment},
			wantErr:  "no StatefulSet or PersistentVolumeClaim in " + deployment + " (found Deployment web): simulate takes a StatefulSet, PersistentVolumeClaims or --claims",
			wantExit: 2,
		},
		{
			name:     "document without a kind",
			kubeObjs: objects(classes(), twoNodes),
			stdin:    "metadata:\n  name: x\n",
			args:     []string{"simulate", "-f", "-"},
			wantErr:  "stdin, document 1: no kind: want a StatefulSet or PersistentVolumeClaims",
			wantExit: 2,
		},
		{
			name:     "unknown StorageClass",
			kubeObjs: objects(classes(), twoNodes),
			args:     []string{"simulate", "--claims", "1Gi", "--storage-class", "diskfit-nvm"},
			wantErr:  `claim claim-0: StorageClass "diskfit-nvm" not found`,
			wantExit: 2,
		},
		{
			name:     "default class is not diskfit's",
			kubeObjs: objects(classes(), twoNodes),
			args:     []string{"simulate", "--claims", "1Gi"},
			wantErr:  "none of the claims is diskfit's (claim-0: StorageClass standard is provisioned by rancher.io/local-path, not local.diskfit.io): name a StorageClass of local.diskfit.io with --storage-class",
			wantExit: 2,
		},
		{
			name:     "nothing to simulate",
			args:     []string{"simulate"},
			wantErr:  "nothing to simulate: give a workload with -f FILE or --claims SIZES",
			wantExit: 2,
		},
		{
			name:     "file and claims",
			args:     []string{"simulate", "-f", stsFile, "--claims", "1Gi"},
			wantErr:  "-f and --claims exclude each other",
			wantExit: 2,
		},
		{
			name:     "zero replicas",
			args:     []string{"simulate", "--claims", "1Gi", "--replicas", "0"},
			wantErr:  "--replicas 0: must be at least 1",
			wantExit: 2,
		},
		{
			name:     "unknown strategy",
			args:     []string{"simulate", "--claims", "1Gi", "--strategy", "BestFit"},
			wantErr:  `unknown strategy "BestFit": use MostAllocated or LeastAllocated`,
			wantExit: 2,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, err := runCommandWithInput(t, tc.stdin, tc.namespace, tc.kubeObjs, tc.diskfitObjs, tc.args...)
			if got := ExitCode(err); got != tc.wantExit {
				t.Errorf("exit code = %d (error %v), want %d", got, err, tc.wantExit)
			}
			switch {
			case tc.wantErrContains != "":
				if err == nil || !strings.Contains(err.Error(), tc.wantErrContains) {
					t.Fatalf("error = %v, want one containing %q", err, tc.wantErrContains)
				}
				return
			case tc.wantErr != "" && tc.wantOut == "":
				checkResult(t, out, err, "", tc.wantErr)
				return
			case tc.wantErr != "":
				// Does not fit: the answer is printed and the error says so.
				if err == nil || err.Error() != tc.wantErr {
					t.Errorf("error = %v, want %q", err, tc.wantErr)
				}
				err = nil
			}
			checkResult(t, out, err, tc.wantOut, "")
			if diff := cmp.Diff(tc.wantErrOut, errOut); diff != "" {
				t.Errorf("stderr (-want +got):\n%s", diff)
			}
		})
	}
}

// The machine-readable report of the StatefulSet case says the same as
// its table; in YAML as in JSON.
func TestSimulateMachineReadable(t *testing.T) {
	want := SimulateReport{
		SchemaVersion: "v1",
		Workload:      SimulatedWorkload{Kind: "StatefulSet", Namespace: "shop", Name: "web", SchedulerName: diskfit.SchedulerName},
		Strategy:      "MostAllocated",
		Fits:          true,
		Replicas: []ReplicaReport{
			{Name: "web-0", Fits: true, Node: "node-b", Claims: []ClaimReport{
				{Name: "data-web-0", StorageClass: "diskfit-ssd", SizeBytes: 2 * gi, Disk: "ssd1", Existing: true},
				{Name: "log-web-0", StorageClass: "diskfit", SizeBytes: 512 * mi, Disk: "ssd1"},
			}},
			{Name: "web-1", Fits: true, Node: "node-b", Claims: []ClaimReport{
				{Name: "data-web-1", StorageClass: "diskfit-ssd", DeviceClass: "ssd", SizeBytes: 2 * gi, Disk: "ssd1"},
				{Name: "log-web-1", StorageClass: "diskfit", SizeBytes: 512 * mi, Disk: "ssd1"},
			}},
		},
		FittingReplicas: 2,
	}
	for _, format := range []string{"json", "yaml"} {
		t.Run(format, func(t *testing.T) {
			out, _, err := runCommandWithInput(t, statefulSetYAML, "", statefulSetCluster(), disks(), "simulate", "-f", "-", "--replicas", "2", "-o", format)
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			var got SimulateReport
			if format == "json" {
				err = json.Unmarshal([]byte(out), &got)
			} else {
				err = yaml.UnmarshalStrict([]byte(out), &got)
			}
			if err != nil {
				t.Fatalf("output does not decode: %v\n%s", err, out)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("report (-want +got):\n%s", diff)
			}
		})
	}
}

// TestSimulateJSONSchema pins the documented field names and their order:
// scripts read them, so a change here is a schema version change.
func TestSimulateJSONSchema(t *testing.T) {
	out, _, err := runCommand(t, "", objects(classes(), []runtime.Object{readyNode("n1", nil)}), []runtime.Object{
		diskNode("n1", time.Minute, disk("d0", "ssd", 2*gi, 2*gi, 0)),
	}, "simulate", "--claims", "1536Mi", "--replicas", "2", "--storage-class", "diskfit-ssd", "-o", "json")
	if !errors.Is(err, ErrDoesNotFit) {
		t.Fatalf("error = %v, want %v", err, ErrDoesNotFit)
	}
	want := `{
  "schemaVersion": "v1",
  "workload": {
    "kind": "Claims",
    "namespace": "default"
  },
  "strategy": "MostAllocated",
  "fits": false,
  "fittingReplicas": 1,
  "replicas": [
    {
      "name": "replica-0",
      "fits": true,
      "node": "n1",
      "claims": [
        {
          "name": "claim-0",
          "storageClass": "diskfit-ssd",
          "deviceClass": "ssd",
          "sizeBytes": 1610612736,
          "disk": "d0"
        }
      ]
    },
    {
      "name": "replica-1",
      "fits": false,
      "claims": [
        {
          "name": "claim-0",
          "storageClass": "diskfit-ssd",
          "deviceClass": "ssd",
          "sizeBytes": 1610612736
        }
      ],
      "rejections": [
        {
          "node": "n1",
          "reason": "largest free disk of device class \"ssd\" d0 has 512Mi, pod needs 1.5Gi on one disk (claim claim-0)"
        }
      ]
    }
  ]
}
`
	if diff := cmp.Diff(want, out); diff != "" {
		t.Errorf("JSON (-want +got):\n%s", diff)
	}
}

// simulate's default strategy is the one the shipped scheduler
// configuration uses, so that it answers for the scheduler as installed.
func TestSimulateDefaultStrategyIsTheShippedOne(t *testing.T) {
	raw, err := os.ReadFile("../../../../manifests/scheduler/diskfit-scheduler-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Profiles []struct {
			SchedulerName string `json:"schedulerName"`
			PluginConfig  []struct {
				Name string `json:"name"`
				Args struct {
					ScoringStrategy struct {
						Type string `json:"type"`
					} `json:"scoringStrategy"`
				} `json:"args"`
			} `json:"pluginConfig"`
		} `json:"profiles"`
	}
	if err := yaml.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	shipped := ""
	for _, p := range cfg.Profiles {
		for _, pc := range p.PluginConfig {
			if p.SchedulerName == diskfit.SchedulerName && pc.Name == diskfit.PluginName {
				shipped = pc.Args.ScoringStrategy.Type
			}
		}
	}
	if shipped == "" {
		t.Fatalf("no DiskFit scoringStrategy.type for profile %s in the shipped configuration", diskfit.SchedulerName)
	}
	flag := newSimulateCommand(genericiooptions.IOStreams{}, deps{}).Flags().Lookup("strategy")
	if flag.DefValue != shipped {
		t.Errorf("--strategy defaults to %s, the shipped configuration uses %s", flag.DefValue, shipped)
	}
}

func TestExitCode(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want int
	}{
		{name: "success", want: 0},
		{name: "does not fit", err: ErrDoesNotFit, want: 1},
		{name: "error", err: errors.New("listing nodes: forbidden"), want: 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := ExitCode(tc.err); got != tc.want {
				t.Errorf("ExitCode(%v) = %d, want %d", tc.err, got, tc.want)
			}
		})
	}
}
