package v1

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/diskfit/diskfit/scheduler-plugin/apis/config"
)

// fill sets every field reachable from v, except TypeMeta (which the scheme
// owns), to a distinct non-zero value: pointers are allocated, slices get
// two elements, numbers and strings count up from 1000 (so none equals a
// default). A field of a kind it does not know fails the test, so a new
// field cannot escape the round trips below.
func fill(t *testing.T, v reflect.Value, path string, n *int) {
	t.Helper()
	*n++
	switch v.Kind() {
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(t, v.Elem(), path, n)
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			f := v.Type().Field(i)
			if f.Type == reflect.TypeOf(metav1.TypeMeta{}) {
				continue
			}
			fill(t, v.Field(i), path+"."+f.Name, n)
		}
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 2, 2))
		for i := 0; i < 2; i++ {
			fill(t, v.Index(i), fmt.Sprintf("%s[%d]", path, i), n)
		}
	case reflect.String:
		v.SetString(fmt.Sprintf("value-%d", 1000+*n))
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(int64(1000 + *n))
	case reflect.Bool:
		v.SetBool(true)
	default:
		t.Fatalf("fill: %s has kind %s; teach fill to set it", path, v.Kind())
	}
}

// zeroFields lists the fields reachable from v that hold their zero value
// (nil pointers and empty slices included), TypeMeta excepted.
func zeroFields(v reflect.Value, path string) []string {
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			return []string{path}
		}
		return zeroFields(v.Elem(), path)
	case reflect.Struct:
		var out []string
		for i := 0; i < v.NumField(); i++ {
			f := v.Type().Field(i)
			if f.Type == reflect.TypeOf(metav1.TypeMeta{}) {
				continue
			}
			out = append(out, zeroFields(v.Field(i), path+"."+f.Name)...)
		}
		return out
	case reflect.Slice:
		if v.Len() == 0 {
			return []string{path}
		}
		var out []string
		for i := 0; i < v.Len(); i++ {
			out = append(out, zeroFields(v.Index(i), fmt.Sprintf("%s[%d]", path, i))...)
		}
		return out
	default:
		if v.IsZero() {
			return []string{path}
		}
		return nil
	}
}

func newScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	if err := config.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return s
}

// roundTrip fills in with every field set, converts it to mid and back
// through the scheme kube-scheduler converts with, and fails when a field
// is unset on the way or differs at the end.
func roundTrip(t *testing.T, in, mid, back runtime.Object) {
	t.Helper()
	scheme := newScheme(t)
	n := 0
	fill(t, reflect.ValueOf(in).Elem(), fmt.Sprintf("%T", in), &n)
	for _, step := range []struct{ from, to runtime.Object }{{nil, in}, {in, mid}, {mid, back}} {
		if step.from != nil {
			if err := scheme.Convert(step.from, step.to, nil); err != nil {
				t.Fatal(err)
			}
		}
		if zero := zeroFields(reflect.ValueOf(step.to), fmt.Sprintf("%T", step.to)); len(zero) > 0 {
			t.Errorf("fields unset: %s", strings.Join(zero, ", "))
		}
	}
	if diff := cmp.Diff(in, back); diff != "" {
		t.Errorf("%T → %T → %T (-want +got):\n%s", in, mid, back, diff)
	}
}

// TestRoundTripV1: v1 args with every field set survive v1 → internal → v1.
// A field added to v1 and not carried by the conversion (missing in the
// internal type, or dropped by a hand-written or stale generated function)
// makes it fail.
func TestRoundTripV1(t *testing.T) {
	roundTrip(t, &DiskFitArgs{}, &config.DiskFitArgs{}, &DiskFitArgs{})
}

// TestRoundTripInternal: internal args with every field set survive
// internal → v1 → internal; a field added to the internal type and not
// carried makes it fail.
func TestRoundTripInternal(t *testing.T) {
	roundTrip(t, &config.DiskFitArgs{}, &DiskFitArgs{}, &config.DiskFitArgs{})
}

// TestConvertValues pins what the conversion does with concrete values,
// including the hand-written *ScoringStrategy conversions: nil becomes the
// zero internal strategy, and internal → v1 always allocates one.
func TestConvertValues(t *testing.T) {
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

	nilStrategy := &config.DiskFitArgs{ScoringStrategy: config.ScoringStrategy{Type: config.MostAllocated}}
	if err := Convert_v1_DiskFitArgs_To_config_DiskFitArgs(&DiskFitArgs{}, nilStrategy, nil); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(&config.DiskFitArgs{}, nilStrategy); diff != "" {
		t.Errorf("unset v1 fields to internal (-want +got):\n%s", diff)
	}
	out := &DiskFitArgs{}
	if err := Convert_config_DiskFitArgs_To_v1_DiskFitArgs(&config.DiskFitArgs{}, out, nil); err != nil {
		t.Fatal(err)
	}
	if out.ScoringStrategy == nil || out.BindTimeoutSeconds == nil || out.MaxDiskNodeAge == nil || out.MaxExactClaims == nil {
		t.Errorf("internal → v1 left a pointer nil: %+v", out)
	}
}

// TestDeepCopy: the generated deep copies are equal to the original and
// share no memory with it.
func TestDeepCopy(t *testing.T) {
	in := &DiskFitArgs{}
	n := 0
	fill(t, reflect.ValueOf(in).Elem(), "DiskFitArgs", &n)
	c := in.DeepCopyObject().(*DiskFitArgs)
	if diff := cmp.Diff(in, c); diff != "" {
		t.Fatalf("v1 copy differs (-want +got):\n%s", diff)
	}
	*c.BindTimeoutSeconds = 1
	c.MaxDiskNodeAge.Duration = 1
	*c.MaxExactClaims = 1
	c.ScoringStrategy.Type = "changed"
	c.ScoringStrategy.DeviceClassWeights[0].Weight = 1
	if *in.BindTimeoutSeconds == 1 || in.MaxDiskNodeAge.Duration == 1 || *in.MaxExactClaims == 1 ||
		in.ScoringStrategy.Type == "changed" || in.ScoringStrategy.DeviceClassWeights[0].Weight == 1 {
		t.Error("v1 DeepCopy shares memory with the original")
	}

	ii := &config.DiskFitArgs{}
	fill(t, reflect.ValueOf(ii).Elem(), "config.DiskFitArgs", &n)
	ic := ii.DeepCopyObject().(*config.DiskFitArgs)
	if diff := cmp.Diff(ii, ic); diff != "" {
		t.Fatalf("internal copy differs (-want +got):\n%s", diff)
	}
	ic.ScoringStrategy.DeviceClassWeights[0].Weight = 1
	if ii.ScoringStrategy.DeviceClassWeights[0].Weight == 1 {
		t.Error("internal DeepCopy shares memory with the original")
	}
}
