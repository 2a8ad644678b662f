package diskfit

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	storagehelpers "k8s.io/component-helpers/storage/volume"
	"k8s.io/utils/ptr"
)

func TestIsDiskFitClass(t *testing.T) {
	tests := []struct {
		name  string
		class *storagev1.StorageClass
		want  bool
	}{
		{name: "diskfit", class: &storagev1.StorageClass{Provisioner: DriverName}, want: true},
		{name: "another driver", class: &storagev1.StorageClass{Provisioner: "ebs.csi.aws.com"}},
		{name: "no provisioner", class: &storagev1.StorageClass{Provisioner: "kubernetes.io/no-provisioner"}},
		{name: "no class", class: nil},
	}
	for _, tt := range tests {
		if got := IsDiskFitClass(tt.class); got != tt.want {
			t.Errorf("%s: IsDiskFitClass = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestClaimClass(t *testing.T) {
	claim := func(beta *string, spec *string, volume string) *v1.PersistentVolumeClaim {
		pvc := &v1.PersistentVolumeClaim{Spec: v1.PersistentVolumeClaimSpec{StorageClassName: spec, VolumeName: volume}}
		if beta != nil {
			pvc.Annotations = map[string]string{BetaStorageClassAnnotation: *beta}
		}
		return pvc
	}
	tests := []struct {
		name string
		pvc  *v1.PersistentVolumeClaim
		want string
	}{
		{name: "spec", pvc: claim(nil, ptr.To("fast"), ""), want: "fast"},
		{name: "beta annotation before spec", pvc: claim(ptr.To("old"), ptr.To("fast"), ""), want: "old"},
		{name: "no class asked for", pvc: claim(nil, ptr.To(""), ""), want: ""},
		// The API server's DefaultStorageClass admission and the PV
		// controller leave a claim alone whose annotation asks for no
		// class: the annotation is there, if empty. The CLI used to give
		// such a claim the default class.
		{name: "empty beta annotation", pvc: claim(ptr.To(""), nil, ""), want: ""},
		{name: "none: the default", pvc: claim(nil, nil, ""), want: "standard"},
		{name: "none, bound: no class", pvc: claim(nil, nil, "pv-1"), want: ""},
		{name: "bound keeps its class", pvc: claim(nil, ptr.To("fast"), "pv-1"), want: "fast"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ClaimClass(tt.pvc, "standard"); got != tt.want {
				t.Fatalf("ClaimClass = %q, want %q", got, tt.want)
			}
			// Where the claim names a class, it is the one Kubernetes'
			// own helpers read.
			if storagehelpers.PersistentVolumeClaimHasClass(tt.pvc) {
				if got, k8s := ClaimClass(tt.pvc, "standard"), storagehelpers.GetPersistentVolumeClaimClass(tt.pvc); got != k8s {
					t.Fatalf("ClaimClass = %q, Kubernetes reads %q", got, k8s)
				}
			}
		})
	}
}

func TestDefaultClass(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	class := func(name string, created time.Time, ann ...string) *storagev1.StorageClass {
		sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(created), Annotations: map[string]string{}}}
		for _, a := range ann {
			sc.Annotations[a] = "true"
		}
		return sc
	}
	tests := []struct {
		name    string
		classes []*storagev1.StorageClass
		want    string
	}{
		{name: "none", classes: []*storagev1.StorageClass{class("a", t0)}, want: ""},
		{name: "one", classes: []*storagev1.StorageClass{class("a", t0), class("b", t0, IsDefaultClassAnnotation)}, want: "b"},
		// Kubernetes reads the beta annotation as well; the CLI used to
		// read only the GA one.
		{name: "beta annotation", classes: []*storagev1.StorageClass{class("a", t0), class("b", t0, BetaIsDefaultClassAnnotation)}, want: "b"},
		{name: "newest", classes: []*storagev1.StorageClass{class("new", t0.Add(time.Hour), IsDefaultClassAnnotation), class("old", t0, IsDefaultClassAnnotation)}, want: "new"},
		{name: "same age: first by name", classes: []*storagev1.StorageClass{class("z", t0, IsDefaultClassAnnotation), class("m", t0, BetaIsDefaultClassAnnotation)}, want: "m"},
		{name: "not true", classes: []*storagev1.StorageClass{{ObjectMeta: metav1.ObjectMeta{Name: "a", Annotations: map[string]string{IsDefaultClassAnnotation: "yes"}}}}, want: ""},
	}
	for _, tt := range tests {
		if got := DefaultClass(tt.classes); got != tt.want {
			t.Errorf("%s: DefaultClass = %q, want %q", tt.name, got, tt.want)
		}
	}
}
