package driver

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/mount-utils"

	"github.com/diskfit/diskfit/csi-driver/internal/testdisk"
)

// TestPublishNeverReportsAnotherMountAsTheVolume: NodePublishVolume at a
// target that already holds something answers OK only when that is the
// volume asked for. A target holding another volume (Filesystem or
// Block) is ALREADY_EXISTS, as the CSI spec orders: an OK would tell the
// kubelet that the pod has its volume, while the pod reads and writes
// another one's data.
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
	}
	a, b, c, d := pub{cap: fsCap}, pub{cap: fsCap}, pub{cap: blk}, pub{cap: blk}
	a.id, a.staging = volume("pvc-publish-a", fsCap)
	b.id, b.staging = volume("pvc-publish-b", fsCap)
	c.id, c.staging = volume("pvc-publish-c", blk)
	d.id, d.staging = volume("pvc-publish-d", blk)

	targets := map[string][]string{}
	for _, tt := range []struct {
		what, target    string
		owner, intruder pub
	}{
		{"another Filesystem volume", "shared", a, b},
		{"another Block volume", "device", c, d},
	} {
		target, err := e.publish(t, tt.owner.id, tt.owner.staging, tt.target, tt.owner.cap, false)
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
		_, err = e.publish(t, tt.intruder.id, tt.intruder.staging, tt.target, tt.intruder.cap, false)
		if status.Code(err) != codes.AlreadyExists {
			t.Errorf("publishing %s: %v, want AlreadyExists", tt.what, err)
		}
		// The same request again, as the kubelet retries it: OK.
		if _, err := e.publish(t, tt.owner.id, tt.owner.staging, tt.target, tt.owner.cap, false); err != nil {
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

// TestReadOnlyPublishRetryAfterCrashMidPublish: a read-only publication
// takes two system calls, the bind mount and the read-only remount. A
// driver killed between them leaves the volume bind mounted writable at
// the target, and the kubelet retries the same read-only request; that
// retry must end with the target read-only and answer OK. An
// AlreadyExists is final for the kubelet: the pod would never start, and
// the writable mount, never unpublished, would keep the volume in use.
func TestReadOnlyPublishRetryAfterCrashMidPublish(t *testing.T) {
	e := newEnv(t, []testDisk{{name: "xfs", fsType: "xfs", size: 2 * gi}}, nil)
	for _, tt := range []struct {
		name string
		cap  *csi.VolumeCapability
	}{
		{"pvc-ro-retry-fs", mountCap()},
		{"pvc-ro-retry-block", blockCap()},
	} {
		id := e.createWith(t, tt.name, 300*mi, tt.cap).VolumeId
		staging := e.stage(t, id, tt.cap)
		dev, err := e.d.disk("xfs").backend.Device(e.ctx, tt.name)
		if err != nil {
			t.Fatal(err)
		}
		target := filepath.Join(e.kubelet, "pods", tt.name)
		source := staging
		if tt.cap.GetBlock() != nil {
			source = dev
		}
		// What bindMount's first system call leaves when the process
		// dies before the second.
		bindAt(t, source, target, tt.cap.GetBlock() != nil)
		if _, err := e.publish(t, id, staging, tt.name, tt.cap, true); err != nil {
			t.Errorf("%s: the kubelet's retry of the read-only publication: %v, want OK", tt.name, err)
		}
		if opts := mountOptionsAt(t, target); !slices.Contains(opts, "ro") {
			t.Errorf("%s: the target is mounted %v after the read-only publication, want ro", tt.name, opts)
		}
		if tt.cap.GetBlock() == nil {
			if err := os.WriteFile(filepath.Join(target, "x"), nil, 0o600); !errors.Is(err, unix.EROFS) {
				t.Errorf("%s: writing at the read-only target: %v, want EROFS", tt.name, err)
			}
		}
		e.teardown(t, id, staging, target)
	}
}

// A read-only publication keeps what the staging mount forbids: an admin's
// mountOptions nosuid, nodev, noexec and nosymfollow hold in the pod whether or not it
// asked for the volume readOnly, also when the kubelet's retry finishes a
// publication a killed driver left writable. The read-only remount sets
// every per-mount flag anew; before, it passed MS_RDONLY alone and the pod
// got a read-only mount where setuid programs and device nodes worked.
func TestReadOnlyPublishKeepsTheStagingMountsRestrictions(t *testing.T) {
	e := newEnv(t, []testDisk{{name: "xfs", fsType: "xfs", size: 2 * gi}}, nil)
	cap := mountCap()
	cap.GetMount().MountFlags = []string{"nosuid", "nodev", "noexec", "nosymfollow", "noatime"}
	id := e.createWith(t, "pvc-restricted", 300*mi, cap).VolumeId
	staging := e.stage(t, id, cap)
	want := []string{"nosuid", "nodev", "noexec", "nosymfollow", "noatime"}
	if opts := mountOptionsAt(t, staging); !containsAll(opts, want) {
		t.Fatalf("staged with %v, want %v", opts, want)
	}
	fresh, err := e.publish(t, id, staging, "fresh", cap, true)
	if err != nil {
		t.Fatal(err)
	}
	retried := filepath.Join(e.kubelet, "pods", "retried")
	// What bindMount's first system call leaves when the process dies
	// before the second.
	bindAt(t, staging, retried, false)
	if _, err := e.publish(t, id, staging, "retried", cap, true); err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{fresh, retried} {
		if opts := mountOptionsAt(t, target); !containsAll(opts, append([]string{"ro"}, want...)) {
			t.Errorf("published read-only at %s with %v, want ro and %v", filepath.Base(target), opts, want)
		}
	}
	e.teardown(t, id, staging, fresh, retried)
}

func containsAll(have, want []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}

// mountOptionsAt returns the per-mount options of what is mounted at
// path, as the mount table shows them.
func mountOptionsAt(t *testing.T, path string) []string {
	t.Helper()
	infos, err := mount.ParseMountInfo("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var opts []string
	for _, mi := range infos {
		if mi.MountPoint == path {
			opts = mi.MountOptions
		}
	}
	return opts
}

// TestBlockPublicationOnTmpfsDev: where the plugin's /dev is a tmpfs (a
// container's, as in a kind node), a Block volume's publication is a bind
// mount of a device node in that tmpfs, not in devtmpfs. It is still the
// volume's publication: the kubelet's re-publish (it calls
// NodePublishVolume again for Block volumes after a restart) answers OK,
// and NodeUnstageVolume refuses to detach the loop device under it: the
// pod's device node would lead to whatever volume gets that loop device
// next. The node here is made with mknod in a tmpfs, as a container
// runtime makes /dev.
func TestBlockPublicationOnTmpfsDev(t *testing.T) {
	e := newEnv(t, []testDisk{{name: "xfs", fsType: "xfs", size: 2 * gi}}, nil)
	cap := blockCap()
	id := e.createWith(t, "pvc-tmpfs-dev", 64*mi, cap).VolumeId
	staging := e.stage(t, id, cap)
	dev, err := e.d.disk("xfs").backend.Device(e.ctx, "pvc-tmpfs-dev")
	if err != nil {
		t.Fatal(err)
	}
	node := nodeOnTmpfs(t, t.TempDir(), dev)
	target := filepath.Join(e.kubelet, "pods", "tmpfs-dev")
	bindAt(t, node, target, true)
	if _, err := e.publish(t, id, staging, "tmpfs-dev", cap, false); err != nil {
		t.Errorf("re-publishing the Block volume at its target: %v, want OK", err)
	}
	_, err = e.d.NodeUnstageVolume(e.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
	wantCode(t, err, codes.FailedPrecondition)
	if now, _ := e.d.disk("xfs").backend.Device(e.ctx, "pvc-tmpfs-dev"); now != dev {
		t.Errorf("the volume's loop device is %q after the refused unstage, want %s, which the target still holds", now, dev)
	}
	e.teardown(t, id, staging, target)
}

// nodeOnTmpfs mounts a tmpfs at dir until the test ends and makes there a
// block device node with dev's device number, as a container's /dev, or a
// pod's emptyDir in memory, can hold one. It returns the node's path.
func nodeOnTmpfs(t *testing.T, dir, dev string) string {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "mode=755"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	node := filepath.Join(dir, filepath.Base(dev))
	if err := unix.Mknod(node, unix.S_IFBLK|0o660, int(st.Rdev)); err != nil {
		t.Fatal(err)
	}
	return node
}

// bindAt bind-mounts source at path (made as a directory, or as a file for
// a device node) until the test ends.
func bindAt(t *testing.T, source, path string, file bool) {
	t.Helper()
	if err := makeTarget(path, file); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(source, path, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(path, unix.MNT_DETACH) })
}

// The kubelet's own mounts of a publication are not other publications. It
// bind-mounts a pod's subPath of a Filesystem volume under
// pods/<uid>/volume-subpaths, and a Block volume's publication under
// plugins/kubernetes.io/csi/volumeDevices/<pv>/dev/<uid>. After a kubelet
// restart it publishes the volumes of its running pods again, at the same
// targets: for a single-writer (ReadWriteOncePod) volume that must be OK.
// Before, those mounts counted as second publications and the publish was
// refused, FailedPrecondition, which the kubelet takes as final: the pod's
// volume stayed uncertain and its containers were never restarted.
func TestKubeletsOwnMountsAreNoOtherPublication(t *testing.T) {
	e := newEnv(t, []testDisk{{name: "xfs", fsType: "xfs", size: 2 * gi}}, nil)
	for _, block := range []bool{false, true} {
		name := map[bool]string{false: "fs", true: "block"}[block]
		t.Run(name, func(t *testing.T) {
			cap := mountCap()
			if block {
				cap = blockCap()
			}
			cap.AccessMode.Mode = csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER
			id := e.createWith(t, "pvc-own-"+name, 300*mi, cap).VolumeId
			staging := e.stage(t, id, cap)
			target, err := e.publish(t, id, staging, "own-"+name, cap, false)
			if err != nil {
				t.Fatal(err)
			}
			if block {
				bindAt(t, target, filepath.Join(e.kubelet, "plugins/kubernetes.io/csi/volumeDevices", id, "dev", "pod-uid"), true)
			} else {
				sub := filepath.Join(target, "sub")
				if err := os.Mkdir(sub, 0o750); err != nil {
					t.Fatal(err)
				}
				bindAt(t, sub, filepath.Join(e.kubelet, "pods/pod-uid/volume-subpaths/data/app/0"), false)
			}
			if _, err := e.publish(t, id, staging, "own-"+name, cap, false); err != nil {
				t.Errorf("publishing the single-writer volume again at its target, beside the kubelet's mount of it: %v, want OK", err)
			}
			// Another pod's publication is still refused.
			_, err = e.publish(t, id, staging, "other-"+name, cap, false)
			wantCode(t, err, codes.FailedPrecondition)
		})
	}
}

// A device node a pod made itself (mknod in an emptyDir, CAP_MKNOD under
// the baseline Pod Security level) with the device number of another
// tenant's Block volume, mounted into its container with subPath (the
// kubelet bind-mounts it under pods/<uid>/volume-subpaths), is not a
// publication of that volume: it does not hold the volume staged.
// Before, the volume's NodeUnstageVolume was refused for ever, its loop
// device stayed attached and DeleteVolume refused it as in use. The same
// holds with --kubelet-dir a symbolic link: the mount table names the
// directory it leads to (before, the kubelet's own mounts were then
// matched against the link and never recognised).
func TestTenantsDeviceNodeHoldsNoVolume(t *testing.T) {
	for _, link := range []bool{false, true} {
		t.Run(fmt.Sprintf("kubelet dir a link %v", link), func(t *testing.T) {
			e := newEnv(t, []testDisk{{name: "xfs", fsType: "xfs", size: 2 * gi}}, nil)
			if link {
				// As New leaves a driver given a link: the link in its
				// config, the directory resolved.
				e.d.cfg.KubeletDir = filepath.Join(t.TempDir(), "kubelet")
				if err := os.Symlink(e.kubelet, e.d.cfg.KubeletDir); err != nil {
					t.Fatal(err)
				}
			}
			cap := blockCap()
			id := e.createWith(t, "pvc-victim", 64*mi, cap).VolumeId
			staging := e.stage(t, id, cap)
			dev, err := e.d.disk("xfs").backend.Device(e.ctx, "pvc-victim")
			if err != nil {
				t.Fatal(err)
			}
			node := nodeOnTmpfs(t, filepath.Join(e.kubelet, "pods/tenant/volumes/kubernetes.io~empty-dir/cache"), dev)
			bindAt(t, node, filepath.Join(e.kubelet, "pods/tenant/volume-subpaths/cache/app/0"), true)
			e.teardown(t, id, staging)
		})
	}
}
