package driver

import (
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
)

// TestRPCArgumentErrors calls every RPC with missing, malformed or unknown
// arguments and checks the code the CSI spec asks for.
func TestRPCArgumentErrors(t *testing.T) {
	e := newEnv(t, []testDisk{{name: "xfs", fsType: "xfs", size: gi}}, nil)
	d, ctx := e.d, e.ctx
	vol := e.mustCreate(t, createReq("pvc-args", 400*mi))
	in := func(p string) string { return e.kubelet + "/" + p }
	multi := mountCap()
	multi.AccessMode.Mode = csi.VolumeCapability_AccessMode_MULTI_NODE_SINGLE_WRITER
	tests := []struct {
		name string
		call func() error
		want codes.Code
	}{
		{"ValidateVolumeCapabilities without capabilities", func() error {
			_, err := d.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{VolumeId: vol.VolumeId})
			return err
		}, codes.InvalidArgument},
		{"ValidateVolumeCapabilities of an unknown volume", func() error {
			_, err := d.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{VolumeId: "xfs:nope", VolumeCapabilities: []*csi.VolumeCapability{mountCap()}})
			return err
		}, codes.NotFound},
		{"ValidateVolumeCapabilities with NUL in the ID", func() error {
			_, err := d.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{VolumeId: "xfs:\x00", VolumeCapabilities: []*csi.VolumeCapability{mountCap()}})
			return err
		}, codes.InvalidArgument},
		{"ControllerExpandVolume, which only the node does", func() error {
			_, err := d.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: vol.VolumeId, CapacityRange: &csi.CapacityRange{RequiredBytes: 2 * gi}})
			return err
		}, codes.Unimplemented},
		{"CreateSnapshot without a name", func() error {
			_, err := d.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{SourceVolumeId: vol.VolumeId})
			return err
		}, codes.InvalidArgument},
		{"CreateSnapshot with an over-long name", func() error {
			_, err := d.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: strings.Repeat("s", 129), SourceVolumeId: vol.VolumeId})
			return err
		}, codes.InvalidArgument},
		{"CreateSnapshot without a source", func() error {
			_, err := d.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "s"})
			return err
		}, codes.InvalidArgument},
		{"CreateSnapshot of an unknown volume", func() error {
			_, err := d.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "s", SourceVolumeId: "xfs:nope"})
			return err
		}, codes.NotFound},
		{"DeleteSnapshot without an ID", func() error {
			_, err := d.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{})
			return err
		}, codes.InvalidArgument},
		{"DeleteSnapshot of an unknown snapshot", func() error {
			_, err := d.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: "xfs:nope"})
			return err
		}, codes.OK},
		{"GetSnapshot of an unknown snapshot", func() error {
			_, err := d.GetSnapshot(ctx, &csi.GetSnapshotRequest{SnapshotId: "xfs:nope"})
			return err
		}, codes.NotFound},
		{"GetSnapshot with a slash", func() error {
			_, err := d.GetSnapshot(ctx, &csi.GetSnapshotRequest{SnapshotId: "xfs:a/b"})
			return err
		}, codes.InvalidArgument},
		{"ListSnapshots with a foreign token", func() error {
			_, err := d.ListSnapshots(ctx, &csi.ListSnapshotsRequest{StartingToken: "nope"})
			return err
		}, codes.Aborted},
		{"ControllerGetVolumeHealth without an ID", func() error {
			_, err := d.ControllerGetVolumeHealth(ctx, &csi.ControllerGetVolumeHealthRequest{})
			return err
		}, codes.InvalidArgument},
		{"NodeGetVolumeHealth of an unknown volume", func() error {
			_, err := d.NodeGetVolumeHealth(ctx, &csi.NodeGetVolumeHealthRequest{VolumeId: "xfs:nope"})
			return err
		}, codes.NotFound},
		{"NodeStageVolume without a capability", func() error {
			_, err := d.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: in("s")})
			return err
		}, codes.InvalidArgument},
		{"NodeStageVolume multi-node", func() error {
			_, err := d.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: in("s"), VolumeCapability: multi})
			return err
		}, codes.InvalidArgument},
		{"NodeStageVolume without a staging path", func() error {
			_, err := d.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.VolumeId, VolumeCapability: mountCap()})
			return err
		}, codes.InvalidArgument},
		{"NodeUnstageVolume outside the kubelet dir", func() error {
			_, err := d.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: "/etc"})
			return err
		}, codes.InvalidArgument},
		{"NodeUnstageVolume of an unknown volume", func() error {
			_, err := d.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "other:nope", StagingTargetPath: in("s")})
			return err
		}, codes.NotFound},
		{"NodeUnstageVolume of a volume never staged", func() error {
			_, err := d.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: in("s")})
			return err
		}, codes.OK},
		{"NodePublishVolume without a staging path", func() error {
			_, err := d.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: vol.VolumeId, TargetPath: in("t"), VolumeCapability: mountCap()})
			return err
		}, codes.InvalidArgument},
		{"NodePublishVolume of an unknown volume", func() error {
			_, err := d.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: "xfs:nope", StagingTargetPath: in("s"), TargetPath: in("t"), VolumeCapability: mountCap()})
			return err
		}, codes.NotFound},
		{"NodeUnpublishVolume outside the kubelet dir", func() error {
			_, err := d.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vol.VolumeId, TargetPath: "/tmp"})
			return err
		}, codes.InvalidArgument},
		{"NodeGetVolumeStats where it is not published", func() error {
			_, err := d.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: vol.VolumeId, VolumePath: in("t")})
			return err
		}, codes.NotFound},
		{"NodeExpandVolume of a volume not staged", func() error {
			_, err := d.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: vol.VolumeId, VolumePath: in("t"), CapacityRange: &csi.CapacityRange{RequiredBytes: 2 * gi}})
			return err
		}, codes.FailedPrecondition},
		{"NodeExpandVolume without a path", func() error {
			_, err := d.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: vol.VolumeId})
			return err
		}, codes.InvalidArgument},
		{"NodeExpandVolume with limit below required", func() error {
			_, err := d.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: vol.VolumeId, VolumePath: in("t"), CapacityRange: &csi.CapacityRange{RequiredBytes: 2 * gi, LimitBytes: gi}})
			return err
		}, codes.InvalidArgument},
		{"NodeExpandVolume multi-node", func() error {
			_, err := d.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: vol.VolumeId, VolumePath: in("t"), VolumeCapability: multi})
			return err
		}, codes.InvalidArgument},
		{"NodeExpandVolume of an unknown volume", func() error {
			_, err := d.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: "xfs:nope", VolumePath: in("t"), CapacityRange: &csi.CapacityRange{RequiredBytes: 2 * gi}})
			return err
		}, codes.NotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantCode(t, tt.call(), tt.want)
		})
	}
	// None of the failed expansions grew the volume.
	if got, err := d.ControllerGetVolume(ctx, &csi.ControllerGetVolumeRequest{VolumeId: vol.VolumeId}); err != nil || got.Volume.CapacityBytes != vol.CapacityBytes {
		t.Errorf("after the failed expansions: %v, %v; want %d bytes", got, err, vol.CapacityBytes)
	}
	resp, err := d.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{VolumeId: vol.VolumeId, VolumeCapabilities: []*csi.VolumeCapability{multi}})
	if err != nil || resp.Confirmed != nil || resp.Message == "" {
		t.Errorf("multi-node capability validated as %v, %v", resp, err)
	}
	resp, err = d.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{VolumeId: vol.VolumeId, VolumeCapabilities: []*csi.VolumeCapability{blockCap()}})
	if err != nil || resp.Confirmed == nil {
		t.Errorf("block capability validated as %v, %v", resp, err)
	}
}
