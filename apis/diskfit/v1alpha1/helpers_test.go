package v1alpha1

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/diskfit/diskfit/apis/diskfit"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

const gi = int64(1) << 30

func TestDisk(t *testing.T) {
	s := DiskNodeStatus{Disks: []DiskStatus{{Name: "a"}, {Name: "b", FreeBytes: 7}}}
	if d := s.Disk("b"); d == nil || d.FreeBytes != 7 {
		t.Fatalf("Disk(b) = %+v, want the second disk", d)
	}
	// The result points into the status so callers can update it in place.
	s.Disk("a").FreeBytes = 3
	if s.Disks[0].FreeBytes != 3 {
		t.Fatalf("Disk(a) returned a copy, want a pointer into Disks")
	}
	if d := s.Disk("c"); d != nil {
		t.Fatalf("Disk(c) = %+v, want nil", d)
	}
}

func TestSummarize(t *testing.T) {
	tests := []struct {
		name                   string
		disks                  []DiskStatus
		wantCapacity, wantFree string
		wantCount, wantHealthy int32
	}{
		{name: "no disks", wantCapacity: "0", wantFree: "0"},
		{
			name: "unhealthy disks are left out",
			disks: []DiskStatus{
				{Name: "a", CapacityBytes: 10 * gi, FreeBytes: 4 * gi, Healthy: true},
				{Name: "b", CapacityBytes: 6 * gi, FreeBytes: 2 * gi, Healthy: true},
				{Name: "c", CapacityBytes: 100 * gi, FreeBytes: 100 * gi, Healthy: false},
			},
			wantCapacity: "16Gi", wantFree: "6Gi", wantCount: 3, wantHealthy: 2,
		},
		{
			name: "rounded down to MiB",
			disks: []DiskStatus{
				{Name: "a", CapacityBytes: 10*gi + 1<<20 + 5, FreeBytes: 1<<20 - 1, Healthy: true},
			},
			wantCapacity: "10241Mi", wantFree: "0", wantCount: 1, wantHealthy: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := DiskNodeStatus{Disks: tt.disks}
			s.Summarize()
			if got := s.Capacity.String(); got != tt.wantCapacity {
				t.Errorf("Capacity = %s, want %s", got, tt.wantCapacity)
			}
			if got := s.Free.String(); got != tt.wantFree {
				t.Errorf("Free = %s, want %s", got, tt.wantFree)
			}
			if s.DiskCount != tt.wantCount {
				t.Errorf("DiskCount = %d, want %d", s.DiskCount, tt.wantCount)
			}
			if s.HealthyDisks != tt.wantHealthy {
				t.Errorf("HealthyDisks = %d, want %d", s.HealthyDisks, tt.wantHealthy)
			}
		})
	}
}

func TestStale(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name     string
		observed time.Time
		maxAge   time.Duration
		want     bool
	}{
		{name: "fresh", observed: now.Add(-10 * time.Second), maxAge: time.Minute, want: false},
		{name: "exactly max age", observed: now.Add(-time.Minute), maxAge: time.Minute, want: false},
		{name: "too old", observed: now.Add(-time.Minute - time.Second), maxAge: time.Minute, want: true},
		{name: "never observed", maxAge: time.Minute, want: true},
		{name: "check disabled", observed: now.Add(-time.Hour), maxAge: 0, want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := DiskNodeStatus{}
			if !tt.observed.IsZero() {
				s.ObservedTime = metav1.NewTime(tt.observed)
			}
			if got := s.Stale(now, tt.maxAge); got != tt.want {
				t.Fatalf("Stale() = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestUsable(t *testing.T) {
	tests := []struct {
		name        string
		disk        DiskStatus
		deviceClass string
		want        bool
	}{
		{name: "healthy, any class", disk: DiskStatus{Healthy: true, DeviceClass: "ssd"}, want: true},
		{name: "healthy, same class", disk: DiskStatus{Healthy: true, DeviceClass: "ssd"}, deviceClass: "ssd", want: true},
		{name: "healthy, other class", disk: DiskStatus{Healthy: true, DeviceClass: "hdd"}, deviceClass: "ssd", want: false},
		{name: "healthy, no class asked for one", disk: DiskStatus{Healthy: true}, deviceClass: "ssd", want: false},
		{name: "unhealthy", disk: DiskStatus{Healthy: false, DeviceClass: "ssd"}, deviceClass: "ssd", want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.disk.Usable(tt.deviceClass); got != tt.want {
				t.Fatalf("Usable(%q) = %v, want %v", tt.deviceClass, got, tt.want)
			}
		})
	}
}

// The CRD schema and diskfit.ValidateDiskName must agree, or the driver could accept
// a disk name in its config that the API server then refuses to publish.
func TestCRDSchemaMatchesGoRules(t *testing.T) {
	raw, err := os.ReadFile("../../../manifests/base/crd/diskfit.io_disknodes.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(raw, &crd); err != nil {
		t.Fatalf("parsing CRD: %v", err)
	}
	if crd.Spec.Scope != apiextensionsv1.ClusterScoped {
		t.Errorf("scope = %s, want Cluster", crd.Spec.Scope)
	}
	if len(crd.Spec.Versions) != 1 || crd.Spec.Versions[0].Name != SchemeGroupVersion.Version {
		t.Fatalf("versions = %+v, want only %s", crd.Spec.Versions, SchemeGroupVersion.Version)
	}
	v := crd.Spec.Versions[0]
	if v.Subresources == nil || v.Subresources.Status == nil {
		t.Errorf("status subresource missing")
	}
	disks := v.Schema.OpenAPIV3Schema.Properties["status"].Properties["disks"]
	if got := disks.XListType; got == nil || *got != "map" {
		t.Errorf("disks list type = %v, want map", got)
	}
	if got := disks.XListMapKeys; len(got) != 1 || got[0] != "name" {
		t.Errorf("disks list map keys = %v, want [name]", got)
	}
	name := disks.Items.Schema.Properties["name"]
	if name.Pattern != diskfit.DiskNamePattern {
		t.Errorf("CRD disk name pattern = %q, Go pattern = %q", name.Pattern, diskfit.DiskNamePattern)
	}
	if name.MaxLength == nil || *name.MaxLength != diskfit.MaxDiskNameLength {
		t.Errorf("CRD disk name maxLength = %v, want %d", name.MaxLength, diskfit.MaxDiskNameLength)
	}
	for _, field := range []string{"capacityBytes", "freeBytes"} {
		if min := disks.Items.Schema.Properties[field].Minimum; min == nil || *min != 0 {
			t.Errorf("%s minimum = %v, want 0", field, min)
		}
	}
	var columns []string
	for _, c := range v.AdditionalPrinterColumns {
		columns = append(columns, c.Name)
	}
	if got, want := strings.Join(columns, ","), "Disks,Healthy,Unschedulable,Total,Free,Observed,Age"; got != want {
		t.Errorf("printer columns = %s, want %s", got, want)
	}
}
