package cli

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/diskfit/diskfit/apis/diskfit"
)

// failedMsg is a FailedScheduling message as kube-scheduler writes it when
// DiskFit rejected two nodes and a taint the third.
const failedMsg = `0/3 nodes are available: 1 node node-a: largest free disk of device class "nvme" nvme1 has 650.7Mi, pod needs 1.5Gi on one disk (claim data-web-0), 1 node node-b: claims 1.5Gi+768Mi do not fit together on disks nvme0 (1Gi free), nvme1 (2Gi free), 1 node(s) had untolerated taint {node-role.kubernetes.io/control-plane: }. preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling.`

type podBuilder struct{ *corev1.Pod }

func makePod(name string) podBuilder {
	return podBuilder{&corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop", UID: types.UID(name + "-uid")},
		Spec:       corev1.PodSpec{SchedulerName: diskfit.SchedulerName},
		Status:     corev1.PodStatus{Phase: corev1.PodPending},
	}}
}

func (p podBuilder) withClaim(volume, claim string) podBuilder {
	p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: volume, VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}})
	return p
}

func (p podBuilder) withConfigMap(volume string) podBuilder {
	p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: volume, VolumeSource: corev1.VolumeSource{
		ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: volume}}}})
	return p
}

// onNode makes the pod run, Ready, on node.
func (p podBuilder) onNode(node string) podBuilder {
	p.Spec.NodeName = node
	p.Status.Phase = corev1.PodRunning
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	return p
}

func (p podBuilder) withScheduler(name string) podBuilder {
	p.Spec.SchedulerName = name
	return p
}

func makePVC(name, class, size string, annotations map[string]string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop", Annotations: annotations},
		Spec: corev1.PersistentVolumeClaimSpec{
			StorageClassName: &class,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}},
		},
		Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimPending},
	}
}

func bound(pvc *corev1.PersistentVolumeClaim, pv string) *corev1.PersistentVolumeClaim {
	pvc.Spec.VolumeName = pv
	pvc.Status.Phase = corev1.ClaimBound
	return pvc
}

func makePV(name, disk string) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
			Driver: diskfit.DriverName, VolumeHandle: disk + ":" + name,
			VolumeAttributes: map[string]string{diskfit.VolumeContextDiskKey: disk},
		}}},
	}
}

func failedScheduling(name, pod string, uid types.UID, age time.Duration, count int32, msg string) *corev1.Event {
	return &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: name, Namespace: "shop"},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: "shop", Name: pod, UID: uid},
		Reason:         "FailedScheduling",
		Message:        msg,
		Count:          count,
		LastTimestamp:  metav1.NewTime(testNow.Add(-age)),
	}
}

// seriesOf makes e an events.k8s.io event as kube-scheduler writes it, seen
// through the core API: no lastTimestamp, repeats counted in its series.
func seriesOf(e *corev1.Event, age time.Duration, count int32) *corev1.Event {
	e.EventTime = metav1.NewMicroTime(e.LastTimestamp.Time)
	e.LastTimestamp = metav1.Time{}
	e.Series = &corev1.EventSeries{Count: count, LastObservedTime: metav1.NewMicroTime(testNow.Add(-age))}
	return e
}

