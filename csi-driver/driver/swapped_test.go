package driver

import (
	"os"
	"slices"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/diskfit/diskfit/apis/diskfit"
)

// TestSwappedDisksAreNotServedUnderEachOthersNames: a volume ID names its
// disk, and a disk is the filesystem mounted at its path. When the node
// boots with two disks' filesystems at each other's paths (mounted by
// device name, which the kernel may hand out in another order at every
// boot), neither disk is served under the other's name, also when one of
// them holds nothing yet: calls for both answer Unavailable, as for a disk
// that did not come up. Before, DeleteVolume of a volume answered OK with
// its data still on the node (Kubernetes deletes the PV, nothing tracks
// the data), and the volume was served under the other disk's name,
// listed without a PV there, ready for diskfit reclaim to delete while
// its claim still wants it. Once the mounts are put right, both disks
// serve their volumes.
func TestSwappedDisksAreNotServedUnderEachOthersNames(t *testing.T) {
	for _, tt := range []struct {
		name string
		// bothHoldVolumes: disk b holds a volume too, else it is empty.
		bothHoldVolumes bool
	}{{"both hold volumes", true}, {"one is empty", false}} {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, []testDisk{
				{name: "a", class: "ssd", fsType: "xfs", size: 1 * gi},
				{name: "b", class: "hdd", fsType: "xfs", size: 1 * gi},
			}, nil)
			create := func(name, class string) string {
				req := createReq(name, 300*mi)
				req.Parameters[diskfit.DeviceClassParameter] = class
				return e.mustCreate(t, req).VolumeId
			}
			ids := []string{create("pvc-on-a", "ssd")}
			if tt.bothHoldVolumes {
				ids = append(ids, create("pvc-on-b", "hdd"))
			}
			if ids[0] != "a:pvc-on-a" || (tt.bothHoldVolumes && ids[1] != "b:pvc-on-b") {
				t.Fatalf("volumes %v, want one on each disk", ids)
			}

			// The node boots with the filesystems at each other's paths.
			swapped := e.d.cfg
			node := *swapped.Node
			node.Disks = slices.Clone(node.Disks)
			node.Disks[0].Path, node.Disks[1].Path = node.Disks[1].Path, node.Disks[0].Path
			swapped.Node = &node
			d := e.restart(t, swapped)

			_, err := d.DeleteVolume(e.ctx, &csi.DeleteVolumeRequest{VolumeId: ids[0]})
			wantCode(t, err, codes.Unavailable)
			if _, err := os.Stat(dataPath(e.paths["a"], "pvc-on-a")); err != nil {
				t.Fatalf("the data of %s: %v", ids[0], err)
			}
			for _, id := range []string{"a:pvc-on-a", "b:pvc-on-a", "a:pvc-on-b", "b:pvc-on-b"} {
				_, err := d.ControllerGetVolume(e.ctx, &csi.ControllerGetVolumeRequest{VolumeId: id})
				if status.Code(err) != codes.Unavailable {
					t.Errorf("ControllerGetVolume(%s) with the disks swapped: %v, want Unavailable", id, err)
				}
			}

			// The mounts put right: both disks serve their volumes.
			d = newDriverOn(t, e)
			for _, id := range ids {
				if _, err := d.ControllerGetVolume(e.ctx, &csi.ControllerGetVolumeRequest{VolumeId: id}); err != nil {
					t.Errorf("ControllerGetVolume(%s) once the disks are back at their paths: %v", id, err)
				}
				if _, err := d.DeleteVolume(e.ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
					t.Errorf("DeleteVolume(%s): %v", id, err)
				}
			}
			if files := e.volumeFiles(t); len(files) > 0 {
				t.Errorf("files left: %v", files)
			}
		})
	}
}
