package driver

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2/ktesting"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
	"github.com/diskfit/diskfit/csi-driver/config"
	"github.com/diskfit/diskfit/csi-driver/internal/fakelvm"
	"github.com/diskfit/diskfit/csi-driver/loop"
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

// TestDisksAtEachOthersPathsArePublishedAtAnotherPath: a disk whose
// filesystem came up at another disk's path (mounted by device name after
// a reboot that handed the names out in another order) is published
// unhealthy with reason AtAnotherPath, and its message says where its
// volumes are: its data is intact, and diskfit-controller must not take
// it for failed and release its claims, recreating the replicas empty
// elsewhere. A disk whose own filesystem is found nowhere (its device died
// and another took its name) stays a plain failure, with no reason. Once
// the mounts are put right, both disks are healthy again.
func TestDisksAtEachOthersPathsArePublishedAtAnotherPath(t *testing.T) {
	for _, tt := range []struct {
		name string
		// paths gives the disks' paths at the boot, from their paths
		// before it (at which their filesystems still are) and an empty
		// directory, which is not a mount point.
		paths func(before map[string]string, empty string) (a, b string)
		// discovered: disk b is not in the node config but found by
		// discovery, which finds nothing mounted at its path.
		discovered bool
		// atAnotherPath lists the disks whose filesystems are mounted at
		// another disk's path; the others' are mounted nowhere.
		atAnotherPath []string
	}{
		{name: "swapped", atAnotherPath: []string{"a", "b"},
			paths: func(p map[string]string, _ string) (string, string) { return p["b"], p["a"] }},
		{name: "disk a dead, b at its path", atAnotherPath: []string{"b"},
			paths: func(p map[string]string, empty string) (string, string) { return p["b"], empty }},
		{name: "disk a dead, b at its path, b not discovered", atAnotherPath: []string{"b"}, discovered: true,
			paths: func(p map[string]string, _ string) (string, string) { return p["b"], "" }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, []testDisk{
				{name: "a", class: "ssd", fsType: "xfs", size: 1 * gi},
				{name: "b", class: "hdd", fsType: "xfs", size: 1 * gi},
			}, nil)
			for name, class := range map[string]string{"a": "ssd", "b": "hdd"} {
				req := createReq("pvc-on-"+name, 100*mi)
				req.Parameters[diskfit.DeviceClassParameter] = class
				if vol := e.mustCreate(t, req); vol.VolumeId != name+":pvc-on-"+name {
					t.Fatalf("volume %s, want it on disk %s", vol.VolumeId, name)
				}
			}

			// The node boots with the filesystems mixed up.
			boot := e.d.cfg
			node := *boot.Node
			node.Disks = slices.Clone(node.Disks)
			node.Disks[0].Path, node.Disks[1].Path = tt.paths(e.paths, t.TempDir())
			if tt.discovered {
				node.Disks = node.Disks[:1]
				node.Discovers = true
				boot.Orphans = pvDisks{"a": 1, "b": 1}
			}
			boot.Node = &node
			d := e.restart(t, boot)
			d.publish(e.ctx)
			dn, err := e.diskfit.DiskfitV1alpha1().DiskNodes().Get(e.ctx, testNode, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for _, name := range []string{"a", "b"} {
				ds := dn.Status.Disk(name)
				switch {
				case ds == nil:
					t.Errorf("disk %s not published", name)
				case ds.Healthy:
					t.Errorf("disk %s published healthy: %+v", name, ds)
				case slices.Contains(tt.atAnotherPath, name):
					if ds.Reason != v1alpha1.DiskAtAnotherPath || !strings.Contains(ds.Message, e.paths[name]) {
						t.Errorf("disk %s, mounted at another disk's path: reason %q, message %q; want %s, naming %s, where its volumes are",
							name, ds.Reason, ds.Message, v1alpha1.DiskAtAnotherPath, e.paths[name])
					}
				default:
					if ds.Reason != "" {
						t.Errorf("disk %s, mounted nowhere: reason %q, message %q; want none: it may have failed", name, ds.Reason, ds.Message)
					}
				}
			}

			// The mounts put right: both disks serve their volumes.
			d = newDriverOn(t, e)
			d.publish(e.ctx)
			if dn, err = e.diskfit.DiskfitV1alpha1().DiskNodes().Get(e.ctx, testNode, metav1.GetOptions{}); err != nil {
				t.Fatal(err)
			}
			for _, name := range []string{"a", "b"} {
				if ds := dn.Status.Disk(name); ds == nil || !ds.Healthy || ds.Reason != "" || ds.VolumeCount != 1 {
					t.Errorf("disk %s back at its path: %+v, want it healthy with its volume", name, ds)
				}
			}
		})
	}
}

// TestDiskRefusedOnThisKernelIsUnsupported: a file disk that does not
// start because this kernel's loop devices would give its volumes' space
// back (loop.ErrFreesSpace, before Linux 5.19; see
// TestDiskWhoseLoopDevicesFreeSpaceIsRefused in csi-driver/backend) is
// refused with its data intact, as every file disk of such a node is
// after an upgrade. It is published unhealthy with reason Unsupported, so
// diskfit-controller releases none of its claims (it would reset the
// replicas on every such node at once), and the message says why.
func TestDiskRefusedOnThisKernelIsUnsupported(t *testing.T) {
	e := newEnv(t, []testDisk{{name: "a", fsType: "xfs", size: 1 * gi}}, nil)
	dk := e.d.disk("a")
	dk.mu.Lock()
	dk.startErr = fmt.Errorf("starting disk: %w", fmt.Errorf("%w (kernel 5.15.0): file disks need Linux 5.19 or later", loop.ErrFreesSpace))
	dk.mu.Unlock()
	ds := e.d.observe(e.ctx, false).Disk("a")
	if ds == nil || ds.Healthy || ds.Reason != v1alpha1.DiskUnsupported || !strings.Contains(ds.Message, "5.19") || ds.Failed() {
		t.Errorf("disk refused on this kernel: %+v, want unhealthy, reason Unsupported, not failed, saying why", ds)
	}
}

