package kube

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	k8sfake "k8s.io/client-go/kubernetes/fake"

	dffake "github.com/diskfit/diskfit/apis/client/clientset/versioned/fake"
	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
)

func status(free int64) *v1alpha1.DiskNodeStatus {
	st := &v1alpha1.DiskNodeStatus{
		ObservedTime: metav1.Now(),
		Disks:        []v1alpha1.DiskStatus{{Name: "d0", Backend: v1alpha1.BackendFile, CapacityBytes: 100, FreeBytes: free, Healthy: true}},
	}
	st.Summarize()
	return st
}

func TestDiskNodePublisher(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name     string
		node     bool
		existing *v1alpha1.DiskNode
		wantErr  string
	}{
		{name: "creates the DiskNode, owned by nothing", node: true},
		{name: "updates an existing DiskNode", node: true, existing: &v1alpha1.DiskNode{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"keep": "me"}}}},
		{name: "no Node", wantErr: "reading Node n1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kube := k8sfake.NewClientset()
			if tt.node {
				if _, err := kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: types.UID("u1")}}, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			df := dffake.NewSimpleClientset()
			if tt.existing != nil {
				if _, err := df.DiskfitV1alpha1().DiskNodes().Create(ctx, tt.existing, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			p := DiskNodePublisher{Kube: kube, DiskFit: df, NodeName: "n1"}
			err := p.Publish(ctx, status(40))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got %v, want an error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Publish(ctx, status(30)); err != nil {
				t.Fatal(err)
			}
			dn, err := df.DiskfitV1alpha1().DiskNodes().Get(ctx, "n1", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if d := dn.Status.Disk("d0"); d == nil || d.FreeBytes != 30 {
				t.Errorf("status %+v", dn.Status)
			}
			if tt.existing != nil {
				if dn.Labels["keep"] != "me" {
					t.Errorf("publishing replaced the object's metadata: %v", dn.ObjectMeta)
				}
				return
			}
			// Owned by its Node, it would go with the Node, an admin's
			// cordon with it (see csi-driver/lifecycle/disknodes.go).
			if len(dn.OwnerReferences) != 0 {
				t.Errorf("owner references %v, want none", dn.OwnerReferences)
			}
		})
	}
}

func TestPVCGetter(t *testing.T) {
	ctx := context.Background()
	kube := k8sfake.NewClientset(&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c", Annotations: map[string]string{"a": "b"}}})
	g := PVCGetter{Client: kube}
	pvc, err := g.GetPVC(ctx, "ns", "c")
	if err != nil || pvc.Annotations["a"] != "b" {
		t.Errorf("GetPVC = %v, %v", pvc, err)
	}
	if _, err := g.GetPVC(ctx, "ns", "missing"); err == nil {
		t.Error("a missing PVC was found")
	}
}
