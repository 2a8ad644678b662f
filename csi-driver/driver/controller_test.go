package driver

import (
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/csi-driver/backend"
	"github.com/diskfit/diskfit/csi-driver/fault"
)

func TestCreateVolumeBadInput(t *testing.T) {
	e := newEnv(t, twoDisks(), nil)
	annotated := func(node, disk string) func(*testing.T, *csi.CreateVolumeRequest) {
		return func(t *testing.T, r *csi.CreateVolumeRequest) {
			ann := map[string]string{diskfit.SelectedDiskAnnotation: disk}
			if node != "" {
				ann[diskfit.SelectedNodeAnnotation] = node
			}
			r.Parameters = e.addPVC(t, "pvc-"+strings.ToLower(t.Name()[strings.LastIndex(t.Name(), "/")+1:]), ann)
		}
	}
	tests := []struct {
		name        string
		mutate      func(*testing.T, *csi.CreateVolumeRequest)
		wantCode    codes.Code
		wantMessage string
	}{
		{name: "empty name", mutate: func(_ *testing.T, r *csi.CreateVolumeRequest) { r.Name = "" }, wantCode: codes.InvalidArgument},
		{name: "over-long name", mutate: func(_ *testing.T, r *csi.CreateVolumeRequest) { r.Name = strings.Repeat("a", 129) }, wantCode: codes.InvalidArgument},
		{name: "NUL in name", mutate: func(_ *testing.T, r *csi.CreateVolumeRequest) { r.Name = "a\x00b" }, wantCode: codes.InvalidArgument},
		{name: "no capabilities", mutate: func(_ *testing.T, r *csi.CreateVolumeRequest) { r.VolumeCapabilities = nil }, wantCode: codes.InvalidArgument},
		{name: "multi-node writer", mutate: func(_ *testing.T, r *csi.CreateVolumeRequest) {
			r.VolumeCapabilities[0].AccessMode.Mode = csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER
		}, wantCode: codes.InvalidArgument},
		{name: "unsupported fstype", mutate: func(_ *testing.T, r *csi.CreateVolumeRequest) {
			r.VolumeCapabilities[0].GetMount().FsType = "btrfs"
		}, wantCode: codes.InvalidArgument},
		{name: "unsupported fstype parameter", mutate: func(_ *testing.T, r *csi.CreateVolumeRequest) {
			r.Parameters[diskfit.FSTypeKey] = "zfs"
		}, wantCode: codes.InvalidArgument},
		{name: "negative size", mutate: func(_ *testing.T, r *csi.CreateVolumeRequest) { r.CapacityRange.RequiredBytes = -1 }, wantCode: codes.InvalidArgument},
		{name: "limit below required", mutate: func(_ *testing.T, r *csi.CreateVolumeRequest) {
			r.CapacityRange = &csi.CapacityRange{RequiredBytes: gi, LimitBytes: gi / 2}
		}, wantCode: codes.InvalidArgument},
		{name: "absurd size", mutate: func(_ *testing.T, r *csi.CreateVolumeRequest) { r.CapacityRange.RequiredBytes = 1 << 60 }, wantCode: codes.OutOfRange},
		{name: "limit below xfs minimum", mutate: func(_ *testing.T, r *csi.CreateVolumeRequest) {
			r.CapacityRange = &csi.CapacityRange{RequiredBytes: mi, LimitBytes: 100 * mi}
		}, wantCode: codes.OutOfRange},
		{name: "larger than any disk", mutate: func(_ *testing.T, r *csi.CreateVolumeRequest) { r.CapacityRange.RequiredBytes = 100 * gi },
			wantCode: codes.ResourceExhausted, wantMessage: "largest free disk big"},
		{name: "no disk of device class", mutate: func(_ *testing.T, r *csi.CreateVolumeRequest) { r.Parameters[diskfit.DeviceClassParameter] = "nvme" },
			wantCode: codes.ResourceExhausted},
		{name: "requisite topology of another node", mutate: func(_ *testing.T, r *csi.CreateVolumeRequest) {
			r.AccessibilityRequirements = &csi.TopologyRequirement{Requisite: []*csi.Topology{{Segments: map[string]string{diskfit.TopologyKey: "node-b"}}}}
		}, wantCode: codes.ResourceExhausted},
		{name: "unknown disk in annotation", mutate: annotated(testNode, "nvme9"), wantCode: codes.ResourceExhausted, wantMessage: `"nvme9"`},
		{name: "annotation for another node", mutate: annotated("node-b", "small"), wantCode: codes.InvalidArgument, wantMessage: "node-b"},
		{name: "annotated disk too full", mutate: func(t *testing.T, r *csi.CreateVolumeRequest) {
			annotated(testNode, "small")(t, r)
			r.CapacityRange.RequiredBytes = 3 * gi
		}, wantCode: codes.ResourceExhausted, wantMessage: "disk small on node node-a has"},
		{name: "annotated disk of another device class", mutate: func(t *testing.T, r *csi.CreateVolumeRequest) {
			annotated(testNode, "small")(t, r)
			r.Parameters[diskfit.DeviceClassParameter] = "hdd"
		}, wantCode: codes.ResourceExhausted},
		{name: "unknown source snapshot", mutate: func(_ *testing.T, r *csi.CreateVolumeRequest) {
			r.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: "small:nope"}}}
		}, wantCode: codes.NotFound},
		{name: "source snapshot ID with traversal", mutate: func(_ *testing.T, r *csi.CreateVolumeRequest) {
			r.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: "small:../x"}}}
		}, wantCode: codes.InvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := createReq("pvc-bad", 500*mi)
			tt.mutate(t, req)
			_, err := e.d.CreateVolume(e.ctx, req)
			wantCode(t, err, tt.wantCode)
			if !strings.Contains(status.Convert(err).Message(), tt.wantMessage) {
				t.Errorf("message %q does not contain %q", status.Convert(err).Message(), tt.wantMessage)
			}
			if files := e.volumeFiles(t); len(files) != 0 {
				t.Errorf("left behind: %v", files)
			}
		})
	}
}

