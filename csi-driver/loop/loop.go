// Package loop attaches files to loop devices with losetup and finds those
// attachments again by backing file, so a restarted driver needs no state of
// its own to know which loop device serves which volume.
package loop

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// sysBlock is where the kernel lists block devices and, for loop devices,
// their backing files.
const sysBlock = "/sys/block"

// File is a backing file. Path opens it; Dev and Name identify it, and
// they still do after the filesystem holding it was detached lazily and
// mounted again, or while it is not mounted at all (see FindAll).
type File struct {
	// Path is where the file is now.
	Path string
	// Dev is the device number of the filesystem holding the file, as
	// stat reports it.
	Dev uint64
	// Name is the file's path below the mount point of that filesystem,
	// starting with "/".
	Name string
}

func (f File) String() string { return f.Path }

// Find returns the loop device backed by file, or "" when none is.
func Find(ctx context.Context, file File) (string, error) {
	devs, err := FindAll(ctx, file)
	if err != nil || len(devs) == 0 {
		return "", err
	}
	return devs[0], nil
}

// FindAll returns every loop device backed by file, read from sysfs rather
// than by running losetup: it is on the path of every stage, publish and
// delete, and a process start costs more than the whole lookup.
//
// A device serves file when its backing file is on file's filesystem under
// file's name there. The kernel names a backing file by its path from the
// root of the mount it was opened through: the full path while the disk is
// mounted, but "/volumes/x" where the driver asks about
// "/mnt/disks/d1/volumes/x" once that mount was detached lazily (a failed
// or pulled disk), also after the disk was mounted again, when the device
// is still open on the old mount. So a device whose name ends in file.Name
// is confirmed with LOOP_GET_STATUS64, as losetup does: by the inode too
// while file can be reached on its filesystem (another file of that name
// on the disk, an admin's reflink backup, is not file), by the filesystem
// alone while it cannot, as on a lost disk. A device whose backing file was
// deleted (the kernel appends " (deleted)") is never a match: its name may
// belong to a volume made since.
func FindAll(_ context.Context, file File) ([]string, error) {
	if !strings.HasPrefix(file.Name, "/") || !strings.HasSuffix(file.Path, file.Name) {
		return nil, fmt.Errorf("loop: %q is not the name of %s below its mount point", file.Name, file.Path)
	}
	entries, err := os.ReadDir(sysBlock)
	if err != nil {
		return nil, fmt.Errorf("listing block devices: %w", err)
	}
	ino := inode(file)
	var devs []string
	buf := make([]byte, unix.PathMax+16)
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "loop") {
			continue
		}
		if !backedByName(e.Name(), file, buf) {
			continue
		}
		dev := "/dev/" + e.Name()
		info, err := loopStatus(dev)
		if errors.Is(err, unix.ENXIO) || errors.Is(err, unix.ENOENT) {
			continue // detached since sysfs was read
		}
		if err != nil {
			// It may be the one serving file: better no answer than "none".
			return nil, fmt.Errorf("reading the backing file of %s: %w", dev, err)
		}
		if serves(info, file, ino) {
			devs = append(devs, dev)
		}
	}
	sort.Strings(devs)
	return devs, nil
}

// backedByName reports whether the kernel names loop device name's
// backing file as one whose path ends in file's name on its filesystem
// (see FindAll); buf holds the name read.
func backedByName(name string, file File, buf []byte) bool {
	backing, ok := readSmall(filepath.Join(sysBlock, name, "loop", "backing_file"), buf)
	return ok && strings.HasSuffix(strings.TrimSuffix(backing, "\n"), file.Name)
}

// inode returns the inode of file to match a device's backing file
// against, or 0 when file cannot be reached on its filesystem.
func inode(file File) uint64 {
	var st unix.Stat_t
	if err := unix.Stat(file.Path, &st); err == nil && st.Dev == file.Dev {
		return st.Ino
	}
	return 0
}

// serves reports whether the loop device with status info is backed by
// file, whose inode is ino (see inode).
func serves(info *unix.LoopInfo64, file File, ino uint64) bool {
	return info.Device == file.Dev && (ino == 0 || info.Inode == ino)
}

func loopStatus(dev string) (*unix.LoopInfo64, error) {
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	return unix.IoctlLoopGetStatus64(fd)
}

