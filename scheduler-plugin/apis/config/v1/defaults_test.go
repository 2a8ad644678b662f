package v1

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
)

// TestSetDefaults: an unset field takes the documented default; an explicit
// zero is kept (validation then gives it its one meaning), except a weight,
// where 0 and unset are the same and become 1.
func TestSetDefaults(t *testing.T) {
	tests := []struct {
		name string
		in   *DiskFitArgs
		want *DiskFitArgs
	}{
		{
			name: "empty args get every default",
			in:   &DiskFitArgs{},
			want: &DiskFitArgs{
				BindTimeoutSeconds: ptr.To[int64](600),
				ScoringStrategy:    &ScoringStrategy{Type: MostAllocated},
				MaxDiskNodeAge:     &metav1.Duration{Duration: 5 * time.Minute},
				MaxExactClaims:     ptr.To[int32](16),
			},
		},
		{
			name: "set fields are kept, zero weights become 1",
			in: &DiskFitArgs{
				BindTimeoutSeconds: ptr.To[int64](30),
				ScoringStrategy: &ScoringStrategy{Type: LeastAllocated, DeviceClassWeights: []DeviceClassWeight{
					{DeviceClass: "ssd", Weight: 5}, {DeviceClass: "hdd"},
				}},
				MaxDiskNodeAge: &metav1.Duration{Duration: time.Minute},
				MaxExactClaims: ptr.To[int32](3),
			},
			want: &DiskFitArgs{
				BindTimeoutSeconds: ptr.To[int64](30),
				ScoringStrategy: &ScoringStrategy{Type: LeastAllocated, DeviceClassWeights: []DeviceClassWeight{
					{DeviceClass: "ssd", Weight: 5}, {DeviceClass: "hdd", Weight: 1},
				}},
				MaxDiskNodeAge: &metav1.Duration{Duration: time.Minute},
				MaxExactClaims: ptr.To[int32](3),
			},
		},
		{
			name: "explicit zeros are kept, not defaulted",
			in: &DiskFitArgs{
				BindTimeoutSeconds: ptr.To[int64](0),
				ScoringStrategy:    &ScoringStrategy{},
				MaxDiskNodeAge:     &metav1.Duration{},
				MaxExactClaims:     ptr.To[int32](0),
			},
			want: &DiskFitArgs{
				BindTimeoutSeconds: ptr.To[int64](0),
				ScoringStrategy:    &ScoringStrategy{Type: MostAllocated},
				MaxDiskNodeAge:     &metav1.Duration{},
				MaxExactClaims:     ptr.To[int32](0),
			},
		},
	}
	scheme := runtime.NewScheme()
	if err := AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			viaScheme := tc.in.DeepCopy()
			SetObjectDefaults_DiskFitArgs(tc.in)
			if diff := cmp.Diff(tc.want, tc.in); diff != "" {
				t.Errorf("defaults (-want +got):\n%s", diff)
			}
			// The scheme kube-scheduler defaults with must run the same
			// function (RegisterDefaults is registered by AddToScheme).
			scheme.Default(viaScheme)
			if diff := cmp.Diff(tc.want, viaScheme); diff != "" {
				t.Errorf("scheme defaults (-want +got):\n%s", diff)
			}
		})
	}
}