func TestCreateVolumeIdempotent(t *testing.T) {
	e := newEnv(t, twoDisks(), nil)
	first := e.mustCreate(t, createReq("pvc-same", 500*mi))
	again := e.mustCreate(t, createReq("pvc-same", 500*mi))
	if first.VolumeId != again.VolumeId || first.CapacityBytes != again.CapacityBytes {
		t.Errorf("retry returned %v, first call %v", again, first)
	}
	_, err := e.d.CreateVolume(e.ctx, createReq("pvc-same", gi))
	wantCode(t, err, codes.AlreadyExists)
	// external-provisioner's --volume-name-uuid-length cuts the claim's
	// UID in the name, and two claims can then ask for one name: the
	// volume of the one is never the other's.
	forFirst := createReq("pvc-0b5c3f2e", 300*mi)
	forFirst.Parameters = e.addPVC(t, "data-0", nil)
	made := e.mustCreate(t, forFirst)
	forOther := createReq("pvc-0b5c3f2e", 300*mi)
	forOther.Parameters = e.addPVC(t, "data-1", nil)
	if other, err := e.d.CreateVolume(e.ctx, forOther); status.Code(err) != codes.AlreadyExists {
		t.Errorf("CreateVolume of the name of claim default/data-0's volume for claim default/data-1: %v, %v; want AlreadyExists", other, err)
	}
	if again := e.mustCreate(t, forFirst); again.VolumeId != made.VolumeId {
		t.Errorf("retry for claim default/data-0 returned %q, first call %q", again.VolumeId, made.VolumeId)
	}
	// A name that is not a plain key is hashed, and still idempotent.
	odd := "Sanity Volume/with odd name"
	a := e.mustCreate(t, createReq(odd, 400*mi))
	b := e.mustCreate(t, createReq(odd, 400*mi))
	if a.VolumeId != b.VolumeId || !strings.HasPrefix(a.VolumeId, "small:h-") {
		t.Errorf("odd name IDs %q and %q", a.VolumeId, b.VolumeId)
	}
	for _, id := range []string{first.VolumeId, made.VolumeId, a.VolumeId, a.VolumeId} {
		if _, err := e.d.DeleteVolume(e.ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
			t.Fatal(err)
		}
	}
	if files := e.volumeFiles(t); len(files) != 0 {
		t.Errorf("left behind: %v", files)
	}
}

