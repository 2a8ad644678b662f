package driver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"
)

// TestPreallocationStaysAllocated checks what a volume's size promises: its
// bytes stay allocated on the disk whatever is done inside the volume, so
// the volume cannot hit ENOSPC when its disk fills. A loop device turns
// discards, and zeroing requests that allow unmapping (REQ_OP_WRITE_ZEROES
// without REQ_NOUNMAP), into holes punched in its backing file; mkfs,
// ext4's lazy inode table initialisation, fstrim, `mount -o discard`,
// `blkdiscard [-z]` and fallocate on the device all issue such requests.
// After every step the backing file's allocated bytes (st_blocks*512) must
// still be at least the volume's size.
func TestPreallocationStaysAllocated(t *testing.T) {
	e := newEnv(t, []testDisk{{name: "xfs", fsType: "xfs", size: 4 * gi}}, nil)
	// Look at the volume between the driver's own mkfs and mount too.
	var hook func(step string)
	after := func(step string) {
		if hook != nil {
			hook(step)
		}
	}
	e.d.exec = measuredExec{Interface: e.d.exec, after: after}
	e.d.mounter.Exec = measuredExec{Interface: e.d.mounter.Exec, after: after}
	e.d.mounter.Interface = measuredMounter{Interface: e.d.mounter.Interface, after: after}

	for _, tc := range []struct {
		name, fsType string
		flags        []string
	}{
		{"xfs", "xfs", nil},
		{"ext4", "ext4", nil},
		{"xfs mounted with discard", "xfs", []string{"discard"}},
		{"ext4 mounted with discard", "ext4", []string{"discard"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cap := withFS(mountCap(), tc.fsType)
			cap.GetMount().MountFlags = tc.flags
			req := createReq("pvc-prealloc-"+strings.ReplaceAll(tc.name, " ", "-"), 400*mi)
			req.VolumeCapabilities = []*csi.VolumeCapability{cap}
			vol := e.mustCreate(t, req)
			a := e.allocation(t, vol)
			a.check("after CreateVolume (fallocate)")
			hook = a.check
			staging := e.stage(t, vol.VolumeId, cap)
			hook = nil
			dev := a.device()
			a.check("after NodeStageVolume")
			if tc.fsType == "ext4" {
				waitLazyInit(t, dev)
				a.check("after ext4's lazy inode table initialisation")
			}
			fillAndEmpty(t, a, staging)
			e.unstage(t, vol.VolumeId, staging)
			a.check("after NodeUnstageVolume")
			staging = e.stage(t, vol.VolumeId, cap)
			a.check("after staging again")
			e.teardown(t, vol.VolumeId, staging)
		})
	}

	t.Run("block", func(t *testing.T) {
		req := createReq("pvc-prealloc-block", 256*mi)
		req.VolumeCapabilities = []*csi.VolumeCapability{blockCap()}
		vol := e.mustCreate(t, req)
		a := e.allocation(t, vol)
		a.check("after CreateVolume (fallocate)")
		staging := e.stage(t, vol.VolumeId, blockCap())
		dev := a.device()
		a.check("after NodeStageVolume")
		zapDevice(t, a, dev)

		// A pod that formats its Block volume itself, with mkfs's
		// defaults (which discard the whole device first), mounts it
		// (ext4 then zeroes its inode tables lazily), writes, deletes
		// and trims.
		out, err := execOutput("mkfs.ext4", "-q", "-F", dev)
		if err != nil {
			t.Fatal(err, out)
		}
		a.check("after mkfs.ext4 by the pod")
		mnt := filepath.Join(e.kubelet, "pods", "prealloc-block-fs")
		if err := os.MkdirAll(mnt, 0o750); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount(dev, mnt, "ext4", 0, ""); err != nil {
			t.Fatalf("mounting %s: %v", dev, err)
		}
		a.check("after mounting it in the pod")
		waitLazyInit(t, dev)
		a.check("after ext4's lazy inode table initialisation")
		fillAndEmpty(t, a, mnt)
		if err := unix.Unmount(mnt, 0); err != nil {
			t.Fatal(err)
		}

		// Growing refreshes the loop device, which must not bring
		// discard back.
		grown := vol.CapacityBytes + 256*mi
		resp, err := e.d.NodeExpandVolume(e.ctx, &csi.NodeExpandVolumeRequest{VolumeId: vol.VolumeId, VolumePath: staging,
			VolumeCapability: blockCap(), CapacityRange: &csi.CapacityRange{RequiredBytes: grown}})
		if err != nil {
			t.Fatalf("NodeExpandVolume: %v", err)
		}
		a.size = resp.CapacityBytes
		a.check("after NodeExpandVolume")
		zapDevice(t, a, dev)
		e.unstage(t, vol.VolumeId, staging)
		a.check("after NodeUnstageVolume")
		if _, err := e.d.DeleteVolume(e.ctx, &csi.DeleteVolumeRequest{VolumeId: vol.VolumeId}); err != nil {
			t.Fatal(err)
		}
	})
}

