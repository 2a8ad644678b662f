package validation

import (
	"fmt"
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
		MaxExactClaims:     16,
	}
}

// TestValidateDiskFitArgs checks which args are accepted and that each
// rejection names the field and the message built from the bounds.
func TestValidateDiskFitArgs(t *testing.T) {
	tests := []struct {
		name    string
		modify  func(*config.DiskFitArgs)
		wantErr string // empty: valid
	}{
		{name: "defaults are valid", modify: func(*config.DiskFitArgs) {}},
		{name: "LeastAllocated with weights", modify: func(a *config.DiskFitArgs) {
			a.ScoringStrategy = config.ScoringStrategy{Type: config.LeastAllocated, DeviceClassWeights: []config.DeviceClassWeight{{DeviceClass: "ssd", Weight: MaxWeight}, {DeviceClass: "", Weight: MinWeight}}}
		}},
		{name: "shortest bind timeout", modify: func(a *config.DiskFitArgs) { a.BindTimeoutSeconds = MinBindTimeoutSeconds }},
		{name: "age check disabled", modify: func(a *config.DiskFitArgs) { a.MaxDiskNodeAge.Duration = 0 }},
		{name: "exact packing disabled", modify: func(a *config.DiskFitArgs) { a.MaxExactClaims = 0 }},
		{name: "most exact claims", modify: func(a *config.DiskFitArgs) { a.MaxExactClaims = MaxExactClaimsLimit }},
		{name: "zero bind timeout", modify: func(a *config.DiskFitArgs) { a.BindTimeoutSeconds = 0 },
			wantErr: "args.bindTimeoutSeconds: Invalid value: 0: must be at least 1"},
		{name: "negative bind timeout", modify: func(a *config.DiskFitArgs) { a.BindTimeoutSeconds = -1 },
			wantErr: "args.bindTimeoutSeconds: Invalid value: -1: must be at least 1"},
		{name: "unknown strategy", modify: func(a *config.DiskFitArgs) { a.ScoringStrategy.Type = "Random" },
			wantErr: `args.scoringStrategy.type: Unsupported value: "Random": supported values: "MostAllocated", "LeastAllocated"`},
		{name: "empty strategy", modify: func(a *config.DiskFitArgs) { a.ScoringStrategy.Type = "" },
			wantErr: `args.scoringStrategy.type: Unsupported value: ""`},
		{name: "weight zero", modify: func(a *config.DiskFitArgs) {
			a.ScoringStrategy.DeviceClassWeights = []config.DeviceClassWeight{{DeviceClass: "ssd"}}
		}, wantErr: "args.scoringStrategy.deviceClassWeights[0].weight: Invalid value: 0: must be between 1 and 100"},
		{name: "weight too large", modify: func(a *config.DiskFitArgs) {
			a.ScoringStrategy.DeviceClassWeights = []config.DeviceClassWeight{{DeviceClass: "ssd", Weight: MaxWeight + 1}}
		}, wantErr: "args.scoringStrategy.deviceClassWeights[0].weight: Invalid value: 101: must be between 1 and 100"},
		{name: "duplicate class", modify: func(a *config.DiskFitArgs) {
			a.ScoringStrategy.DeviceClassWeights = []config.DeviceClassWeight{{DeviceClass: "ssd", Weight: 1}, {DeviceClass: "ssd", Weight: 2}}
		}, wantErr: "args.scoringStrategy.deviceClassWeights[1].deviceClass: Duplicate value"},
		{name: "negative age", modify: func(a *config.DiskFitArgs) { a.MaxDiskNodeAge.Duration = -time.Second },
			wantErr: `args.maxDiskNodeAge: Invalid value: "-1s": must not be negative; 0s disables the check`},
		{name: "negative exact claims", modify: func(a *config.DiskFitArgs) { a.MaxExactClaims = -1 },
			wantErr: "args.maxExactClaims: Invalid value: -1: must be between 0 (greedy only) and 16"},
		{name: "too many exact claims", modify: func(a *config.DiskFitArgs) { a.MaxExactClaims = MaxExactClaimsLimit + 1 },
			wantErr: "args.maxExactClaims: Invalid value: 17: must be between 0 (greedy only) and 16"},
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

// TestMessagesFollowTheConstants: every bound and strategy name in a
// message comes from the constant the check uses, so changing a constant
// changes the check and its message together.
func TestMessagesFollowTheConstants(t *testing.T) {
	for msg, want := range map[string][]int{
		bindTimeoutSecondsMessage: {MinBindTimeoutSeconds},
		weightMessage:             {MinWeight, MaxWeight},
		maxExactClaimsMessage:     {MaxExactClaimsLimit},
	} {
		for _, n := range want {
			if !strings.Contains(msg, fmt.Sprint(n)) {
				t.Errorf("message %q does not name its bound %d", msg, n)
			}
		}
	}
	args := validArgs()
	args.ScoringStrategy.Type = "Random"
	err := ValidateDiskFitArgs(nil, args)
	for _, s := range config.ScoringStrategyTypes() {
		if err == nil || !strings.Contains(err.Error(), `"`+string(s)+`"`) {
			t.Errorf("unsupported-strategy error %v does not list %q", err, s)
		}
		args.ScoringStrategy.Type = s
		if err := ValidateDiskFitArgs(nil, args); err != nil {
			t.Errorf("strategy %q: %v", s, err)
		}
	}
}