// TestCreateVolumeDiskFillsDuringFallocate fills the disk after the fit
// check and before fallocate, so fallocate really fails with ENOSPC.
func TestCreateVolumeDiskFillsDuringFallocate(t *testing.T) {
	var e *env
	fill := fault.At(fault.CreateVolumeWayCleared, func() {
		// Take nearly all free space with a file outside diskfit's dirs.
		var st unix.Statfs_t
		if err := unix.Statfs(e.paths["only"], &st); err != nil {
			t.Error(err)
			return
		}
		fd, err := unix.Open(e.paths["only"]+"/filler", unix.O_CREAT|unix.O_WRONLY, 0o600)
		if err != nil {
			t.Error(err)
			return
		}
		defer unix.Close(fd)
		if err := unix.Fallocate(fd, 0, 0, int64(st.Bavail)*st.Frsize-8*mi); err != nil {
			t.Error(err)
		}
	})
	e = newEnv(t, []testDisk{{name: "only", fsType: "xfs", size: gi}}, fill)
	_, err := e.d.CreateVolume(e.ctx, createReq("pvc-full", 400*mi))
	wantCode(t, err, codes.ResourceExhausted)
	msg := status.Convert(err).Message()
	if !strings.Contains(msg, "disk only") || !strings.Contains(msg, "needs 419430400") {
		t.Errorf("message %q does not name the disk and the requested bytes", msg)
	}
	if files := e.volumeFiles(t); len(files) != 0 {
		t.Errorf("left behind: %v", files)
	}
}

func TestVolumeIDValidation(t *testing.T) {
	e := newEnv(t, []testDisk{{name: "only", fsType: "xfs", size: gi}}, nil)
	tests := []struct {
		name, id            string
		wantGet, wantDelete codes.Code
	}{
		{name: "empty", id: "", wantGet: codes.InvalidArgument, wantDelete: codes.InvalidArgument},
		{name: "dot dot", id: "only:..", wantGet: codes.InvalidArgument, wantDelete: codes.InvalidArgument},
		{name: "traversal", id: "only:../../etc", wantGet: codes.InvalidArgument, wantDelete: codes.InvalidArgument},
		{name: "slash", id: "only:a/b", wantGet: codes.InvalidArgument, wantDelete: codes.InvalidArgument},
		{name: "NUL", id: "only:a\x00", wantGet: codes.InvalidArgument, wantDelete: codes.InvalidArgument},
		{name: "over-long", id: "only:" + strings.Repeat("a", 300), wantGet: codes.InvalidArgument, wantDelete: codes.InvalidArgument},
		{name: "not ours", id: "fake-vol-id", wantGet: codes.NotFound, wantDelete: codes.OK},
		// A disk taken out of the node config may still hold the volume:
		// an OK would have the PV deleted and the data left untracked.
		{name: "unknown disk", id: "other:pvc-1", wantGet: codes.NotFound, wantDelete: codes.FailedPrecondition},
		{name: "unknown volume", id: "only:pvc-1", wantGet: codes.NotFound, wantDelete: codes.OK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := e.d.ControllerGetVolume(e.ctx, &csi.ControllerGetVolumeRequest{VolumeId: tt.id})
			wantCode(t, err, tt.wantGet)
			_, err = e.d.DeleteVolume(e.ctx, &csi.DeleteVolumeRequest{VolumeId: tt.id})
			wantCode(t, err, tt.wantDelete)
			// A snapshot ID of the same form is judged alike.
			_, err = e.d.DeleteSnapshot(e.ctx, &csi.DeleteSnapshotRequest{SnapshotId: tt.id})
			wantCode(t, err, tt.wantDelete)
			_, err = e.d.NodeExpandVolume(e.ctx, &csi.NodeExpandVolumeRequest{VolumeId: tt.id, VolumePath: e.kubelet + "/t", CapacityRange: &csi.CapacityRange{RequiredBytes: gi}})
			wantCode(t, err, tt.wantGet)
			_, err = e.d.NodeStageVolume(e.ctx, &csi.NodeStageVolumeRequest{VolumeId: tt.id, StagingTargetPath: e.kubelet + "/s", VolumeCapability: mountCap()})
			if tt.id == "" {
				wantCode(t, err, codes.InvalidArgument)
			} else {
				wantCode(t, err, tt.wantGet)
			}
		})
	}
}