func TestExplain(t *testing.T) {
	selected := map[string]string{diskfit.SelectedNodeAnnotation: "node-a", diskfit.SelectedDiskAnnotation: "nvme1"}
	tests := []struct {
		name      string
		namespace string
		objs      []runtime.Object
		pod       string
		wantOut   string
		wantErr   string
	}{
		{
			name:      "pending, rejected per disk",
			namespace: "shop",
			pod:       "web-0",
			objs: []runtime.Object{
				makePod("web-0").withClaim("data", "data-web-0").withConfigMap("conf").withClaim("log", "log-web-0").Pod,
				makePVC("data-web-0", "diskfit-nvme", "1536Mi", nil),
				bound(makePVC("log-web-0", "diskfit", "768Mi", selected), "pv-log"),
				makePV("pv-log", "nvme1"),
				failedScheduling("e-old", "web-0", "web-0-uid", 10*time.Minute, 1, "0/3 nodes are available: an old reason."),
				failedScheduling("e-new", "web-0", "web-0-uid", 12*time.Second, 4, failedMsg),
				// Another pod's event, and one of an earlier pod of the same name.
				failedScheduling("e-other", "web-1", "web-1-uid", time.Second, 1, "0/3 nodes are available: other."),
				failedScheduling("e-gone", "web-0", "old-uid", time.Second, 1, "0/3 nodes are available: earlier pod."),
			},
			wantOut: `Pod shop/web-0: Pending, scheduler diskfit-scheduler

Claims:
  CLAIM       CLASS         SIZE   PHASE    NODE    DISK
  data-web-0  diskfit-nvme  1.5Gi  Pending  -       -
  log-web-0   diskfit       768Mi  Bound    node-a  nvme1

Why no node fits (FailedScheduling 12s ago, 4 time(s)):
  NODE      REASON
  node-a    largest free disk of device class "nvme" nvme1 has 650.7Mi, pod needs 1.5Gi on one disk (claim data-web-0)
  node-b    claims 1.5Gi+768Mi do not fit together on disks nvme0 (1Gi free), nvme1 (2Gi free)
  (1 node)  node(s) had untolerated taint {node-role.kubernetes.io/control-plane: }
`,
		},
		{
			name:      "scheduled pod shows where its volumes are",
			namespace: "shop",
			pod:       "web-0",
			objs: []runtime.Object{
				makePod("web-0").withClaim("data", "data-web-0").onNode("node-a").Pod,
				bound(makePVC("data-web-0", "diskfit-nvme", "2Gi", selected), "pv-data"),
				makePV("pv-data", "nvme0"),
			},
			wantOut: `Pod shop/web-0: Running on node node-a, scheduler diskfit-scheduler

Claims:
  CLAIM       CLASS         SIZE  PHASE  NODE    DISK
  data-web-0  diskfit-nvme  2Gi   Bound  node-a  nvme0
`,
		},
		{
			name:      "default scheduler, missing claim, no event yet",
			namespace: "shop",
			pod:       "web-0",
			objs: []runtime.Object{
				makePod("web-0").withClaim("data", "data-web-0").withScheduler("").Pod,
			},
			wantOut: `Pod shop/web-0: Pending, scheduler default-scheduler
  (not diskfit-scheduler: its claims are placed per node, not per disk)

Claims:
  CLAIM       CLASS  SIZE  PHASE    NODE  DISK
  data-web-0  -      -     missing  -     -

No FailedScheduling event: the pod has not been tried yet, or its events expired.
`,
		},
		{
			name:      "message without per-node reasons is printed as it is",
			namespace: "shop",
			pod:       "web-0",
			objs: []runtime.Object{
				makePod("web-0").Pod,
				seriesOf(failedScheduling("e", "web-0", "web-0-uid", time.Hour, 0, "0/3 nodes are available: pod has unbound immediate PersistentVolumeClaims."), time.Minute, 7),
			},
			wantOut: `Pod shop/web-0: Pending, scheduler diskfit-scheduler

Why no node fits (FailedScheduling 60s ago, 7 time(s)):
  0/3 nodes are available: pod has unbound immediate PersistentVolumeClaims.
`,
		},
		{
			name:    "pod in another namespace",
			pod:     "web-0",
			objs:    []runtime.Object{makePod("web-0").Pod},
			wantErr: `reading pod default/web-0: pods "web-0" not found`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, _, err := runCommand(t, tc.namespace, tc.objs, nil, "explain", tc.pod)
			checkResult(t, out, err, tc.wantOut, tc.wantErr)
		})
	}
}

func TestParseSchedulingMessage(t *testing.T) {
	tests := []struct {
		name string
		msg  string
		want []NodeReason
	}{
		{
			name: "DiskFit reasons with commas inside, a counted reason, preemption dropped",
			msg:  failedMsg,
			want: []NodeReason{
				{Node: "node-a", Count: 1, Reason: `largest free disk of device class "nvme" nvme1 has 650.7Mi, pod needs 1.5Gi on one disk (claim data-web-0)`},
				{Node: "node-b", Count: 1, Reason: "claims 1.5Gi+768Mi do not fit together on disks nvme0 (1Gi free), nvme1 (2Gi free)"},
				{Count: 1, Reason: "node(s) had untolerated taint {node-role.kubernetes.io/control-plane: }"},
			},
		},
		{
			name: "per-node reasons sorted by node, counted ones last",
			msg:  "0/3 nodes are available: 2 node(s) didn't match Pod's node affinity/selector, 1 node z9: DiskNode is stale (observed 6m0s ago, maximum 5m0s), 1 node a1: no healthy disk.",
			want: []NodeReason{
				{Node: "a1", Count: 1, Reason: "no healthy disk"},
				{Node: "z9", Count: 1, Reason: "DiskNode is stale (observed 6m0s ago, maximum 5m0s)"},
				{Count: 2, Reason: "node(s) didn't match Pod's node affinity/selector"},
			},
		},
		{
			name: "PreFilter message has no per-node reasons",
			msg:  "0/3 nodes are available: pod has unbound immediate PersistentVolumeClaims.",
		},
		{
			name: "not kube-scheduler's form",
			msg:  "binding rejected: timeout",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, ParseSchedulingMessage(tc.msg)); diff != "" {
				t.Errorf("reasons (-want +got):\n%s", diff)
			}
		})
	}
}
