package diskfit

import (
	"strings"
	"testing"
)

func TestValidateDiskName(t *testing.T) {
	tests := []struct {
		name    string
		disk    string
		wantErr string
	}{
		{name: "simple", disk: "nvme0"},
		{name: "dots dashes underscores", disk: "ssd-1.a_b"},
		{name: "single character", disk: "a"},
		{name: "longest allowed", disk: strings.Repeat("a", MaxDiskNameLength)},
		{name: "empty", disk: "", wantErr: "empty"},
		{name: "too long", disk: strings.Repeat("a", MaxDiskNameLength+1), wantErr: "longer than"},
		{name: "upper case", disk: "NVMe0", wantErr: "lower-case"},
		{name: "slash", disk: "a/b", wantErr: "lower-case"},
		{name: "dot dot", disk: "..", wantErr: "lower-case"},
		// Its volume IDs would contain ".." and be refused (found by FuzzIDRoundTrip).
		{name: "dot dot inside", disk: "a..b", wantErr: `must not contain ".."`},
		{name: "single dots", disk: "a.b.c"},
		{name: "leading dash", disk: "-a", wantErr: "lower-case"},
		{name: "trailing dot", disk: "a.", wantErr: "lower-case"},
		{name: "NUL", disk: "a\x00b", wantErr: "lower-case"},
		{name: "space", disk: "a b", wantErr: "lower-case"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := ValidateDiskName(tt.disk)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("ValidateDiskName(%q) = %v, want nil", tt.disk, err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("ValidateDiskName(%q) = %v, want error containing %q", tt.disk, err, tt.wantErr)
			}
		})
	}
}
