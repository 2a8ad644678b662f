package driver

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/diskfit/diskfit/apis/diskfit"
)

func TestSelectedDisk(t *testing.T) {
	tests := []struct {
		name        string
		node, disk  string
		wantDisk    string
		wantCode    codes.Code
		wantMessage string
	}{
		{name: "this node", node: testNode, disk: "nvme0", wantDisk: "nvme0"},
		{name: "no disk", node: testNode},
		{name: "stale disk without node", disk: "nvme0"},
		{name: "another node", node: "node-b", disk: "nvme0", wantCode: codes.InvalidArgument, wantMessage: "node-b"},
		// Malformed names used to be returned as they were; they cannot
		// name a disk, so they are refused like an unknown disk.
		{name: "traversal", node: testNode, disk: "../../etc", wantCode: codes.ResourceExhausted, wantMessage: `"../../etc"`},
		{name: "upper case", node: testNode, disk: "NVMe0", wantCode: codes.ResourceExhausted, wantMessage: "lower-case"},
		{name: "dot dot inside", node: testNode, disk: "a..b", wantCode: codes.ResourceExhausted, wantMessage: `".."`},
		{name: "too long", node: testNode, disk: strings.Repeat("a", 64), wantCode: codes.ResourceExhausted, wantMessage: "longer than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ann := map[string]string{}
			if tt.node != "" {
				ann[diskfit.SelectedNodeAnnotation] = tt.node
			}
			if tt.disk != "" {
				ann[diskfit.SelectedDiskAnnotation] = tt.disk
			}
			got, err := selectedDisk(ann, testNode)
			if c := status.Code(err); c != tt.wantCode || !strings.Contains(status.Convert(err).Message(), tt.wantMessage) {
				t.Fatalf("selectedDisk = %q, %v; want code %s with %q", got, err, tt.wantCode, tt.wantMessage)
			}
			if got != tt.wantDisk {
				t.Fatalf("selectedDisk = %q, want %q", got, tt.wantDisk)
			}
		})
	}
}
