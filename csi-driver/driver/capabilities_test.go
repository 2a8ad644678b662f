package driver

import (
	"context"
	"slices"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestVolumeSize(t *testing.T) {
	tests := []struct {
		name     string
		req, lim int64
		block    bool
		want     int64
		wantCode codes.Code
	}{
		{name: "default", want: gi},
		{name: "default capped by the limit", lim: 500 * mi, want: 500 * mi},
		{name: "filesystem floor", req: mi, want: 300 * mi},
		{name: "block floor", req: 4096, block: true, want: mi},
		{name: "rounded to MiB", req: gi + 1, want: gi + mi},
		{name: "exact limit", req: gi, lim: gi, want: gi},
		{name: "negative required", req: -1, wantCode: codes.InvalidArgument},
		{name: "negative limit", lim: -1, wantCode: codes.InvalidArgument},
		{name: "limit below required", req: 2 * gi, lim: gi, wantCode: codes.InvalidArgument},
		{name: "absurd", req: 1 << 51, wantCode: codes.OutOfRange},
		{name: "limit below the filesystem floor", req: mi, lim: 10 * mi, wantCode: codes.OutOfRange},
		{name: "limit below the rounded size", req: gi + 1, lim: gi + 2, wantCode: codes.OutOfRange},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := volumeSize(&csi.CapacityRange{RequiredBytes: tt.req, LimitBytes: tt.lim}, tt.block)
			if status.Code(err) != tt.wantCode || got != tt.want {
				t.Errorf("volumeSize = %d, %v; want %d, %s", got, err, tt.want, tt.wantCode)
			}
		})
	}
}

// TestExpansionIsNodeOnly checks what external-resizer and the kubelet
// read: online expansion is supported and done by the node service, and
// the controller neither advertises nor serves it, so the resizer never
// sends ControllerExpandVolume to a node that does not have the volume.
func TestExpansionIsNodeOnly(t *testing.T) {
	d := &Driver{}
	ctx := context.Background()
	ccaps, err := d.ControllerGetCapabilities(ctx, &csi.ControllerGetCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range ccaps.GetCapabilities() {
		if c.GetRpc().GetType() == csi.ControllerServiceCapability_RPC_EXPAND_VOLUME {
			t.Error("ControllerGetCapabilities lists EXPAND_VOLUME")
		}
	}
	ncaps, err := d.NodeGetCapabilities(ctx, &csi.NodeGetCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(ncaps.GetCapabilities(), func(c *csi.NodeServiceCapability) bool {
		return c.GetRpc().GetType() == csi.NodeServiceCapability_RPC_EXPAND_VOLUME
	}) {
		t.Error("NodeGetCapabilities does not list EXPAND_VOLUME")
	}
	pcaps, err := d.GetPluginCapabilities(ctx, &csi.GetPluginCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(pcaps.GetCapabilities(), func(c *csi.PluginCapability) bool {
		return c.GetVolumeExpansion().GetType() == csi.PluginCapability_VolumeExpansion_ONLINE
	}) {
		t.Error("GetPluginCapabilities does not offer online volume expansion")
	}
	_, err = d.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: "disk:pvc-1", CapacityRange: &csi.CapacityRange{RequiredBytes: gi}})
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("ControllerExpandVolume: %v, want Unimplemented", err)
	}
}