// readSmall reads a sysfs attribute with bare system calls: a node has
// dozens of loop devices and this runs for each on every lookup, where
// os.ReadFile's extra stat and poller registration would double the cost.
// ok is false when the attribute does not exist (the device is unbound) or
// cannot be read.
func readSmall(path string, buf []byte) (string, bool) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", false
	}
	defer unix.Close(fd)
	n, err := unix.Read(fd, buf)
	if err != nil || n <= 0 {
		return "", false
	}
	return string(buf[:n]), true
}

// ErrReadOnlyDiffers is returned by Attach when file is attached already,
// read-only where read-write was asked for or the other way round.
var ErrReadOnlyDiffers = errors.New("attached already, with the other read-only setting")

// ErrBeingDetached is returned by Attach when file's device is marked to be
// freed on last close and the mark cannot be taken off.
var ErrBeingDetached = errors.New("attached, but being detached")

// Attach returns the loop device backed by file, attaching one with direct
// I/O and 4096-byte sectors when there is none, so calling it again is
// harmless. A read-only device refuses every write; the setting belongs to
// the attachment (LO_FLAGS_READ_ONLY), so the loop device is writable
// again for the next file it serves, unlike a device made read-only with
// BLKROSET.
func Attach(ctx context.Context, file File, readOnly bool) (string, error) {
	dev, err := Find(ctx, file)
	if err != nil {
		return "", err
	}
	if dev != "" {
		kept, err := keep(dev, file, readOnly)
		if err != nil {
			return "", err
		}
		if kept {
			return dev, disableDiscard(dev)
		}
		// Freed since Find saw it: attach the file anew.
	}
	// The sector size is pinned: with direct I/O the kernel otherwise
	// derives it from the backing file's I/O alignment, which on XFS is
	// 512 bytes for a plain file and 4096 for one sharing extents (a
	// snapshot restore or clone), and a filesystem made with 4096-byte
	// sectors cannot be mounted from a device with 512-byte ones, nor the
	// other way round. 4096 satisfies every backing device's alignment.
	args := []string{"--find", "--show", "--direct-io=on", "--sector-size", "4096"}
	if readOnly {
		args = append(args, "--read-only")
	}
	out, err := run(ctx, "losetup", append(args, file.Path)...)
	if err != nil {
		return "", err
	}
	dev = strings.TrimSpace(out)
	if dev == "" {
		return "", fmt.Errorf("losetup printed no device for %s", file)
	}
	if err := disableDiscard(dev); err != nil {
		_, _ = run(ctx, "losetup", "--detach", dev)
		return "", err
	}
	return dev, nil
}

// keep makes sure that dev, which Find saw backed by file, stays attached to
// it, and reports whether it still is. A device detached while something
// else held it open (udev probing it, any process with its node open) is
// not freed: the kernel marks it LO_FLAGS_AUTOCLEAR, to be freed on last
// close, and Detach fails after its wait. Handed out by a stage that
// follows, it would be freed under the pod using it once that other opener
// closes, and the next volume attached would get its number, so the pod's
// device node would lead to another volume's data. keep clears the mark
// (LOOP_SET_STATUS64 may, as losetup cannot), so the device stays until
// Detach frees it, or fails with ErrBeingDetached. It holds dev open
// throughout, so dev cannot be freed, and its number given to another
// file, between the check of its backing file and the clearing.
func keep(dev string, file File, readOnly bool) (bool, error) {
	fd, info, err := openServing(dev, file)
	if fd < 0 || err != nil {
		return false, err
	}
	defer unix.Close(fd)
	if (info.Flags&unix.LO_FLAGS_READ_ONLY != 0) != readOnly {
		return false, fmt.Errorf("%s on %s: %w", file, dev, ErrReadOnlyDiffers)
	}
	if info.Flags&unix.LO_FLAGS_AUTOCLEAR == 0 {
		return true, nil
	}
	info.Flags &^= unix.LO_FLAGS_AUTOCLEAR
	err = unix.IoctlLoopSetStatus64(fd, info)
	if err == nil {
		if info, err = unix.IoctlLoopGetStatus64(fd); err == nil && info.Flags&unix.LO_FLAGS_AUTOCLEAR != 0 {
			err = errors.New("the kernel kept the flag")
		}
	}
	if err != nil {
		return false, fmt.Errorf("%s on %s: %w: clearing LO_FLAGS_AUTOCLEAR: %w", file, dev, ErrBeingDetached, err)
	}
	return true, nil
}

