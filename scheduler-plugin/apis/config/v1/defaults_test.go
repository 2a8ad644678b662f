package v1

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/diskfit/diskfit/scheduler-plugin/apis/config"
)

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
				MaxExactClaims:     ptr.To[int32](8),
			},
		},
		{
			name: "set fields are kept, zero weights become 1",
			in: &DiskFitArgs{
				BindTimeoutSeconds: ptr.To[int64](30),
				ScoringStrategy: &ScoringStrategy{Type: LeastAllocated, DeviceClassWeights: []DeviceClassWeight{
					{DeviceClass: "ssd", Weight: 5}, {DeviceClass: "hdd"},
				}},
				MaxDiskNodeAge: &metav1.Duration{},
				MaxExactClaims: ptr.To[int32](0),
			},
			want: &DiskFitArgs{
				BindTimeoutSeconds: ptr.To[int64](30),
				ScoringStrategy: &ScoringStrategy{Type: LeastAllocated, DeviceClassWeights: []DeviceClassWeight{
					{DeviceClass: "ssd", Weight: 5}, {DeviceClass: "hdd", Weight: 1},
				}},
				MaxDiskNodeAge: &metav1.Duration{},
				MaxExactClaims: ptr.To[int32](0),
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			SetDefaults_DiskFitArgs(tc.in)
			if diff := cmp.Diff(tc.want, tc.in); diff != "" {
				t.Errorf("defaults (-want +got):\n%s", diff)
			}
		})
	}
}

func TestConversionRoundTrip(t *testing.T) {
	in := &DiskFitArgs{
		BindTimeoutSeconds: ptr.To[int64](30),
		ScoringStrategy:    &ScoringStrategy{Type: LeastAllocated, DeviceClassWeights: []DeviceClassWeight{{DeviceClass: "ssd", Weight: 5}}},
		MaxDiskNodeAge:     &metav1.Duration{Duration: time.Minute},
		MaxExactClaims:     ptr.To[int32](6),
	}
	internal := &config.DiskFitArgs{}
	if err := Convert_v1_DiskFitArgs_To_config_DiskFitArgs(in, internal, nil); err != nil {
		t.Fatal(err)
	}
	want := &config.DiskFitArgs{
		BindTimeoutSeconds: 30,
		ScoringStrategy:    config.ScoringStrategy{Type: config.LeastAllocated, DeviceClassWeights: []config.DeviceClassWeight{{DeviceClass: "ssd", Weight: 5}}},
		MaxDiskNodeAge:     metav1.Duration{Duration: time.Minute},
		MaxExactClaims:     6,
	}
	if diff := cmp.Diff(want, internal); diff != "" {
		t.Errorf("to internal (-want +got):\n%s", diff)
	}
	back := &DiskFitArgs{}
	if err := Convert_config_DiskFitArgs_To_v1_DiskFitArgs(internal, back, nil); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(in, back); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
	// DeepCopy must not share pointers.
	c := in.DeepCopy()
	*c.BindTimeoutSeconds = 1
	c.ScoringStrategy.DeviceClassWeights[0].Weight = 1
	if *in.BindTimeoutSeconds != 30 || in.ScoringStrategy.DeviceClassWeights[0].Weight != 5 {
		t.Error("DeepCopy shares memory with the original")
	}
}
