package driver

import (
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
)

func TestSelectedDisk(t *testing.T) {
	tests := []struct {
		name        string
		node, disk  string
		wantDisk    string
		wantCode    codes.Code
		wantMessage string
	}{
		{name: "this node", node: testNode, disk: "nvme0", wantDisk: "nvme0"},
		{name: "no disk", node: testNode},
		{name: "stale disk without node", disk: "nvme0"},
		{name: "another node", node: "node-b", disk: "nvme0", wantCode: codes.InvalidArgument, wantMessage: "node-b"},
		// Malformed names used to be returned as they were; they cannot
		// name a disk, so they are refused like an unknown disk.
		{name: "traversal", node: testNode, disk: "../../etc", wantCode: codes.ResourceExhausted, wantMessage: `"../../etc"`},
		{name: "upper case", node: testNode, disk: "NVMe0", wantCode: codes.ResourceExhausted, wantMessage: "lower-case"},
		{name: "dot dot inside", node: testNode, disk: "a..b", wantCode: codes.ResourceExhausted, wantMessage: `".."`},
		{name: "too long", node: testNode, disk: strings.Repeat("a", 64), wantCode: codes.ResourceExhausted, wantMessage: "longer than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ann := map[string]string{}
			if tt.node != "" {
				ann[diskfit.SelectedNodeAnnotation] = tt.node
			}
			if tt.disk != "" {
				ann[diskfit.SelectedDiskAnnotation] = tt.disk
			}
			got, err := selectedDisk(&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Annotations: ann}}, testNode)
			if c := status.Code(err); c != tt.wantCode || !strings.Contains(status.Convert(err).Message(), tt.wantMessage) {
				t.Fatalf("selectedDisk = %q, %v; want code %s with %q", got, err, tt.wantCode, tt.wantMessage)
			}
			if got != tt.wantDisk {
				t.Fatalf("selectedDisk = %q, want %q", got, tt.wantDisk)
			}
		})
	}
}

func TestCreateVolumePlacement(t *testing.T) {
	e := newEnv(t, twoDisks(), nil)
	tests := []struct {
		name     string
		ann      map[string]string
		class    string
		size     int64
		wantDisk string
	}{
		{name: "best fit without annotation", size: 500 * mi, wantDisk: "small"},
		{name: "best fit skips a disk too small", size: 2500 * mi, wantDisk: "big"},
		{name: "annotation is followed even when not the best fit", size: 500 * mi, wantDisk: "big",
			ann: map[string]string{diskfit.SelectedNodeAnnotation: testNode, diskfit.SelectedDiskAnnotation: "big"}},
		{name: "stale annotation without selected-node is ignored", size: 500 * mi, wantDisk: "small",
			ann: map[string]string{diskfit.SelectedDiskAnnotation: "big"}},
		{name: "device class", size: 500 * mi, class: "hdd", wantDisk: "big"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			name := "pvc-place-" + string(rune('a'+i))
			req := createReq(name, tt.size)
			req.Parameters = e.addPVC(t, name, tt.ann)
			if tt.class != "" {
				req.Parameters[diskfit.DeviceClassParameter] = tt.class
			}
			vol := e.mustCreate(t, req)
			if got := vol.VolumeContext[diskfit.VolumeContextDiskKey]; got != tt.wantDisk {
				t.Errorf("disk %q, want %q", got, tt.wantDisk)
			}
			if vol.VolumeId != tt.wantDisk+":"+name {
				t.Errorf("volume ID %q", vol.VolumeId)
			}
			if got := vol.AccessibleTopology[0].Segments[diskfit.TopologyKey]; got != testNode {
				t.Errorf("topology %q", got)
			}
			if _, err := e.d.DeleteVolume(e.ctx, &csi.DeleteVolumeRequest{VolumeId: vol.VolumeId}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A disk an admin took out of service (DiskNode spec) gets no new volume:
// the driver's own placement passes it over, and a claim the scheduler
// placed there before the cordon is refused with ResourceExhausted, so it
// is placed again. Taking the disk back into service makes it usable.
func TestUnschedulableDiskTakesNoNewVolume(t *testing.T) {
	e := newEnv(t, twoDisks(), nil)
	e.d.publish(e.ctx) // creates the DiskNode
	setSpec := func(spec v1alpha1.DiskNodeSpec) {
		t.Helper()
		dn, err := e.diskfit.DiskfitV1alpha1().DiskNodes().Get(e.ctx, testNode, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		dn.Spec = spec
		if _, err := e.diskfit.DiskfitV1alpha1().DiskNodes().Update(e.ctx, dn, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	diskOf := func(v *csi.Volume) string { return v.VolumeContext[diskfit.VolumeContextDiskKey] }

	// The best fit for 1Gi is "small"; with it out of service, "big".
	setSpec(v1alpha1.DiskNodeSpec{Disks: []v1alpha1.DiskSpec{{Name: "small", Unschedulable: true, Reason: "replacing"}}})
	if got := diskOf(e.mustCreate(t, createReq("fallback", gi))); got != "big" {
		t.Errorf("volume placed by the driver went to disk %s, want big (small is unschedulable)", got)
	}
	req := createReq("annotated", gi)
	req.Parameters = e.addPVC(t, "annotated", map[string]string{diskfit.SelectedNodeAnnotation: testNode, diskfit.SelectedDiskAnnotation: "small"})
	_, err := e.d.CreateVolume(e.ctx, req)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "unschedulable") || !strings.Contains(err.Error(), "replacing") {
		t.Errorf("CreateVolume on an unschedulable disk: %v, want ResourceExhausted naming the cordon and its reason", err)
	}

	// The whole node out of service.
	setSpec(v1alpha1.DiskNodeSpec{Unschedulable: true})
	if _, err := e.d.CreateVolume(e.ctx, createReq("node-out", gi)); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("CreateVolume on a node taken out of service: %v, want ResourceExhausted", err)
	}
	e.d.publish(e.ctx)
	dn, err := e.diskfit.DiskfitV1alpha1().DiskNodes().Get(e.ctx, testNode, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if dn.Status.UnschedulableDisks != 2 {
		t.Errorf("status.unschedulableDisks = %d, want 2", dn.Status.UnschedulableDisks)
	}

	// Back in service: the annotated claim is placed where the scheduler said.
	setSpec(v1alpha1.DiskNodeSpec{})
	if got := diskOf(e.mustCreate(t, req)); got != "small" {
		t.Errorf("annotated volume went to disk %s, want small", got)
	}
}
