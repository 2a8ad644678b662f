package cli

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	dffake "github.com/diskfit/diskfit/apis/client/clientset/versioned/fake"
	"github.com/diskfit/diskfit/apis/diskfit"
)

// TestNewClaimsGetTheClassKubernetesGives: a claim's class is decided as
// the API server and the PV controller decide it (diskfit.ClaimClass,
// diskfit.DefaultClass). The CLI used to read only the GA default-class
// annotation, and gave the default class to a claim whose legacy class
// annotation asks for none.
func TestNewClaimsGetTheClassKubernetesGives(t *testing.T) {
	betaDefault := diskfitClass("diskfit", "")
	betaDefault.Annotations = map[string]string{diskfit.BetaIsDefaultClassAnnotation: "true"}
	cl, err := loadCluster(context.Background(), &Clients{Kube: kubefake.NewClientset(betaDefault, diskfitClass("diskfit-ssd", "ssd")), DiskFit: dffake.NewSimpleClientset()})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		pvc        *corev1.PersistentVolumeClaim
		wantClass  string
		wantReason string
	}{
		{name: "names none: the default", pvc: &corev1.PersistentVolumeClaim{}, wantClass: "diskfit"},
		{name: "names one", pvc: &corev1.PersistentVolumeClaim{Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: ptr.To("diskfit-ssd")}}, wantClass: "diskfit-ssd"},
		{name: "asks for none", pvc: &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{diskfit.BetaStorageClassAnnotation: ""}}}, wantReason: "no StorageClass and no default class"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sc, reason, err := cl.storageClass(tt.pvc)
			if err != nil || sc.Name != tt.wantClass || reason != tt.wantReason {
				t.Fatalf("storageClass = %v, %q, %v; want class %q, reason %q", sc.Name, reason, err, tt.wantClass, tt.wantReason)
			}
		})
	}
}
