package kube

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8sfake "k8s.io/client-go/kubernetes/fake"

	dffake "github.com/diskfit/diskfit/apis/client/clientset/versioned/fake"
	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
)

// placedPV is a PV of driver naming handle on node, with size bytes.
func placedPV(name, driver, handle, node string, size int64) *corev1.PersistentVolume {
	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name}}
	pv.Spec.CSI = &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: handle}
	pv.Spec.Capacity = corev1.ResourceList{corev1.ResourceStorage: *resource.NewQuantity(size, resource.BinarySI)}
	pv.Spec.NodeAffinity = &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
		MatchExpressions: []corev1.NodeSelectorRequirement{{Key: diskfit.TopologyKey, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
	}}}}
	return pv
}

// SpaceFor finds the volume's PV on any node, counts the PVs of its disk
// on that node only (disk names repeat across nodes) and of this driver
// only, and reads that node's DiskNode.
func TestSpaceFor(t *testing.T) {
	const gi = int64(1) << 30
	n1 := &v1alpha1.DiskNode{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Status: v1alpha1.DiskNodeStatus{
		Disks: []v1alpha1.DiskStatus{{Name: "d0", CapacityBytes: 10 * gi, FreeBytes: 6 * gi, Healthy: true}}}}
	objs := []runtime.Object{
		placedPV("pv-a", diskfit.DriverName, "d0:pvc-a", "n1", gi),
		placedPV("pv-b", diskfit.DriverName, "d0:pvc-b", "n1", 2*gi),
		placedPV("pv-elsewhere", diskfit.DriverName, "d0:pvc-c", "n2", 5*gi),
		placedPV("pv-other-driver", "other.csi.example.com", "d0:pvc-d", "n1", 7*gi),
		placedPV("pv-n3", diskfit.DriverName, "d0:pvc-e", "n3", gi),
		placedPV("pv-twice-1", diskfit.DriverName, "d0:pvc-twice", "n1", gi),
		placedPV("pv-twice-2", diskfit.DriverName, "d0:pvc-twice", "n2", gi),
	}
	s := DiskSpace{Kube: k8sfake.NewClientset(objs...), DiskFit: dffake.NewSimpleClientset(n1)}
	ctx := context.Background()

	pv, disk, booked, err := s.SpaceFor(ctx, "d0:pvc-a")
	if err != nil || pv == nil || pv.Name != "pv-a" || disk == nil || disk.FreeBytes != 6*gi || booked != 4*gi {
		t.Errorf("SpaceFor(d0:pvc-a) = PV %v, disk %+v, booked %d, %v; want pv-a, n1's d0, 4Gi (pv-a, pv-b, pv-twice-1)", pv, disk, booked, err)
	}
	if pv, disk, _, err := s.SpaceFor(ctx, "d0:pvc-e"); err != nil || pv == nil || disk != nil {
		t.Errorf("SpaceFor of a volume whose node has no DiskNode = PV %v, disk %+v, %v; want its PV and no disk", pv, disk, err)
	}
	if pv, _, _, err := s.SpaceFor(ctx, "d0:pvc-gone"); err != nil || pv != nil {
		t.Errorf("SpaceFor of a volume no PV names = %v, %v; want nil, nil", pv, err)
	}
	if _, _, _, err := s.SpaceFor(ctx, "d0:pvc-twice"); err == nil || !strings.Contains(err.Error(), "pv-twice-2") {
		t.Errorf("SpaceFor of a volume PVs on two nodes name = %v, want an error naming both", err)
	}
}