// openServing opens dev if it serves file and returns the descriptor, to
// be closed by the caller, and dev's status read through it; held open,
// dev cannot be freed and its number given to another file. fd is -1 when
// dev serves no file or another one.
func openServing(dev string, file File) (fd int, info *unix.LoopInfo64, err error) {
	fd, err = unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENXIO) || errors.Is(err, unix.ENOENT) {
		return -1, nil, nil
	}
	if err != nil {
		return -1, nil, fmt.Errorf("opening %s: %w", dev, err)
	}
	info, err = unix.IoctlLoopGetStatus64(fd)
	// Where file cannot be reached, its filesystem alone does not tell it
	// from another file there: its name must match too, as in FindAll.
	ino := inode(file)
	if err == nil && serves(info, file, ino) && (ino != 0 || backedByName(filepath.Base(dev), file, make([]byte, unix.PathMax+16))) {
		return fd, info, nil
	}
	unix.Close(fd)
	if err != nil && !errors.Is(err, unix.ENXIO) {
		return -1, nil, fmt.Errorf("reading the status of %s: %w", dev, err)
	}
	return -1, nil, nil
}

// disableDiscard stops dev from passing discards to its backing file. A loop
// device turns a discard into a hole punched in the file, which would hand
// the volume's preallocated space back to the disk (mkfs discards the whole
// device, fstrim and mount -o discard do it later) and let the disk promise
// that space twice. It must run before anything else uses the device, and
// again after a refresh, which recomputes the queue limits.
//
// It also keeps zeroing from punching holes. The loop driver turns a
// REQ_OP_WRITE_ZEROES without REQ_NOUNMAP (ext4's lazy inode table
// initialisation and extent zeroing, fallocate --punch-hole on the device)
// into a hole punched in the file too, and write_zeroes_max_bytes is
// read-only; but since Linux 5.19 the loop driver refuses every request it
// would turn into a fallocate while the discard limit is 0, and the block
// layer then writes zeroes into the allocated blocks instead.
// TestPreallocationStaysAllocated (package driver) checks every such path.
func disableDiscard(dev string) error {
	path := filepath.Join("/sys/block", filepath.Base(dev), "queue", "discard_max_bytes")
	err := os.WriteFile(path, []byte("0"), 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("disabling discard on %s: %w", dev, err)
	}
	return nil
}

// Detach detaches every loop device backed by file; none is fine.
func Detach(ctx context.Context, file File) error {
	devs, err := FindAll(ctx, file)
	if err != nil {
		return err
	}
	var errs []error
	for _, dev := range devs {
		if err := detachServing(dev, file); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return waitDetached(ctx, file)
}

// detachServing detaches dev if it still serves file. FindAll found dev
// a moment ago, but it may have been freed since (a device marked to be
// freed on last close, whose last opener closed) and its number given to
// another volume's file by a stage running meanwhile: detaching that number
// would mark the other volume's device to be freed under the pod using it.
// So dev is opened, its backing file checked on that descriptor and the
// detach asked for on the same one (LOOP_CLR_FD, as losetup --detach does
// without the check): held open, dev cannot change hands in between. The
// kernel frees it once no one holds it open, at the latest when the
// descriptor is closed here.
func detachServing(dev string, file File) error {
	fd, _, err := openServing(dev, file)
	if fd < 0 || err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0); err != nil && !errors.Is(err, unix.ENXIO) {
		return fmt.Errorf("detaching %s from %s: %w", dev, file, err)
	}
	return nil
}

// detachTimeout bounds the wait for a deferred detach.
const detachTimeout = 10 * time.Second

