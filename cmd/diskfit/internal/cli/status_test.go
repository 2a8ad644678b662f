package cli

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kubefake "k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"sigs.k8s.io/yaml"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
)

const (
	mi = int64(1) << 20
	gi = int64(1) << 30
)

// diskNode builds a DiskNode observed age before testNow.
func diskNode(name string, age time.Duration, disks ...v1alpha1.DiskStatus) *v1alpha1.DiskNode {
	dn := &v1alpha1.DiskNode{ObjectMeta: metav1.ObjectMeta{Name: name}}
	dn.Status.Disks = disks
	if age >= 0 {
		dn.Status.ObservedTime = metav1.NewTime(testNow.Add(-age))
	}
	return dn
}

func disk(name, class string, capacity, free int64, volumes int32) v1alpha1.DiskStatus {
	return v1alpha1.DiskStatus{Name: name, Backend: v1alpha1.BackendFile, DeviceClass: class,
		CapacityBytes: capacity, FreeBytes: free, VolumeCount: volumes, Healthy: true}
}

func unhealthy(d v1alpha1.DiskStatus, msg string) v1alpha1.DiskStatus {
	d.Healthy, d.Message = false, msg
	return d
}

// cluster is two nodes with three disks, one of them unhealthy, and a
// node whose driver never reported.
func cluster() []runtime.Object {
	lvm := unhealthy(disk("hdd0", "hdd", 0, 0, 0), "device-mapper is not available")
	lvm.Backend = v1alpha1.BackendLVM
	return []runtime.Object{
		diskNode("node-b", 5*time.Minute, disk("ssd0", "ssd", 12*gi, 12*gi, 0), lvm),
		diskNode("node-a", 3*time.Second, disk("nvme0", "nvme", 4*gi, gi, 3), disk("nvme1", "", 2*gi, 650*mi+700*1024, 1)),
		diskNode("node-c", -1),
	}
}

const clusterTable = `NODE    DISK   CLASS  BACKEND  CAPACITY  USED   FREE     VOLUMES  HEALTH     USAGE                        OBSERVED
node-a  nvme0  nvme   file     4Gi       3Gi    1Gi      3        ok         [###############.....]  75%  3s ago
        nvme1  -      file     2Gi       1.4Gi  650.7Mi  1        ok         [#############.......]  68%
node-b  ssd0   ssd    file     12Gi      0      12Gi     0        ok         [....................]   0%  5m ago
        hdd0   hdd    lvm      0         0      0        0        UNHEALTHY  [                    ]    -
node-c  -      -      -        -         -      -        -        no disks                                never

Unhealthy disks:
  node-b/hdd0: device-mapper is not available
`

func TestStatus(t *testing.T) {
	tests := []struct {
		name       string
		objs       []runtime.Object
		args       []string
		wantOut    string
		wantErrOut string
		wantErr    string
	}{
		{
			name:    "table",
			objs:    cluster(),
			args:    []string{"status"},
			wantOut: clusterTable,
		},
		{
			name: "table of named nodes",
			objs: cluster(),
			args: []string{"status", "node-a"},
			wantOut: `NODE    DISK   CLASS  BACKEND  CAPACITY  USED   FREE     VOLUMES  HEALTH  USAGE                        OBSERVED
node-a  nvme0  nvme   file     4Gi       3Gi    1Gi      3        ok      [###############.....]  75%  3s ago
        nvme1  -      file     2Gi       1.4Gi  650.7Mi  1        ok      [#############.......]  68%
`,
		},
		{
			name:    "unknown node",
			objs:    cluster(),
			args:    []string{"status", "node-x"},
			wantErr: `reading DiskNode node-x: disknodes.diskfit.io "node-x" not found`,
		},
		{
			name:       "no DiskNodes",
			args:       []string{"status"},
			wantErrOut: "No DiskNodes found: the diskfit node plugin has not reported any node.\n",
		},
		{
			name:    "no DiskNodes, json",
			args:    []string{"status", "-o", "json"},
			wantOut: "{\n  \"schemaVersion\": \"v1\",\n  \"nodes\": []\n}\n",
		},
		{
			name:    "bad output format",
			objs:    cluster(),
			args:    []string{"status", "-o", "wide"},
			wantErr: `unknown output format "wide": use json or yaml`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, err := runCommand(t, "", nil, tc.objs, tc.args...)
			checkResult(t, out, err, tc.wantOut, tc.wantErr)
			if tc.wantErr != "" {
				return
			}
			if diff := cmp.Diff(tc.wantErrOut, errOut); diff != "" {
				t.Errorf("stderr (-want +got):\n%s", diff)
			}
		})
	}
}

