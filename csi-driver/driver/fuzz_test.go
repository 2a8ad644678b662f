package driver

import (
	"context"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/csi-driver/backend"
)

// FuzzParseID checks that parseID never panics, answers only
// InvalidArgument or NotFound, and that an ID it accepts is harmless and
// round-trips through makeID.
func FuzzParseID(f *testing.F) {
	for _, seed := range []string{
		"nvme0:pvc-3f0c2a4e-8f0b-4c2e-9d59-1f2b3c4d5e6f",
		"d:h-0123456789abcdef0123456789abcdef",
		"fake-vol-id", "", ":", "d:", ":k", "d:k:x", "../etc:passwd", "d:../k", "d:a/b",
		"d:k\x00", "a..b:k", "D:k", "d:K", "d.:k", "d:-k", strings.Repeat("a", 63) + ":" + strings.Repeat("b", 100),
		strings.Repeat("a", 63) + ":" + strings.Repeat("b", 101),
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, id string) {
		disk, key, err := parseID("volume", id)
		if err != nil {
			if c := status.Code(err); c != codes.InvalidArgument && c != codes.NotFound {
				t.Fatalf("parseID(%q) = code %s, want InvalidArgument or NotFound", id, c)
			}
			if disk != "" || key != "" {
				t.Fatalf("parseID(%q) returned %q, %q with error %v", id, disk, key, err)
			}
			return
		}
		if strings.Contains(id, "..") || strings.Contains(id, "/") || strings.ContainsRune(id, 0) {
			t.Fatalf("parseID accepted %q", id)
		}
		if len(id) > maxIDLength {
			t.Fatalf("parseID accepted %d bytes", len(id))
		}
		if got := makeID(disk, key); got != id {
			t.Fatalf("makeID(parseID(%q)) = %q", id, got)
		}
		if diskfit.ValidateDiskName(disk) != nil || !backend.ValidKey(key) {
			t.Fatalf("parseID(%q) = %q, %q: not a disk name and key", id, disk, key)
		}
	})
}

// FuzzIDRoundTrip checks the other direction: every ID the driver issues
// (a valid disk name and the key of any CSI name it accepts) parses back
// to the same disk and key, so no volume can be created that later
// RPCs refuse.
func FuzzIDRoundTrip(f *testing.F) {
	f.Add("nvme0", "pvc-3f0c2a4e-8f0b-4c2e-9d59-1f2b3c4d5e6f")
	f.Add("a..b", "pvc-1")
	f.Add("ssd-1.a_b", "Some Volume/../name")
	f.Add(strings.Repeat("z", 63), strings.Repeat("n", 128))
	f.Add("d", "h-0123456789abcdef0123456789abcdef")
	f.Fuzz(func(t *testing.T, disk, name string) {
		if diskfit.ValidateDiskName(disk) != nil || checkName("volume", name) != nil {
			return
		}
		key := backend.KeyForName(name)
		id := makeID(disk, key)
		gotDisk, gotKey, err := parseID("volume", id)
		if err != nil {
			t.Fatalf("disk %q, name %q: issued ID %q is refused: %v", disk, name, id, err)
		}
		if gotDisk != disk || gotKey != key {
			t.Fatalf("parseID(%q) = %q, %q, want %q, %q", id, gotDisk, gotKey, disk, key)
		}
	})
}

// FuzzSelectedDisk checks the driver's reading of a PVC's selected-node and
// selected-disk annotations: never a panic, only InvalidArgument (another
// node) or ResourceExhausted (a name that cannot be a disk), and a disk is
// returned only when it is well-formed and the PVC is scheduled here.
func FuzzSelectedDisk(f *testing.F) {
	f.Add(testNode, "nvme0", true)
	f.Add(testNode, "", true)
	f.Add("", "nvme0", true)
	f.Add("node-b", "nvme0", true)
	f.Add(testNode, "../../etc", true)
	f.Add(testNode, "NVMe0", true)
	f.Add(testNode, "a..b", true)
	f.Add(testNode, "nvme0", false)
	f.Fuzz(func(t *testing.T, node, disk string, withDisk bool) {
		ann := map[string]string{diskfit.SelectedNodeAnnotation: node}
		if withDisk {
			ann[diskfit.SelectedDiskAnnotation] = disk
		}
		got, err := selectedDisk(&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Annotations: ann}}, testNode)
		if err != nil {
			if c := status.Code(err); c != codes.InvalidArgument && c != codes.ResourceExhausted {
				t.Fatalf("selectedDisk(%q, %q) = code %s", node, disk, c)
			}
			if got != "" {
				t.Fatalf("selectedDisk returned %q with error %v", got, err)
			}
			return
		}
		if got == "" {
			return
		}
		if !withDisk || got != disk || node != testNode {
			t.Fatalf("selectedDisk(node %q, disk %q) = %q", node, disk, got)
		}
		if err := diskfit.ValidateDiskName(got); err != nil {
			t.Fatalf("selectedDisk returned a malformed disk name: %v", err)
		}
	})
}