// allocation checks one volume's backing file against its size.
type allocation struct {
	t    *testing.T
	file string
	size int64
}

func (e *env) allocation(t *testing.T, vol *csi.Volume) *allocation {
	t.Helper()
	disk, key, ok := strings.Cut(vol.VolumeId, ":")
	if !ok {
		t.Fatalf("volume ID %q", vol.VolumeId)
	}
	return &allocation{t: t, file: filepath.Join(e.paths[disk], "diskfit", "volumes", key+".img"), size: vol.CapacityBytes}
}

// check fails the test when fewer bytes than the volume's size are
// allocated to its backing file, and logs the figure either way.
func (a *allocation) check(step string) {
	a.t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(a.file, &st); err != nil {
		a.t.Fatalf("%s: %v", step, err)
	}
	allocated := st.Blocks * 512
	a.t.Logf("%s: %d bytes allocated for a %d-byte volume", step, allocated, a.size)
	if allocated < a.size {
		a.t.Errorf("%s: the backing file holds %d bytes, %d fewer than the volume's %d: the volume can run out of space when its disk fills",
			step, allocated, a.size-allocated, a.size)
	}
}

// device returns the loop device serving the volume and logs the queue
// limits that decide whether discards and zeroing reach its backing file.
func (a *allocation) device() string {
	a.t.Helper()
	devs, err := loopsOf(a.file)
	if err != nil || len(devs) != 1 {
		a.t.Fatalf("loop devices of %s: %v, %v", a.file, devs, err)
	}
	var limits []string
	for _, name := range []string{"discard_max_bytes", "discard_max_hw_bytes", "write_zeroes_max_bytes", "write_zeroes_unmap_max_bytes"} {
		v, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(devs[0]), "queue", name))
		if err == nil {
			limits = append(limits, name+"="+strings.TrimSpace(string(v)))
		}
	}
	a.t.Logf("%s: %s", devs[0], strings.Join(limits, " "))
	return devs[0]
}

// loopsOf lists the loop devices backed by file.
func loopsOf(file string) ([]string, error) {
	entries, err := os.ReadDir("/sys/block")
	if err != nil {
		return nil, err
	}
	var devs []string
	for _, en := range entries {
		backing, err := os.ReadFile(filepath.Join("/sys/block", en.Name(), "loop", "backing_file"))
		if err == nil && strings.TrimSpace(string(backing)) == file {
			devs = append(devs, "/dev/"+en.Name())
		}
	}
	return devs, nil
}

func (e *env) unstage(t *testing.T, id, staging string) {
	t.Helper()
	if _, err := e.d.NodeUnstageVolume(e.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		t.Fatalf("NodeUnstageVolume: %v", err)
	}
}

