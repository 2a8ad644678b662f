package driver

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/diskfit/diskfit/csi-driver/backend"
)

// linkedDevices is a backend whose volumes' devices are symbolic links to
// the real device node, as an lvm volume's /dev/<vg>/<lv> is to its
// /dev/dm-N. mount(8) resolves the link, and the mount table names the
// device node, never the link.
type linkedDevices struct {
	backend.Backend
	dir string
}

func (b linkedDevices) link(dev string) (string, error) {
	if dev == "" {
		return "", nil
	}
	link := filepath.Join(b.dir, filepath.Base(dev))
	if err := os.Symlink(dev, link); err != nil && !os.IsExist(err) {
		return "", err
	}
	return link, nil
}

func (b linkedDevices) Attach(ctx context.Context, key string, readOnly bool) (string, error) {
	dev, err := b.Backend.Attach(ctx, key, readOnly)
	if err != nil {
		return "", err
	}
	return b.link(dev)
}

func (b linkedDevices) Device(ctx context.Context, key string) (string, error) {
	dev, err := b.Backend.Device(ctx, key)
	if err != nil {
		return "", err
	}
	return b.link(dev)
}

// A volume whose device the backend names by a symbolic link (every lvm
// volume: /dev/<vg>/<lv>) is staged, staged again, published, published
// again and torn down as any other: the driver knows its mounts by the
// device they are of, not by the name the mount table gives it. Before,
// publishing it was refused as not staged, so a pod with an lvm Filesystem
// volume never started. A second single-writer publication is still
// refused. Real XFS on a loop device; the link is what lvm would give.
func TestVolumeBehindADeviceLinkIsPublished(t *testing.T) {
	e := newEnv(t, []testDisk{{name: "xfs", fsType: "xfs", size: 2 * gi}}, nil)
	dk := e.d.disk("xfs")
	dk.backend = linkedDevices{Backend: dk.backend, dir: t.TempDir()}
	for _, mode := range []csi.VolumeCapability_AccessMode_Mode{csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER} {
		t.Run(mode.String(), func(t *testing.T) {
			cap := mountCap()
			cap.AccessMode.Mode = mode
			vol := e.createWith(t, "pvc-linked-"+strings.ToLower(mode.String()), 300*mi, cap)
			staging := e.stage(t, vol.VolumeId, cap)
			e.stage(t, vol.VolumeId, cap)
			target, err := e.publish(t, vol.VolumeId, staging, "linked-"+mode.String(), cap, false)
			if err != nil {
				t.Fatalf("publishing a volume behind a device link: %v", err)
			}
			if err := os.WriteFile(filepath.Join(target, "data"), []byte("kept"), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := e.publish(t, vol.VolumeId, staging, "linked-"+mode.String(), cap, false); err != nil {
				t.Errorf("publishing it again at the same target: %v", err)
			}
			var targets = []string{target}
			second, err := e.publish(t, vol.VolumeId, staging, "linked-second-"+mode.String(), cap, false)
			if mode == csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER {
				wantCode(t, err, codes.FailedPrecondition)
			} else if err != nil {
				t.Errorf("a second publication: %v", err)
			} else {
				targets = append(targets, second)
				if got, err := os.ReadFile(filepath.Join(second, "data")); err != nil || string(got) != "kept" {
					t.Errorf("the second publication reads %q, %v", got, err)
				}
			}
			e.teardown(t, vol.VolumeId, staging, targets...)
		})
	}
}