// createVolumeCodes are the answers CreateVolume documents for a request
// (docs/csi-driver.md); anything else, Internal above all, is a bug.
var createVolumeCodes = map[codes.Code]bool{
	codes.OK: true, codes.InvalidArgument: true, codes.OutOfRange: true, codes.AlreadyExists: true,
	codes.ResourceExhausted: true, codes.NotFound: true, codes.FailedPrecondition: true, codes.Unavailable: true,
}

// FuzzCreateVolume sends CreateVolume requests with fuzzed name, capacity
// range, capability, parameters, PVC annotations, content source and
// topology to a driver on one real 2 GiB XFS disk (root only, like the
// other driver tests). The driver must answer with a documented code, a
// volume it creates must have an ID that parses back, and after the
// volume is deleted nothing may be left on the disk.
func FuzzCreateVolume(f *testing.F) {
	// Seeds: name, required, limit, access mode, kind (0 mount, 1 block,
	// 2 no access type, 3 nil capability, 4 none), fs type, fs type
	// parameter, device class, selected-node, selected-disk, with PVC,
	// source volume ID, requisite node, create twice.
	f.Add("pvc-1", int64(1<<20), int64(0), int32(1), uint8(1), "", "", "", "", "", false, "", "", false)
	f.Add("pvc-2", int64(300<<20), int64(300<<20), int32(1), uint8(0), "ext4", "", "ssd", testNode, "small", true, "", testNode, false)
	f.Add("pvc-3", int64(0), int64(0), int32(7), uint8(0), "", "xfs", "", testNode, "small", true, "", "", true)
	f.Add("pvc-4", int64(-1), int64(0), int32(1), uint8(0), "", "", "", "", "", false, "", "", false)
	f.Add("pvc-5", int64(1<<30), int64(1<<20), int32(1), uint8(1), "", "", "", "", "", false, "", "", false)
	f.Add("pvc-6", int64(1<<62), int64(0), int32(1), uint8(0), "", "", "", "", "", false, "", "", false)
	f.Add("pvc-7", int64(3<<30), int64(0), int32(1), uint8(0), "", "", "", "", "", false, "", "", false)
	f.Add("pvc-8", int64(1<<20), int64(0), int32(5), uint8(0), "btrfs", "", "", "", "", false, "", "", false)
	f.Add("pvc-9", int64(1<<20), int64(0), int32(0), uint8(2), "", "zfs", "", "", "", false, "", "", false)
	f.Add("", int64(1<<20), int64(0), int32(1), uint8(3), "", "", "", "", "", false, "", "", false)
	f.Add("pvc-10", int64(1<<20), int64(0), int32(1), uint8(4), "", "", "", "", "", false, "", "", false)
	f.Add("pvc-11", int64(1<<20), int64(0), int32(1), uint8(1), "", "", "", "node-b", "small", true, "", "", false)
	f.Add("pvc-12", int64(1<<20), int64(0), int32(1), uint8(1), "", "", "", testNode, "../../etc", true, "", "", false)
	f.Add("pvc-13", int64(1<<20), int64(0), int32(1), uint8(1), "", "", "hdd", testNode, "nvme9", true, "", "", false)
	f.Add("pvc-14", int64(1<<20), int64(0), int32(1), uint8(1), "", "", "", "", "", false, "small:pvc-1", "", false)
	f.Add("pvc-15", int64(1<<20), int64(0), int32(1), uint8(1), "", "", "", "", "", false, "../x", "", false)
	f.Add("pvc-16", int64(1<<20), int64(0), int32(1), uint8(1), "", "", "", "", "", false, "", "node-b", false)
	f.Add("Some Name/../x", int64(1<<20), int64(0), int32(1), uint8(1), "", "", "", "", "", false, "", "", false)
	f.Add("n\x00", int64(1<<20), int64(0), int32(1), uint8(1), "", "", "", "", "", false, "", "", false)

	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), klog.Background().V(10)))
	f.Cleanup(cancel)
	e := newEnvContext(f, ctx, []testDisk{{name: "small", class: "ssd", fsType: "xfs", size: 2 * gi}}, nil)
	pvcs := e.kube.CoreV1().PersistentVolumeClaims("default")

	f.Fuzz(func(t *testing.T, name string, required, limit int64, mode int32, kind uint8, fsType, fsParam, class,
		annNode, annDisk string, withPVC bool, sourceID, requisiteNode string, twice bool) {
		capability := &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_Mode(mode)}}
		switch kind % 5 {
		case 0:
			capability.AccessType = &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fsType}}
		case 1:
			capability.AccessType = &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}
		}
		req := &csi.CreateVolumeRequest{
			Name:               name,
			CapacityRange:      &csi.CapacityRange{RequiredBytes: required, LimitBytes: limit},
			VolumeCapabilities: []*csi.VolumeCapability{capability},
			Parameters: map[string]string{
				diskfit.FSTypeKey: fsParam, diskfit.DeviceClassParameter: class,
				diskfit.PVCNamespaceKey: "default", diskfit.PVCNameKey: "claim", diskfit.PVNameKey: "pv-claim",
			},
		}
		switch kind % 5 {
		case 3:
			req.VolumeCapabilities = []*csi.VolumeCapability{nil}
		case 4:
			req.VolumeCapabilities = nil
		}
		if sourceID != "" {
			req.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{
				Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: sourceID}}}
		}
		if requisiteNode != "" {
			req.AccessibilityRequirements = &csi.TopologyRequirement{Requisite: []*csi.Topology{{
				Segments: map[string]string{diskfit.TopologyKey: requisiteNode}}}}
		}
		_ = pvcs.Delete(context.Background(), "claim", metav1.DeleteOptions{})
		if withPVC {
			pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "claim",
				Annotations: map[string]string{diskfit.SelectedNodeAnnotation: annNode, diskfit.SelectedDiskAnnotation: annDisk}}}
			if _, err := pvcs.Create(context.Background(), pvc, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		if checkName("volume", name) == nil {
			// Whatever happens, the volume of this name goes afterwards.
			defer func() {
				if _, err := e.d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: makeID("small", backend.KeyForName(name))}); err != nil {
					t.Fatalf("DeleteVolume after CreateVolume(%q): %v", name, err)
				}
				if files := e.volumeFiles(t); len(files) != 0 {
					t.Fatalf("left on the disk after deleting %q: %v", name, files)
				}
			}()
		}
		if twice {
			// An existing volume of the same name: the fuzzed request must
			// match it or be AlreadyExists.
			if _, err := e.d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: mi},
				VolumeCapabilities: []*csi.VolumeCapability{blockCap()}}); err != nil && !createVolumeCodes[status.Code(err)] {
				t.Fatalf("first CreateVolume(%q): %v", name, err)
			}
		}
		resp, err := e.d.CreateVolume(ctx, req)
		if !createVolumeCodes[status.Code(err)] {
			t.Fatalf("CreateVolume(%+v) = code %s: %v", req, status.Code(err), err)
		}
		if err != nil {
			return
		}
		disk, key, perr := parseID("volume", resp.GetVolume().GetVolumeId())
		if perr != nil || disk != "small" || key != backend.KeyForName(name) {
			t.Fatalf("CreateVolume(%q) issued ID %q: %q, %q, %v", name, resp.GetVolume().GetVolumeId(), disk, key, perr)
		}
		if got := resp.GetVolume().GetCapacityBytes(); got < required || (limit > 0 && got > limit) {
			t.Fatalf("CreateVolume(%q) made %d bytes for range [%d, %d]", name, got, required, limit)
		}
	})
}