// fillAndEmpty writes and deletes data in the filesystem mounted at dir in
// the ways that make filesystems zero or discard blocks, then trims it.
func fillAndEmpty(t *testing.T, a *allocation, dir string) {
	t.Helper()
	block := make([]byte, 1<<20)
	for i := range block {
		block[i] = byte(i*7 + 1)
	}
	data := filepath.Join(dir, "data")
	f, err := os.Create(data)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 128; i++ {
		if _, err := f.Write(block); err != nil {
			t.Fatalf("writing into the volume: %v", err)
		}
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	// Zeroing a range of a file (XFS frees and reallocates it, ext4
	// converts it to unwritten extents) and FALLOC_FL_WRITE_ZEROES, which
	// filesystems pass to the device as REQ_OP_WRITE_ZEROES.
	tolerate(t, "FALLOC_FL_ZERO_RANGE on a file", unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_ZERO_RANGE, 16<<20, 64<<20))
	tolerate(t, "FALLOC_FL_WRITE_ZEROES on a file", unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_WRITE_ZEROES, 0, 16<<20))
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	a.check("after writing 128 MiB and zeroing ranges of it")

	// Small preallocated files written in the middle, buffered and with
	// direct I/O: converting their unwritten extents is where ext4 zeroes
	// short extents on the device (ext4_ext_zeroout).
	page, aligned := block[:4096], alignedPage(t)
	for i := 0; i < 64; i++ {
		for _, direct := range []bool{false, true} {
			flags := os.O_CREATE | os.O_WRONLY
			if direct {
				flags |= unix.O_DIRECT
			}
			f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("small-%d-%v", i, direct)), flags, 0o600)
			if err != nil {
				t.Fatal(err)
			}
			if err := unix.Fallocate(int(f.Fd()), 0, 0, 32<<10); err != nil {
				t.Fatal(err)
			}
			buf := page
			if direct {
				buf = aligned
			}
			if _, err := f.WriteAt(buf, 12<<10); err != nil {
				t.Fatalf("writing into a preallocated file: %v", err)
			}
			if err := f.Sync(); err != nil {
				t.Fatal(err)
			}
			f.Close()
		}
	}
	a.check("after writing into 128 small preallocated files")

	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, en := range entries {
		if en.Name() != "lost+found" {
			if err := os.Remove(filepath.Join(dir, en.Name())); err != nil {
				t.Fatal(err)
			}
		}
	}
	syncfs(t, dir)
	a.check("after deleting everything")
	tolerate(t, "fstrim", fstrim(dir))
	a.check("after fstrim")
}

// zapDevice does to a Block volume's device what a pod may do to clear or
// trim it, then checks the allocation after each.
func zapDevice(t *testing.T, a *allocation, dev string) {
	t.Helper()
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	size, err := f.Seek(0, 2)
	if err != nil {
		t.Fatal(err)
	}
	block := make([]byte, 1<<20)
	for i := range block {
		block[i] = byte(i*13 + 5)
	}
	for off := int64(0); off < 64<<20; off += int64(len(block)) {
		if _, err := f.WriteAt(block, off); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	a.check("after writing 64 MiB to the device")
	fd := int(f.Fd())
	for _, op := range []struct {
		name string
		run  func() error
	}{
		// blkdiscard
		{"BLKDISCARD", func() error { return rangeIoctl(fd, unix.BLKDISCARD, 0, size) }},
		// blkdiscard --secure
		{"BLKSECDISCARD", func() error { return rangeIoctl(fd, unix.BLKSECDISCARD, 0, size) }},
		// blkdiscard --zeroout: REQ_OP_WRITE_ZEROES with REQ_NOUNMAP
		{"BLKZEROOUT", func() error { return rangeIoctl(fd, unix.BLKZEROOUT, 0, size) }},
		// fallocate --punch-hole: REQ_OP_WRITE_ZEROES without REQ_NOUNMAP,
		// which the loop driver turns into FALLOC_FL_PUNCH_HOLE
		{"fallocate PUNCH_HOLE on the device", func() error {
			return unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, size)
		}},
		// fallocate --zero-range: REQ_OP_WRITE_ZEROES with REQ_NOUNMAP
		{"fallocate ZERO_RANGE on the device", func() error {
			return unix.Fallocate(fd, unix.FALLOC_FL_ZERO_RANGE|unix.FALLOC_FL_KEEP_SIZE, 0, size)
		}},
		// fallocate --write-zeroes (util-linux 2.41)
		{"fallocate WRITE_ZEROES on the device", func() error {
			return unix.Fallocate(fd, unix.FALLOC_FL_WRITE_ZEROES|unix.FALLOC_FL_KEEP_SIZE, 0, size)
		}},
	} {
		tolerate(t, op.name, op.run())
		a.check("after " + op.name)
	}
}

// tolerate accepts a discard or zeroing request that the device or
// filesystem refuses as unsupported: refusing is one way of keeping the
// space. Any other failure fails the test.
func tolerate(t *testing.T, what string, err error) {
	t.Helper()
	switch {
	case err == nil:
		t.Logf("%s: done", what)
	case errors.Is(err, unix.EOPNOTSUPP):
		t.Logf("%s: refused: %v", what, err)
	default:
		t.Errorf("%s: %v", what, err)
	}
}

