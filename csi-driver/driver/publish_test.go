package driver

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/diskfit/diskfit/csi-driver/internal/testdisk"
)

// TestPublishNeverReportsAnotherMountAsTheVolume: NodePublishVolume at a
// target that already holds something answers OK only when that is the
// volume asked for, published as asked. A target holding another volume
// (Filesystem or Block), or this volume writable where read-only was
// asked for, is ALREADY_EXISTS, as the CSI spec orders: an OK would tell
// the kubelet that the pod has its volume, while the pod reads and writes
// another one's data, or writes to a volume it was to get read-only.
func TestPublishNeverReportsAnotherMountAsTheVolume(t *testing.T) {
	e := newEnv(t, []testDisk{{name: "xfs", fsType: "xfs", size: 2 * gi}}, nil)
	fsCap, blk := mountCap(), blockCap()
	volume := func(name string, cap *csi.VolumeCapability) (string, string) {
		id := e.createWith(t, name, 300*mi, cap).VolumeId
		return id, e.stage(t, id, cap)
	}
	type pub struct {
		id, staging string
		cap         *csi.VolumeCapability
		readOnly    bool
	}
	a, b, c, d := pub{cap: fsCap}, pub{cap: fsCap}, pub{cap: blk}, pub{cap: blk}
	a.id, a.staging = volume("pvc-publish-a", fsCap)
	b.id, b.staging = volume("pvc-publish-b", fsCap)
	c.id, c.staging = volume("pvc-publish-c", blk)
	d.id, d.staging = volume("pvc-publish-d", blk)
	roA := a
	roA.readOnly = true

	targets := map[string][]string{}
	for _, tt := range []struct {
		what, target    string
		owner, intruder pub
	}{
		{"another Filesystem volume", "shared", a, b},
		{"the volume read-only where it is writable", "shared", a, roA},
		{"another Block volume", "device", c, d},
	} {
		target, err := e.publish(t, tt.owner.id, tt.owner.staging, tt.target, tt.owner.cap, tt.owner.readOnly)
		if err != nil {
			t.Fatalf("%s: %v", tt.what, err)
		}
		if !slices.Contains(targets[tt.owner.id], target) {
			targets[tt.owner.id] = append(targets[tt.owner.id], target)
		}
		if tt.target == "shared" {
			if err := os.WriteFile(filepath.Join(target, "owner"), []byte("a"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		_, err = e.publish(t, tt.intruder.id, tt.intruder.staging, tt.target, tt.intruder.cap, tt.intruder.readOnly)
		if status.Code(err) != codes.AlreadyExists {
			t.Errorf("publishing %s: %v, want AlreadyExists", tt.what, err)
		}
		// The same request again, as the kubelet retries it: OK.
		if _, err := e.publish(t, tt.owner.id, tt.owner.staging, tt.target, tt.owner.cap, tt.owner.readOnly); err != nil {
			t.Errorf("%s: publishing the volume at its own target again: %v", tt.what, err)
		}
		if tt.target == "shared" {
			if data, err := os.ReadFile(filepath.Join(target, "owner")); err != nil || string(data) != "a" {
				t.Errorf("%s: the target of volume a reads %q, %v", tt.what, data, err)
			}
		}
	}

	for _, v := range []pub{a, b, c, d} {
		e.teardownNode(t, v.id, v.staging, targets[v.id]...)
		if _, err := e.d.DeleteVolume(e.ctx, &csi.DeleteVolumeRequest{VolumeId: v.id}); err != nil {
			t.Fatalf("DeleteVolume: %v", err)
		}
	}
	if loops := testdisk.LoopsBelow(e.paths["xfs"]); len(loops) > 0 {
		t.Errorf("loop devices left: %v", loops)
	}
}
