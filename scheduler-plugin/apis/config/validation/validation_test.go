package validation

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/diskfit/diskfit/scheduler-plugin/apis/config"
)

func validArgs() *config.DiskFitArgs {
	return &config.DiskFitArgs{
		BindTimeoutSeconds: 600,
		ScoringStrategy:    config.ScoringStrategy{Type: config.MostAllocated},
		MaxDiskNodeAge:     metav1.Duration{Duration: 5 * time.Minute},
		MaxExactClaims:     8,
	}
}

func TestValidateDiskFitArgs(t *testing.T) {
	tests := []struct {
		name    string
		modify  func(*config.DiskFitArgs)
		wantErr string // empty: valid
	}{
		{name: "defaults are valid", modify: func(*config.DiskFitArgs) {}},
		{name: "LeastAllocated with weights", modify: func(a *config.DiskFitArgs) {
			a.ScoringStrategy = config.ScoringStrategy{Type: config.LeastAllocated, DeviceClassWeights: []config.DeviceClassWeight{{DeviceClass: "ssd", Weight: 100}, {DeviceClass: "", Weight: 1}}}
		}},
		{name: "age check disabled", modify: func(a *config.DiskFitArgs) { a.MaxDiskNodeAge.Duration = 0 }},
		{name: "exact packing disabled", modify: func(a *config.DiskFitArgs) { a.MaxExactClaims = 0 }},
		{name: "negative bind timeout", modify: func(a *config.DiskFitArgs) { a.BindTimeoutSeconds = -1 }, wantErr: "args.bindTimeoutSeconds"},
		{name: "unknown strategy", modify: func(a *config.DiskFitArgs) { a.ScoringStrategy.Type = "Random" }, wantErr: `args.scoringStrategy.type: Unsupported value: "Random"`},
		{name: "empty strategy", modify: func(a *config.DiskFitArgs) { a.ScoringStrategy.Type = "" }, wantErr: "args.scoringStrategy.type"},
		{name: "weight zero", modify: func(a *config.DiskFitArgs) {
			a.ScoringStrategy.DeviceClassWeights = []config.DeviceClassWeight{{DeviceClass: "ssd"}}
		}, wantErr: "args.scoringStrategy.deviceClassWeights[0].weight"},
		{name: "weight too large", modify: func(a *config.DiskFitArgs) {
			a.ScoringStrategy.DeviceClassWeights = []config.DeviceClassWeight{{DeviceClass: "ssd", Weight: 101}}
		}, wantErr: "args.scoringStrategy.deviceClassWeights[0].weight"},
		{name: "duplicate class", modify: func(a *config.DiskFitArgs) {
			a.ScoringStrategy.DeviceClassWeights = []config.DeviceClassWeight{{DeviceClass: "ssd", Weight: 1}, {DeviceClass: "ssd", Weight: 2}}
		}, wantErr: "args.scoringStrategy.deviceClassWeights[1].deviceClass: Duplicate value"},
		{name: "negative age", modify: func(a *config.DiskFitArgs) { a.MaxDiskNodeAge.Duration = -time.Second }, wantErr: "args.maxDiskNodeAge"},
		{name: "too many exact claims", modify: func(a *config.DiskFitArgs) { a.MaxExactClaims = 13 }, wantErr: "args.maxExactClaims"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			args := validArgs()
			tc.modify(args)
			err := ValidateDiskFitArgs(nil, args)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}