func rangeIoctl(fd int, req uint, start, length int64) error {
	r := [2]uint64{uint64(start), uint64(length)}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(unsafe.Pointer(&r))); errno != 0 {
		return errno
	}
	return nil
}

// fstrim trims every free extent of the filesystem at dir, as fstrim(8)
// does: FITRIM over the whole filesystem.
func fstrim(dir string) error {
	const fitrim = 0xc0185879 // _IOWR('X', 121, struct fstrim_range)
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	r := struct{ start, length, minlen uint64 }{0, ^uint64(0), 0}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), fitrim, uintptr(unsafe.Pointer(&r))); errno != 0 {
		return errno
	}
	return nil
}

func syncfs(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		t.Fatal(err)
	}
}

// alignedPage returns a 4 KiB buffer aligned for direct I/O.
func alignedPage(t *testing.T) []byte {
	t.Helper()
	buf, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Munmap(buf) })
	for i := range buf {
		buf[i] = 0x5a
	}
	return buf
}

// waitLazyInit waits until ext4 on dev has zeroed every inode table
// (dumpe2fs shows ITABLE_ZEROED on every group). The kernel does that
// after mounting, in the background, with sb_issue_zeroout: zeroing
// requests that allow unmapping.
func waitLazyInit(t *testing.T, dev string) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		out, err := execOutput("dumpe2fs", dev)
		if err != nil {
			t.Fatal(err)
		}
		groups, zeroed := 0, 0
		for _, line := range strings.Split(out, "\n") {
			if strings.HasPrefix(line, "Group ") && strings.Contains(line, "(Blocks ") {
				groups++
				if strings.Contains(line, "ITABLE_ZEROED") {
					zeroed++
				}
			}
		}
		if groups > 0 && zeroed == groups {
			t.Logf("ext4 on %s: %d of %d inode tables zeroed", dev, zeroed, groups)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("ext4 on %s zeroed %d of %d inode tables in 3 minutes", dev, zeroed, groups)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// measuredExec runs commands like the driver's executor and calls after
// once an mkfs has run, so a test sees the volume between the driver's
// steps.
type measuredExec struct {
	utilexec.Interface
	after func(step string)
}

func (m measuredExec) Command(cmd string, args ...string) utilexec.Cmd {
	return m.wrap(m.Interface.Command(cmd, args...), cmd, args)
}

func (m measuredExec) CommandContext(ctx context.Context, cmd string, args ...string) utilexec.Cmd {
	return m.wrap(m.Interface.CommandContext(ctx, cmd, args...), cmd, args)
}

func (m measuredExec) wrap(c utilexec.Cmd, cmd string, args []string) utilexec.Cmd {
	if !strings.HasPrefix(cmd, "mkfs.") {
		return c
	}
	return measuredCmd{Cmd: c, done: func() { m.after("after the driver's " + cmd + " " + strings.Join(args, " ")) }}
}

type measuredCmd struct {
	utilexec.Cmd
	done func()
}

func (c measuredCmd) Run() error {
	defer c.done()
	return c.Cmd.Run()
}

func (c measuredCmd) CombinedOutput() ([]byte, error) {
	defer c.done()
	return c.Cmd.CombinedOutput()
}

func (c measuredCmd) Output() ([]byte, error) {
	defer c.done()
	return c.Cmd.Output()
}

// measuredMounter mounts like the driver's mounter and calls after each
// mount.
type measuredMounter struct {
	mount.Interface
	after func(step string)
}

func (m measuredMounter) Mount(source, target, fstype string, options []string) error {
	defer m.after(fmt.Sprintf("after the driver mounted %s (%s)", fstype, strings.Join(options, ",")))
	return m.Interface.Mount(source, target, fstype, options)
}

func (m measuredMounter) MountSensitive(source, target, fstype string, options, sensitive []string) error {
	defer m.after(fmt.Sprintf("after the driver mounted %s (%s)", fstype, strings.Join(options, ",")))
	return m.Interface.MountSensitive(source, target, fstype, options, sensitive)
}
