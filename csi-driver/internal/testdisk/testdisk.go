// Package testdisk makes real, loop-mounted filesystems for tests and
// cleans up every mount and loop device they leave, even when a test fails.
package testdisk

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/mount-utils"
)

// RequireEnv, set to 1 (or CI set to anything), makes Require fail a test
// that cannot have its real disks instead of skipping it, so that a broken
// install cannot pass with most of the driver untested. .ci/run sets it.
const RequireEnv = "DISKFIT_REQUIRE_REAL_DISKS"

// Require skips the test unless it runs as root with the tools a real disk
// needs; the message says which is missing. Where real disks are required
// (RequireEnv), it fails the test instead.
func Require(t testing.TB) {
	t.Helper()
	missing := func(format string, args ...any) {
		t.Helper()
		if os.Getenv(RequireEnv) == "1" || os.Getenv("CI") != "" {
			t.Fatalf("real disks are required here ("+RequireEnv+"=1 or CI set), but: "+format, args...)
		}
		t.Skipf(format, args...)
	}
	if os.Geteuid() != 0 {
		missing("needs root: mounts loop devices (run through `make test`)")
		return
	}
	for _, tool := range []string{"losetup", "mkfs.xfs", "mkfs.ext4", "xfs_growfs", "resize2fs", "mount", "umount"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing("needs %s (apt-get install -y xfsprogs e2fsprogs util-linux)", tool)
			return
		}
	}
}

// Run runs a command and fails the test when it fails.
func Run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := Output(name, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Output runs a command and returns its standard output.
func Output(name string, args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// New makes a sparse image of size bytes, formats it with fsType (xfs with
// reflink, or ext4), mounts it and returns the mount path. Cleanup detaches
// every loop device backed by a file on it, unmounts everything below it
// and then the disk itself.
func New(t testing.TB, fsType string, size int64) string {
	t.Helper()
	dir := t.TempDir()
	img := filepath.Join(dir, "disk.img")
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	f.Close()
	dev := strings.TrimSpace(Run(t, "losetup", "--find", "--show", img))
	// A test that made the disk disappear may have detached it.
	DetachAtCleanup(t, dev)
	switch fsType {
	case "xfs":
		Run(t, "mkfs.xfs", "-q", "-f", "-m", "reflink=1", dev)
	case "ext4":
		Run(t, "mkfs.ext4", "-q", "-F", "-m0", dev)
	default:
		t.Fatalf("unknown filesystem %q", fsType)
	}
	Run(t, "mount", dev, mnt)
	t.Cleanup(func() { Teardown(t, mnt) })
	return mnt
}

// Backing identifies the file a loop device serves: the device number of
// its filesystem and its inode, which stay the same when the filesystem
// is detached lazily and the kernel names the file differently.
type Backing struct{ Device, Inode uint64 }

// BackingOf returns what the loop device dev serves now; ok is false when
// it serves nothing.
func BackingOf(dev string) (b Backing, ok bool) {
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return Backing{}, false
	}
	defer unix.Close(fd)
	return backingOf(fd)
}

func backingOf(fd int) (Backing, bool) {
	info, err := unix.IoctlLoopGetStatus64(fd)
	if err != nil {
		return Backing{}, false
	}
	return Backing{Device: info.Device, Inode: info.Inode}, true
}

// DetachAtCleanup detaches the loop device dev when the test ends, if it
// still serves the file it serves now. A test, or the code it tests, may
// detach dev before; the kernel then hands the number to whoever asks
// next, as often as not another test binary running at the same time,
// and detaching by name would pull that process's disk from under it:
// its mount right after mkfs fails ("can't read superblock"), its writes
// fail with EIO. The check and the detach go through one open of the
// device.
func DetachAtCleanup(t testing.TB, dev string) {
	t.Helper()
	want, ok := BackingOf(dev)
	if !ok {
		t.Fatalf("%s serves no file", dev)
	}
	t.Cleanup(func() {
		fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return
		}
		defer unix.Close(fd)
		if now, ok := backingOf(fd); !ok || now != want {
			return
		}
		// With this descriptor open the kernel detaches on its close.
		if err := unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0); err != nil {
			t.Errorf("detaching %s: %v", dev, err)
		}
	})
}

// Teardown unmounts everything mounted below root (deepest first),
// detaches loop devices backed by files below root, then unmounts root
// itself when it is a mount point.
func Teardown(t testing.TB, root string) {
	t.Helper()
	for _, p := range MountsBelow(root) {
		if p == root {
			continue
		}
		if _, err := Output("umount", p); err != nil {
			t.Errorf("unmounting %s: %v", p, err)
		}
	}
	for _, dev := range LoopsBelow(root) {
		if _, err := Output("losetup", "--detach", dev); err != nil {
			t.Errorf("detaching %s: %v", dev, err)
		}
	}
	// The kernel finishes a detach when the last opener (often udev) lets
	// go, so wait for it before unmounting the filesystem holding the files.
	for i := 0; i < 500 && len(LoopsBelow(root)) > 0; i++ {
		time.Sleep(20 * time.Millisecond)
	}
	for _, p := range MountsBelow(root) {
		if p == root {
			if _, err := Output("umount", p); err != nil {
				t.Errorf("unmounting %s: %v; detaching it lazily", p, err)
				_, _ = Output("umount", "--lazy", p)
			}
		}
	}
}

// Source returns the device mounted at mountPoint, "" when none is.
func Source(mountPoint string) string {
	infos, err := mount.ParseMountInfo("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	for _, mi := range infos {
		if mi.MountPoint == mountPoint {
			return mi.Source
		}
	}
	return ""
}

// MountsBelow lists mount points at or below root, deepest first.
func MountsBelow(root string) []string {
	infos, err := mount.ParseMountInfo("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var paths []string
	for _, mi := range infos {
		if mi.MountPoint == root || strings.HasPrefix(mi.MountPoint, root+"/") {
			paths = append(paths, mi.MountPoint)
		}
	}
	sort.Slice(paths, func(i, j int) bool { return len(paths[i]) > len(paths[j]) })
	return paths
}

// LoopsBelow lists loop devices whose backing file is below root.
func LoopsBelow(root string) []string {
	out, err := Output("losetup", "--list", "--json", "--output", "NAME,BACK-FILE")
	if err != nil || strings.TrimSpace(out) == "" {
		return nil
	}
	var list struct {
		Loopdevices []struct {
			Name     string `json:"name"`
			BackFile string `json:"back-file"`
		} `json:"loopdevices"`
	}
	if json.Unmarshal([]byte(out), &list) != nil {
		return nil
	}
	var devs []string
	for _, l := range list.Loopdevices {
		if strings.HasPrefix(strings.TrimSuffix(l.BackFile, " (deleted)"), root+"/") {
			devs = append(devs, l.Name)
		}
	}
	return devs
}

// KubeletDir returns a temporary stand-in for the kubelet directory whose
// mounts are all removed at cleanup.
func KubeletDir(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, p := range MountsBelow(real) {
			if _, err := Output("umount", p); err != nil {
				t.Errorf("unmounting %s: %v", p, err)
			}
		}
	})
	return real
}