func TestGetCapacityAndListVolumes(t *testing.T) {
	e := newEnv(t, twoDisks(), nil)
	usage := map[string]backend.Usage{}
	for _, dk := range e.d.disks() {
		u, err := dk.backend.Usage(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		usage[dk.name] = u
	}
	tests := []struct {
		name               string
		params             map[string]string
		topology           *csi.Topology
		wantTotal, wantMax int64
	}{
		{name: "all disks", wantTotal: usage["small"].FreeBytes + usage["big"].FreeBytes, wantMax: usage["big"].FreeBytes},
		{name: "device class", params: map[string]string{diskfit.DeviceClassParameter: "ssd"}, wantTotal: usage["small"].FreeBytes, wantMax: usage["small"].FreeBytes},
		{name: "unknown device class", params: map[string]string{diskfit.DeviceClassParameter: "nvme"}},
		{name: "other node", topology: &csi.Topology{Segments: map[string]string{diskfit.TopologyKey: "node-b"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := e.d.GetCapacity(e.ctx, &csi.GetCapacityRequest{Parameters: tt.params, AccessibleTopology: tt.topology})
			if err != nil {
				t.Fatal(err)
			}
			// XFS frees a few blocks of its own after mount, so allow 1 MiB.
			near := func(got, want int64) bool { return got >= want && got-want <= mi }
			if !near(resp.AvailableCapacity, tt.wantTotal) || !near(resp.MaximumVolumeSize.GetValue(), tt.wantMax) {
				t.Errorf("capacity %d max %d, want %d and %d", resp.AvailableCapacity, resp.MaximumVolumeSize.GetValue(), tt.wantTotal, tt.wantMax)
			}
		})
	}

	var ids []string
	for _, n := range []string{"pvc-l1", "pvc-l2", "pvc-l3", "pvc-l4", "pvc-l5"} {
		ids = append(ids, e.mustCreate(t, createReq(n, 300*mi)).VolumeId)
	}
	after, err := e.d.GetCapacity(e.ctx, &csi.GetCapacityRequest{Parameters: map[string]string{diskfit.DeviceClassParameter: "ssd"}})
	if err != nil {
		t.Fatal(err)
	}
	if used := usage["small"].FreeBytes - after.AvailableCapacity; used < 5*300*mi {
		t.Errorf("five 300MiB volumes took only %d bytes of the small disk", used)
	}
	var seen []string
	token := ""
	for pages := 0; ; pages++ {
		resp, err := e.d.ListVolumes(e.ctx, &csi.ListVolumesRequest{MaxEntries: 2, StartingToken: token})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Entries) > 2 {
			t.Fatalf("page of %d entries", len(resp.Entries))
		}
		for _, en := range resp.Entries {
			seen = append(seen, en.Volume.VolumeId)
		}
		if token = resp.NextToken; token == "" {
			break
		}
		if pages > 5 {
			t.Fatal("paging does not end")
		}
	}
	if strings.Join(seen, ",") != strings.Join(ids, ",") {
		t.Errorf("listed %v, want %v", seen, ids)
	}
	_, err = e.d.ListVolumes(e.ctx, &csi.ListVolumesRequest{StartingToken: "invalid-token"})
	wantCode(t, err, codes.Aborted)
	_, err = e.d.ListVolumes(e.ctx, &csi.ListVolumesRequest{MaxEntries: -1})
	wantCode(t, err, codes.InvalidArgument)
}