// waitDetached waits until no loop device is backed by file. The kernel
// only marks a device that someone still holds open (udev probing it, for
// one) for detaching on last close, and losetup returns at once; callers
// such as DeleteVolume need the detach to have happened.
func waitDetached(ctx context.Context, file File) error {
	deadline := time.Now().Add(detachTimeout)
	for {
		devs, err := FindAll(ctx, file)
		if err != nil || len(devs) == 0 {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s is still attached to %s after detaching: is it in use?", file, strings.Join(devs, ", "))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Refresh makes dev pick up its backing file's new size.
func Refresh(ctx context.Context, dev string) error {
	if _, err := run(ctx, "losetup", "--set-capacity", dev); err != nil {
		return err
	}
	return disableDiscard(dev)
}

// DirectIO reports whether dev does direct I/O on its backing file; the
// kernel silently falls back to buffered I/O when alignment forbids it.
func DirectIO(dev string) (bool, error) {
	data, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "loop", "dio"))
	if err != nil {
		return false, fmt.Errorf("reading direct I/O state of %s: %w", dev, err)
	}
	return strings.TrimSpace(string(data)) == "1", nil
}

func run(ctx context.Context, name string, args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// ErrFreesSpace is KeepsSpace's verdict that a loop device frees its
// backing file's blocks on discard or zeroing.
var ErrFreesSpace = errors.New("a loop device frees its backing file's blocks when discarded or zeroed, although its discard limit is 0")

// probeSize is the size of KeepsSpace's probe file.
const probeSize = 1 << 20

// KeepsSpace checks that a device Attach makes keeps its backing file's
// blocks allocated when it is discarded (mkfs, fstrim, blkdiscard) and
// zeroed with unmapping allowed (ext4's zeroing): a volume's space is
// allocated when it is made, and a hole punched in it would let the disk
// hand that space to another volume, so that the first one's writes fail
// once the disk is full. Since Linux 5.19 the loop driver refuses both
// while the device's discard limit is 0, as Attach sets it; before, the
// limit does not stop them. It makes a probe file of probeSize at
// file.Path (on the filesystem it checks; removed again), attaches it
// with attach, discards and zeroes the whole device, and returns
// ErrFreesSpace if the file lost blocks. A filesystem without room for
// the probe file answers an error that wraps ENOSPC (or EDQUOT).
func KeepsSpace(ctx context.Context, file File) error {
	return KeepsSpaceAttached(ctx, file, func(f File) (string, error) { return Attach(ctx, f, false) })
}

// KeepsSpaceAttached is KeepsSpace with devices attach makes (a test's,
// attached as a kernel before 5.19 would leave them).
func KeepsSpaceAttached(ctx context.Context, file File, attach func(File) (string, error)) (err error) {
	if err := Detach(ctx, file); err != nil {
		return err
	}
	if err := os.Remove(file.Path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	f, err := os.OpenFile(file.Path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("making the probe file: %w", err)
	}
	err = unix.Fallocate(int(f.Fd()), 0, 0, probeSize)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	defer func() {
		if rerr := os.Remove(file.Path); rerr != nil && err == nil {
			err = rerr
		}
	}()
	if err != nil {
		return fmt.Errorf("allocating the probe file: %w", err)
	}
	dev, err := attach(file)
	if err != nil {
		return err
	}
	defer func() {
		if derr := Detach(ctx, file); derr != nil && err == nil {
			err = derr
		}
	}()
	fd, err := unix.Open(dev, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening %s: %w", dev, err)
	}
	defer unix.Close(fd)
	whole := [2]uint64{0, probeSize}
	// Each is refused (EOPNOTSUPP) where the limit holds, and zeroing
	// then writes zeroes into the allocated blocks; the file is looked
	// at after each, as that write would fill a hole the discard made.
	for _, op := range []struct {
		name string
		req  uintptr
	}{{"discarded", unix.BLKDISCARD}, {"zeroed", unix.BLKZEROOUT}} {
		_, _, _ = unix.Syscall(unix.SYS_IOCTL, uintptr(fd), op.req, uintptr(unsafe.Pointer(&whole)))
		var st unix.Stat_t
		if err := unix.Stat(file.Path, &st); err != nil {
			return err
		}
		if allocated := st.Blocks * 512; allocated < probeSize {
			var uts unix.Utsname
			_ = unix.Uname(&uts)
			return fmt.Errorf("%w (kernel %s: %s, %s kept %d of its %d bytes)", ErrFreesSpace,
				unix.ByteSliceToString(uts.Release[:]), op.name, file.Path, allocated, probeSize)
		}
	}
	return nil
}