// TestSwappedVolumeGroupsAreNotServedUnderEachOthersNames: the lvm disks'
// TestSwappedDisksAreNotServedUnderEachOthersNames. A node config that
// swaps two lvm disks' volume groups (disk a gets vg2, disk b vg1) starts
// neither disk on the other's group, which is tagged with its disk's
// name: calls for both disks' volumes answer Unavailable, and nothing is
// deleted. Both are published unhealthy with reason AtAnotherPath (their
// data is intact), saying which group holds their volumes. Before,
// DeleteVolume("a:pvc-on-a") looked in vg2, found nothing and answered
// OK, the LV left in vg1 tracked by nothing. With the config put right,
// both disks serve their volumes. lvm2 is faked (fakelvm): this machine's
// kernel has no device-mapper.
func TestSwappedVolumeGroupsAreNotServedUnderEachOthersNames(t *testing.T) {
	vg1, vg2 := fakelvm.NewGroup("vg1", gi), fakelvm.NewGroup("vg2", gi)
	cfg := lvmConfig(t, fakelvm.Host{vg1, vg2})
	cfg.Node = &config.NodeConfig{MaxVolumes: 10, Disks: []config.Disk{
		{Name: "a", DeviceClass: "ssd", Backend: v1alpha1.BackendLVM, VolumeGroup: "vg1"},
		{Name: "b", DeviceClass: "hdd", Backend: v1alpha1.BackendLVM, VolumeGroup: "vg2"},
	}}
	_, ctx := ktesting.NewTestContext(t)
	start := func(cfg Config) *Driver { return startOn(ctx, t, cfg) }
	d := start(cfg)
	ids := []string{"a:pvc-on-a", "b:pvc-on-b"}
	for i, class := range []string{"ssd", "hdd"} {
		req := blockReq([]string{"pvc-on-a", "pvc-on-b"}[i], 16*mi)
		req.Parameters[diskfit.DeviceClassParameter] = class
		vol, err := d.CreateVolume(ctx, req)
		if err != nil || vol.Volume.VolumeId != ids[i] {
			t.Fatalf("volume %v, %v; want %s", vol, err, ids[i])
		}
	}

	// The driver restarts with the groups swapped in its config.
	stopDisks(d)
	swapped := cfg
	node := *cfg.Node
	node.Disks = slices.Clone(node.Disks)
	node.Disks[0].VolumeGroup, node.Disks[1].VolumeGroup = "vg2", "vg1"
	swapped.Node = &node
	d = start(swapped)
	for _, id := range ids {
		_, err := d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
		wantCode(t, err, codes.Unavailable)
		if _, err := d.ControllerGetVolume(ctx, &csi.ControllerGetVolumeRequest{VolumeId: id}); status.Code(err) != codes.Unavailable {
			t.Errorf("ControllerGetVolume(%s) with the groups swapped: %v, want Unavailable", id, err)
		}
	}
	if vg1.LVs["v-pvc-on-a"] == nil || vg2.LVs["v-pvc-on-b"] == nil {
		t.Fatalf("LVs left: vg1 %v, vg2 %v", vg1.Names(), vg2.Names())
	}
	st := d.observe(ctx, false)
	for name, vg := range map[string]string{"a": "vg1", "b": "vg2"} {
		if ds := st.Disk(name); ds == nil || ds.Healthy || ds.Reason != v1alpha1.DiskAtAnotherPath || !strings.Contains(ds.Message, "volume group "+vg) {
			t.Errorf("disk %s, its group given to the other disk: %+v; want unhealthy, reason %s, naming %s", name, ds, v1alpha1.DiskAtAnotherPath, vg)
		}
	}

	// Disk b gone from the config and disk a given b's group: a's own
	// group is not lost but left out of the config (a group is found by
	// its name, which no boot changes), so a is published AtAnotherPath
	// too, naming the group it was given, and releases no claim.
	stopDisks(d)
	onlyA := cfg
	nodeA := *cfg.Node
	nodeA.Disks = []config.Disk{cfg.Node.Disks[0]}
	nodeA.Disks[0].VolumeGroup = "vg2"
	onlyA.Node = &nodeA
	d = start(onlyA)
	if ds := d.observe(ctx, false).Disk("a"); ds == nil || ds.Healthy || ds.Reason != v1alpha1.DiskAtAnotherPath || !strings.Contains(ds.Message, "vg2") {
		t.Errorf("disk a given disk b's group, b not configured: %+v; want unhealthy, reason %s, naming vg2", ds, v1alpha1.DiskAtAnotherPath)
	}

	// The config put right: both disks serve their volumes.
	stopDisks(d)
	d = start(cfg)
	for _, id := range ids {
		if _, err := d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
			t.Errorf("DeleteVolume(%s): %v", id, err)
		}
	}
}