// wantReport is cluster() as the -o json|yaml schema.
func wantReport() StatusReport {
	at := func(age time.Duration) *metav1.Time { t := metav1.NewTime(testNow.Add(-age)); return &t }
	return StatusReport{SchemaVersion: "v1", Nodes: []NodeReport{
		{Name: "node-a", ObservedTime: at(3 * time.Second), Disks: []DiskReport{
			{Name: "nvme0", Backend: "file", DeviceClass: "nvme", CapacityBytes: 4 * gi, UsedBytes: 3 * gi, FreeBytes: gi, VolumeCount: 3, Healthy: true},
			{Name: "nvme1", Backend: "file", CapacityBytes: 2 * gi, UsedBytes: 2*gi - 650*mi - 700*1024, FreeBytes: 650*mi + 700*1024, VolumeCount: 1, Healthy: true},
		}},
		{Name: "node-b", ObservedTime: at(5 * time.Minute), Disks: []DiskReport{
			{Name: "ssd0", Backend: "file", DeviceClass: "ssd", CapacityBytes: 12 * gi, FreeBytes: 12 * gi, Healthy: true},
			{Name: "hdd0", Backend: "lvm", DeviceClass: "hdd", Message: "device-mapper is not available"},
		}},
		{Name: "node-c", Disks: []DiskReport{}},
	}}
}

func TestStatusMachineReadable(t *testing.T) {
	tests := []struct {
		name      string
		format    string
		unmarshal func([]byte, any) error
	}{
		{name: "json", format: "json", unmarshal: json.Unmarshal},
		{name: "yaml", format: "yaml", unmarshal: func(b []byte, v any) error { return yaml.UnmarshalStrict(b, v) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, _, err := runCommand(t, "", nil, cluster(), "status", "-o", tc.format)
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			var got StatusReport
			if err := tc.unmarshal([]byte(out), &got); err != nil {
				t.Fatalf("output does not decode: %v\n%s", err, out)
			}
			if diff := cmp.Diff(wantReport(), got); diff != "" {
				t.Errorf("report (-want +got):\n%s", diff)
			}
		})
	}
}

// TestStatusJSONSchema pins the documented field names and their order:
// scripts read them, so a change here is a schema version change.
func TestStatusJSONSchema(t *testing.T) {
	dn := diskNode("n1", time.Minute, unhealthy(disk("d0", "ssd", 2*gi, gi, 2), "gone"))
	dn.Spec.Disks = []v1alpha1.DiskSpec{{Name: "d0", Unschedulable: true, Reason: "replace"}}
	out, _, err := runCommand(t, "", []runtime.Object{
		diskfitPV("pv-1", "n1", "d0", gi, "data-0"), drainPVC("data-0", "diskfit", "pv-1", diskfit.OnDiskLossRelease),
	}, []runtime.Object{dn}, "status", "-o", "json")
	if err != nil {
		t.Fatalf("unexpected error: %v", err)
	}
	want := `{
  "schemaVersion": "v1",
  "nodes": [
    {
      "name": "n1",
      "observedTime": "2026-11-30T00:59:00Z",
      "disks": [
        {
          "name": "d0",
          "backend": "file",
          "deviceClass": "ssd",
          "capacityBytes": 2147483648,
          "usedBytes": 1073741824,
          "freeBytes": 1073741824,
          "volumeCount": 2,
          "healthy": false,
          "message": "gone",
          "unschedulable": true,
          "unschedulableReason": "replace",
          "volumesWithoutPV": 0,
          "bytesWithoutPV": 0,
          "claims": [
            {
              "namespace": "shop",
              "name": "data-0",
              "pv": "pv-1",
              "releaseOnDiskLoss": true
            }
          ]
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

// TestStatusShowsCordonedDisksAndTheirClaims: a cordoned disk and an
// unhealthy one are marked, with their reasons, and the claims on them are
// listed with what becomes of them; those of a working disk are not.
func TestStatusShowsCordonedDisksAndTheirClaims(t *testing.T) {
	c := drainCluster()
	ctx := context.Background()
	dn, err := c.DiskFit.DiskfitV1alpha1().DiskNodes().Get(ctx, "node-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dn.Status.Disks[1] = unhealthy(dn.Status.Disks[1], "I/O errors")
	dn.Status.Disks = append(dn.Status.Disks, disk("ssd0", "ssd", 4*gi, 3*gi, 1))
	if _, err := c.DiskFit.DiskfitV1alpha1().DiskNodes().Update(ctx, dn, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, obj := range []runtime.Object{diskfitPV("pv-ssd", "node-a", "ssd0", gi, "fine"), drainPVC("fine", "diskfit", "pv-ssd", "")} {
		if err := c.Kube.(*kubefake.Clientset).Tracker().Add(obj); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := runWith(c, "", "cordon", "node-a/nvme0", "--reason", "SMART errors"); err != nil {
		t.Fatal(err)
	}
	out, errOut, err := runWith(c, "", "status")
	want := `NODE    DISK   CLASS  BACKEND  CAPACITY  USED  FREE  VOLUMES  HEALTH       USAGE                        OBSERVED
node-a  nvme0  nvme   file     8Gi       4Gi   4Gi   5        ok,cordoned  [##########..........]  50%  1s ago
        nvme1  nvme   file     4Gi       1Gi   3Gi   1        UNHEALTHY    [#####...............]  25%
        ssd0   ssd    file     4Gi       1Gi   3Gi   1        ok           [#####...............]  25%

Unhealthy disks:
  node-a/nvme1: I/O errors

Cordoned disks (no new volumes; diskfit uncordon NODE[/DISK] puts them back):
  node-a/nvme0: SMART errors

Claims on unhealthy or cordoned disks (release: moved off by diskfit drain --release, or when the disk fails for good; keep: stays):
  node-a/nvme0: shop/data-web-0 (release)
  node-a/nvme0: shop/data-web-1 (release)
  node-a/nvme0: shop/scratch (keep)
  node-a/nvme0: shop/tool-data (release)
  node-a/nvme1: shop/other (release)
`
	checkResult(t, out, err, want, "")
	if errOut != "" {
		t.Errorf("stderr: %s", errOut)
	}

	// Someone who may not list PVs still gets the rest.
	c.Kube.(*kubefake.Clientset).PrependReactor("list", "persistentvolumes", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(corev1.Resource("persistentvolumes"), "", nil)
	})
	out, errOut, err = runWith(c, "", "status")
	checkResult(t, out, err, want[:strings.Index(want, "\nClaims on")], "")
	if !strings.HasPrefix(errOut, "Warning: the claims on unhealthy or cordoned disks are not shown: listing PersistentVolumes: ") {
		t.Errorf("stderr: %s", errOut)
	}
}

func TestUsageBar(t *testing.T) {
	tests := []struct {
		name           string
		used, capacity int64
		want           string
	}{
		{name: "empty", used: 0, capacity: 100, want: "[....................]   0%"},
		{name: "half", used: 50, capacity: 100, want: "[##########..........]  50%"},
		{name: "rounds down", used: 99, capacity: 100, want: "[###################.]  99%"},
		{name: "full", used: 100, capacity: 100, want: "[####################] 100%"},
		{name: "more than full is full", used: 150, capacity: 100, want: "[####################] 100%"},
		{name: "negative is empty", used: -5, capacity: 100, want: "[....................]   0%"},
		{name: "no capacity", used: 0, capacity: 0, want: "[                    ]    -"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := usageBar(tc.used, tc.capacity); got != tc.want {
				t.Errorf("usageBar(%d, %d) = %q, want %q", tc.used, tc.capacity, got, tc.want)
			}
			if i := strings.Index(usageBar(tc.used, tc.capacity), "]"); i != barWidth+1 {
				t.Errorf("bar has %d cells, want %d", i-1, barWidth)
			}
		})
	}
}
