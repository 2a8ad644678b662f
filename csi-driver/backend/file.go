package backend

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
	"k8s.io/mount-utils"

	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
	"github.com/diskfit/diskfit/csi-driver/fault"
	"github.com/diskfit/diskfit/csi-driver/loop"
)

// File keeps each volume as a preallocated file on a mounted filesystem,
// attached to a loop device. Next to every data file is a small JSON record
// written atomically before the data file exists, so a crash at any point
// leaves either nothing or a record that says what to finish or undo. The
// records are in records.go, what Start undoes in recovery.go, and the
// space copy-on-write may still need in cow.go.
type File struct {
	// name is the disk's name, which volume and snapshot IDs carry.
	name     string
	path     string
	reserved atomic.Int64
	// faults stops the process between steps in crash tests; nil otherwise.
	faults *fault.Injector

	volumes   string
	snapshots string
	// dev is the filesystem's device number at Start; a different one
	// later means the disk's filesystem was unmounted from under us.
	dev uint64
	// volumesDev is the device number of the volume directory's
	// filesystem, taken by Start before it takes the disk (see loopFile):
	// a driver that cannot serve the disk yet (another one holds it) still
	// finds and frees the volumes' loop devices.
	volumesDev atomic.Uint64
	// reflink is the reflink probe's answer (hasReflink).
	reflink atomic.Int32
	// copiesOnWrite says that the volume directory's filesystem copies
	// every overwrite (btrfs), set at Start: its data files are made
	// NOCOW (writeInPlace).
	copiesOnWrite atomic.Bool
	// claimed says that the state directory's disk record names this
	// disk (claimStateDir).
	claimed atomic.Bool
	space   spaceGuard
	cow     cowCache
	// spaceUnchecked says that the space check (checkSpaceKept) could
	// not run yet: the filesystem was read-only or too full for its
	// probe file. Health and Attach run it again until it answers.
	spaceUnchecked atomic.Bool
	// spaceChecking is held by a space check of this disk: one check's
	// removal of an earlier probe must not take another's from under it.
	spaceChecking sync.Mutex

	// lock is held on the state directory while this backend serves the
	// disk (lockDisk).
	lock serveLock
}

var _ Backend = &File{}

// NewFile returns a file backend for disk name, the filesystem mounted at
// path, that keeps reserved bytes free. faults is nil outside crash tests.
func NewFile(name, path string, reserved int64, faults *fault.Injector) *File {
	dir := filepath.Join(path, stateDirName)
	f := &File{
		name:      name,
		path:      path,
		faults:    faults,
		volumes:   filepath.Join(dir, volumesDirName),
		snapshots: filepath.Join(dir, snapshotDirName),
	}
	f.reserved.Store(reserved)
	return f
}

// SetReserved implements Backend.
func (f *File) SetReserved(bytes int64) { f.reserved.Store(bytes) }

// Kind implements Backend.
func (f *File) Kind() v1alpha1.Backend { return v1alpha1.BackendFile }

// Start implements Backend: it creates the state directories, takes the
// disk (lockDisk), checks that the state directories are this disk's
// (claimStateDir), probes reflink support, checks that volumes keep their
// space (checkSpaceKept; a disk where the check cannot run yet starts
// all the same, see spaceKept) and rolls back interrupted creations and
// deletions. A Start that fails lets go of the disk again.
func (f *File) Start(ctx context.Context) (err error) {
	if err := f.checkMounted(); err != nil {
		return err
	}
	if err := f.makeStateDirs(); err != nil {
		return err
	}
	// The volumes' own filesystem, as their loop devices report it: the
	// disk's, unless diskfit/ is a filesystem or btrfs subvolume of its own.
	var st unix.Stat_t
	if err := unix.Stat(f.volumes, &st); err != nil {
		return fmt.Errorf("stat %s: %w", f.volumes, err)
	}
	f.volumesDev.Store(st.Dev)
	var fs unix.Statfs_t
	if err := unix.Statfs(f.volumes, &fs); err != nil {
		return fmt.Errorf("statfs %s: %w", f.volumes, err)
	}
	f.copiesOnWrite.Store(fs.Type == unix.BTRFS_SUPER_MAGIC)
	if err := f.lockDisk(); err != nil {
		if errors.Is(err, ErrServedByAnotherProcess) {
			// The process holding the disk may be one hung on it.
			if rerr := f.answers(); rerr != nil {
				return rerr
			}
		}
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
		}
	}()
	if err := f.claimStateDir(ctx); err != nil {
		return err
	}
	if err := unix.Stat(f.path, &st); err != nil {
		return fmt.Errorf("stat %s: %w", f.path, err)
	}
	f.dev = st.Dev
	f.reflink.Store(reflinkUnknown)
	f.hasReflink()
	f.spaceUnchecked.Store(false)
	if err := f.checkSpaceKept(ctx); errors.Is(err, errSpaceUnchecked) {
		f.spaceUnchecked.Store(true)
	} else if err != nil {
		return err
	}
	if err := f.recover(ctx, f.volumes); err != nil {
		return err
	}
	return f.recover(ctx, f.snapshots)
}

// probeKey is the key of the probe file checkSpaceKept makes in the volume
// directory; no volume key starts with a dot.
const probeKey = ".space-probe"

// keepsSpace is loop.KeepsSpace; tests replace it (setKeepsSpace).
var keepsSpace = loop.KeepsSpace

// spaceVerdicts holds keepsSpace's verdicts by filesystem type: they
// depend on the kernel and the filesystem, not on the disk, and a check
// attaches a loop device. Disks of one type wait for one check; a check
// hung on one type holds up no other.
var spaceVerdicts = struct {
	sync.Mutex
	byType map[int64]*spaceVerdict
}{byType: map[int64]*spaceVerdict{}}

type spaceVerdict struct {
	mu    sync.Mutex
	known bool
	err   error
}

func forgetSpaceVerdicts() {
	spaceVerdicts.Lock()
	defer spaceVerdicts.Unlock()
	clear(spaceVerdicts.byType)
}

// errSpaceUnchecked says that checkSpaceKept could not run: the
// filesystem is read-only, or has no room for the probe file.
var errSpaceUnchecked = errors.New("the space check cannot run yet")

// checkSpaceKept refuses the disk when its volumes' loop devices would
// free their backing files' blocks on discard (loop.KeepsSpace): a
// volume's space is allocated when it is made, and such a kernel (before
// Linux 5.19) would give it back to the disk at the volume's first mkfs
// or fstrim, for another volume to take, so that the first one's writes
// fail once the disk is full. It returns errSpaceUnchecked, concluding
// nothing, when the check cannot run on the disk (read-only, or without
// room for the probe file) and no disk of its filesystem type answered
// it yet.
func (f *File) checkSpaceKept(ctx context.Context) error {
	f.spaceChecking.Lock()
	defer f.spaceChecking.Unlock()
	// A check cut short (the driver killed mid-check) leaves its probe
	// file, maybe attached: it goes before anything reads the volume
	// directory, which would take it for a volume's leftover and remove
	// it from under its loop device.
	probe := f.loopFile(probeKey)
	if _, err := os.Lstat(probe.Path); err == nil {
		if err := loop.Detach(ctx, probe); err != nil {
			return fmt.Errorf("detaching an earlier space check's probe: %w", err)
		}
		if err := os.Remove(probe.Path); err != nil {
			return fmt.Errorf("removing an earlier space check's probe: %w", err)
		}
	}
	var st unix.Statfs_t
	if err := unix.Statfs(f.volumes, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", f.volumes, err)
	}
	if st.Flags&unix.ST_RDONLY != 0 {
		// Nothing discards into a read-only filesystem's files; it is
		// checked once mounted writable.
		return errSpaceUnchecked
	}
	spaceVerdicts.Lock()
	v, ok := spaceVerdicts.byType[st.Type]
	if !ok {
		v = &spaceVerdict{}
		spaceVerdicts.byType[st.Type] = v
	}
	spaceVerdicts.Unlock()
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.known {
		if free := int64(st.Bfree) * st.Frsize; free < probeRoom {
			return fmt.Errorf("%w: %d bytes free", errSpaceUnchecked, free)
		}
		err := keepsSpace(ctx, probe)
		if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
			// A full disk is no answer (nor a failure): it is checked
			// once it has room again.
			return fmt.Errorf("%w: %w", errSpaceUnchecked, err)
		}
		if err != nil && !errors.Is(err, loop.ErrFreesSpace) {
			// The check could not tell (no loop device free, say):
			// the next start checks again.
			return fmt.Errorf("checking that volumes keep their space: %w", err)
		}
		v.known, v.err = true, err
	}
	if v.err != nil {
		return fmt.Errorf("%w: file disks need Linux 5.19 or later, where a volume's space stays allocated; on this kernel use the lvm backend (thick logical volumes)", v.err)
	}
	return nil
}

// probeRoom is the free space below which the space check does not try
// its probe file (loop.KeepsSpace allocates 1 MiB).
const probeRoom = 1 << 20

// spaceKept runs the space check (checkSpaceKept) of a disk that started
// before the check could run, until it answers, and returns its refusal
// (loop.ErrFreesSpace) once it does. A disk full to the last byte is a
// routine condition, and refusing it at Start would make its volumes
// unavailable and the disk count as failed for want of one free MiB; it
// starts instead, and Health and Attach call this. Nothing can be made on
// a disk so full; it is checked as soon as it has room again (a volume
// deleted, a discard punched into a volume by a kernel before 5.19), at
// the next health check (status refresh, placement) or attachment, and
// then refused: unhealthy, saying why, and attaching its volumes refused.
// Volumes attached meanwhile stay attached (see docs/reliability.md). A
// check that cannot tell (no loop device free, say) does not make a
// served disk unhealthy: the next call checks again.
func (f *File) spaceKept(ctx context.Context) error {
	if !f.spaceUnchecked.Load() {
		return nil
	}
	err := f.checkSpaceKept(ctx)
	switch {
	case err == nil:
		f.spaceUnchecked.Store(false)
		return nil
	case errors.Is(err, loop.ErrFreesSpace):
		return err
	case !errors.Is(err, errSpaceUnchecked):
		klog.FromContext(ctx).Error(err, "Cannot check yet that the disk's volumes keep their space; the next health check or attachment tries again", "disk", f.name)
	}
	return nil
}

// lockDisk takes the disk (serveLock) until Close. The lock is on the
// state directory itself: it is the disk's whoever mounts it, and locking
// it needs nothing written (a read-only or full filesystem is locked as
// any other).
func (f *File) lockDisk() error {
	return f.lock.take(filepath.Join(f.path, stateDirName), os.O_RDONLY|unix.O_DIRECTORY, "the disk at "+f.path)
}

// Close implements Backend: it releases the disk's lock (lockDisk).
func (f *File) Close() error { return f.lock.release() }

// checkMounted refuses a path that is neither a filesystem mounted from its
// root nor already holds diskfit's state: when a disk failed to mount, its
// path is an empty directory on the root filesystem, and volumes made there
// would fill the node's root disk and be hidden once the disk is mounted
// over them. In the driver's container the path may be a bind mount of the
// host's directory (a hostPath volume), a mount point whatever the host
// has there: the mount table's root of the bind tells a directory of the
// host's root filesystem from the disk's own. Creating <path>/diskfit by
// hand opts a plain directory in.
func (f *File) checkMounted() error {
	if _, err := os.Stat(filepath.Join(f.path, stateDirName)); err == nil {
		return nil
	}
	refuse := func(what string) error {
		return fmt.Errorf("%s %s and holds no %s directory: is the disk mounted? (create %s to use a plain directory)",
			f.path, what, stateDirName, filepath.Join(f.path, stateDirName))
	}
	var self, parent unix.Stat_t
	if err := unix.Stat(f.path, &self); err != nil {
		return fmt.Errorf("stat %s: %w", f.path, err)
	}
	if err := unix.Stat(filepath.Dir(f.path), &parent); err != nil {
		return fmt.Errorf("stat %s: %w", filepath.Dir(f.path), err)
	}
	if self.Dev == parent.Dev && self.Ino != parent.Ino {
		return refuse("is not a mount point")
	}
	real, err := filepath.EvalSymlinks(f.path)
	if err != nil {
		return err
	}
	infos, err := mount.ParseMountInfo("/proc/self/mountinfo")
	if err != nil {
		return fmt.Errorf("reading mountinfo: %w", err)
	}
	// The last mount at the path is the one in force. A btrfs subvolume
	// mounted as the disk has the subvolume as its root.
	for i := len(infos) - 1; i >= 0; i-- {
		if mi := infos[i]; mi.MountPoint == real {
			if mi.Root != "/" && !(mi.FsType == "btrfs" && slices.Contains(mi.SuperOptions, "subvol="+mi.Root)) {
				return refuse(fmt.Sprintf("is a bind mount of directory %s of %s, not a disk's filesystem,", mi.Root, mi.Source))
			}
			break
		}
	}
	return nil
}

// stateDirMode is the mode of the state directories: only the driver (root)
// reads the records or opens the data files, which hold the volumes' data.
// Records and data files are created 0600.
const stateDirMode os.FileMode = 0o700

// makeStateDirs creates the state directories, or checks and tightens
// existing ones (<path>/diskfit may have been made by hand). Each must be
// a real directory: a symlink would send records and data files, and
// their removal, to wherever it points.
func (f *File) makeStateDirs() error {
	for _, dir := range []string{filepath.Dir(f.volumes), f.volumes, f.snapshots} {
		if err := os.Mkdir(dir, stateDirMode); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("creating state directory: %w", err)
		}
		st, err := os.Lstat(dir)
		if err != nil {
			return fmt.Errorf("state directory: %w", err)
		}
		if !st.IsDir() {
			return fmt.Errorf("state directory %s is not a directory (%s)", dir, st.Mode().Type())
		}
		if st.Mode().Perm() != stateDirMode {
			if err := os.Chmod(dir, stateDirMode); err != nil {
				return fmt.Errorf("restricting state directory: %w", err)
			}
		}
	}
	return nil
}

// Health implements Backend. A disk is unhealthy when its path is gone,
// when another filesystem is at its path (it was unmounted), or when its
// filesystem cannot read the volume directory: a filesystem whose device
// failed or disappeared while mounted shuts down (XFS, ext4) and answers
// reads with EIO, even for what stat would still serve from the cache.
// A disk that started before its space check could run is also unhealthy
// once that check refuses it (spaceKept).
func (f *File) Health(ctx context.Context) error {
	var st unix.Stat_t
	if err := unix.Stat(f.path, &st); err != nil {
		return fmt.Errorf("disk path %s: %w", f.path, err)
	}
	if st.Dev != f.dev {
		return fmt.Errorf("the filesystem at %s changed (device %d, was %d): was the disk unmounted?", f.path, st.Dev, f.dev)
	}
	if err := f.readVolumeDir(false); err != nil {
		return err
	}
	return f.spaceKept(ctx)
}

// readVolumeDir reads the volume directory, which a filesystem shut down
// after its device failed answers with EIO (XFS; ext4 lists it from its
// cache). With sync, it also syncs the directory, which a shut-down ext4
// answers with EIO as well.
func (f *File) readVolumeDir(sync bool) error {
	fd, err := unix.Open(f.volumes, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening volume directory %s: %w", f.volumes, err)
	}
	defer unix.Close(fd)
	var buf [4096]byte
	if _, err := unix.Getdents(fd, buf[:]); err != nil {
		return fmt.Errorf("reading volume directory %s: %w (has the disk's device failed?)", f.volumes, err)
	}
	if sync {
		if err := unix.Fsync(fd); err != nil {
			return fmt.Errorf("syncing volume directory %s: %w (has the disk's device failed?)", f.volumes, err)
		}
	}
	return nil
}

// answers checks, without serving the disk, that its filesystem still
// works: a Start that finds the disk served by another process
// (ErrServedByAnotherProcess) calls it, as that process may be one hung
// on a dead disk, which must count as failed. A directory read and its
// fsync may be answered without the device (XFS with nothing to commit);
// a read of the disk's record that bypasses the page cache must reach it,
// so a device that hangs hangs it, and the disk is reported as not
// answering (a failure) when its observation's deadline passes.
func (f *File) answers() error {
	if err := f.readVolumeDir(true); err != nil {
		return err
	}
	return readFromDevice(filepath.Join(f.path, stateDirName, diskRecordName))
}

// readFromDevice reads the first block of the file at path with O_DIRECT,
// from the device rather than the page cache. A file that does not exist
// (a disk without its record yet), or a filesystem that refuses O_DIRECT
// (ext4 with data=journal), is no answer either way: nil.
func readFromDevice(path string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECT|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EINVAL) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("opening %s: %w (has the disk's device failed?)", path, err)
	}
	defer unix.Close(fd)
	// O_DIRECT wants a buffer aligned to the device's blocks: a page is.
	buf, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return fmt.Errorf("a buffer to read %s: %w", path, err)
	}
	defer unix.Munmap(buf)
	if _, err := unix.Pread(fd, buf, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("reading %s from the device: %w (has the disk's device failed?)", path, err)
	}
	return nil
}

// Usage implements Backend: statfs, minus headroom, minus what
// copy-on-write of snapshots and clones may still need (see cowBytes).
func (f *File) Usage(_ context.Context) (Usage, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(f.path, &st); err != nil {
		return Usage{}, fmt.Errorf("statfs %s: %w", f.path, err)
	}
	size := int64(st.Blocks) * st.Frsize
	avail := int64(st.Bavail) * st.Frsize
	if f.hasReflink() {
		cow, err := f.cowBytes()
		if err != nil {
			return Usage{}, err
		}
		avail -= cow
	}
	reserved := f.reserved.Load()
	u := Usage{CapacityBytes: max(size-reserved, 0), FreeBytes: max(avail-reserved, 0)}
	u.FreeBytes = min(u.FreeBytes, u.CapacityBytes)
	return u, nil
}

func (f *File) volumeFile(key string) string   { return filepath.Join(f.volumes, key+dataSuffix) }
func (f *File) snapshotFile(key string) string { return filepath.Join(f.snapshots, key+dataSuffix) }

// loopFile is volume key's data file as the loop package knows it: by its
// place on the volumes' filesystem, so that its loop devices are found
// even while the disk is away.
func (f *File) loopFile(key string) loop.File {
	path := f.volumeFile(key)
	rel, err := filepath.Rel(f.path, path)
	if err != nil {
		rel = path // never: the volume directory is below f.path
	}
	return loop.File{Path: path, Dev: f.volumesDev.Load(), Name: "/" + rel}
}

// CreateVolume implements Backend.
func (f *File) CreateVolume(ctx context.Context, req CreateRequest) (*Volume, error) {
	if err := f.Health(ctx); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnhealthy, err)
	}
	var source string
	switch {
	case req.FromSnapshot != "":
		if _, err := f.GetSnapshot(ctx, req.FromSnapshot); err != nil {
			return nil, fmt.Errorf("source snapshot: %w", err)
		}
		source = f.snapshotFile(req.FromSnapshot)
	case req.FromVolume != "":
		if _, err := f.GetVolume(ctx, req.FromVolume); err != nil {
			return nil, fmt.Errorf("source volume: %w", err)
		}
		source = f.volumeFile(req.FromVolume)
	}
	var byteCopy bool
	if source != "" {
		var err error
		if byteCopy, err = f.howToCopy(req.FromVolume != ""); err != nil {
			return nil, fmt.Errorf("copying %s: %w", source, err)
		}
	}
	vol := &Volume{
		Key: req.Key, Name: req.Name, SizeBytes: req.SizeBytes,
		PVCNamespace: req.PVCNamespace, PVCName: req.PVCName,
		SourceSnapshot: req.FromSnapshot, SourceVolume: req.FromVolume,
		State: StateCreating, CreatedAt: time.Now().UTC(), Refs: Refs{NeverReferenced: true},
		Content: ContentNone,
	}
	meta := filepath.Join(f.volumes, req.Key+metaSuffix)
	if err := f.claimBeforeCreating(ctx); err != nil {
		return nil, err
	}
	if err := f.clearLeftover(ctx, f.volumes, req.Key); err != nil {
		return nil, err
	}
	// The only record is the "ready" one below, synced together with the
	// data file before it is renamed into place, its directory entry
	// synced before success is reported. A crash before that leaves at
	// most a data file without a record, which Start removes.
	f.faults.Reach(fault.CreateVolumeWayCleared)
	// A copy is at least as large as its source's data file.
	book := req.SizeBytes
	if st, err := os.Stat(source); source != "" && err == nil {
		book = max(book, st.Size())
	}
	data, size, err := f.makeDataFile(ctx, f.volumeFile(req.Key), source, byteCopy, req.SizeBytes, book)
	if err != nil {
		if rerr := f.removePair(ctx, f.volumes, req.Key); rerr != nil {
			return nil, errors.Join(err, rerr)
		}
		return nil, err
	}
	defer data.Close()
	vol.SizeBytes = max(vol.SizeBytes, size)
	if source != "" {
		// A copy carries its source's filesystem (and data), and is never
		// formatted; unless nothing of the source was ever written, which
		// leaves the copy as empty as a new volume.
		vol.Content = ContentFilesystem
		if blank, err := blankFile(f.volumeFile(req.Key)); err == nil && blank {
			vol.Content = ContentNone
		}
	}
	f.faults.Reach(fault.CreateVolumeDataAllocated)
	vol.State = StateReady
	if err := f.writeJSONAtomic(meta, vol, true, fault.CreateVolumeReadyTempWritten, data); err != nil {
		if rerr := f.removePair(ctx, f.volumes, req.Key); rerr != nil {
			return nil, errors.Join(err, rerr)
		}
		return nil, err
	}
	f.faults.Reach(fault.CreateVolumeReadyRecorded)
	return vol, nil
}

// makeDataFile creates path as a reflink copy of source when source is set,
// and with size bytes really allocated when size is positive. A snapshot
// passes 0: it is never written, so only the extents it shares with its
// volume hold data, and allocating the rest (the parts of the volume never
// written, which a reflink copy leaves as holes) would cost a snapshot of
// a fresh volume the volume's whole size.
//
// It returns the file, open and not yet synced (the ready record's write
// syncs it, see writeJSONAtomic), and its size, which a copy takes from
// its source and may be larger than the size the source's record gave a
// moment before (an expansion of the source ran meanwhile, or Start kept
// a grown file): the copy's record must say that size, or Start would cut
// a volume copied so back to its record (see cutBack), and a volume
// copied so is allocated to it.
//
// The file is made and allocated under the disk's space guard (need is
// what it takes of the disk), and synced after the guard is released: the
// space is taken once fallocate returns (the filesystem's free count says
// so at once), and syncing under the guard would make concurrent
// creations on the disk wait for each other's sync instead of sharing the
// filesystem's log writes.
func (f *File) makeDataFile(ctx context.Context, path, source string, byteCopy bool, size, need int64) (*os.File, int64, error) {
	var out *os.File
	err := f.space.allocate(ctx, f.Usage, need, func() error {
		defer f.cow.invalidate() // a copy shares its source's extents
		var err error
		if out, err = os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600); err != nil {
			return fmt.Errorf("creating data file: %w", err)
		}
		if f.copiesOnWrite.Load() {
			shares := source
			if byteCopy {
				shares = ""
			}
			if err := writeInPlace(out, shares); err != nil {
				return err
			}
		}
		return fillDataFile(out, source, byteCopy, size)
	})
	if err != nil {
		if out != nil {
			out.Close()
		}
		return nil, 0, err
	}
	st, err := out.Stat()
	if err != nil {
		out.Close()
		return nil, 0, fmt.Errorf("data file: %w", err)
	}
	return out, st.Size(), nil
}

// fsNoCOWFlag is FS_NOCOW_FL (linux/fs.h), which golang.org/x/sys lacks.
const fsNoCOWFlag = 0x00800000

// writeInPlace makes the new, empty file out one whose overwrites are
// written in place (FS_NOCOW_FL), on a filesystem that otherwise copies
// every overwrite (btrfs): there a volume's preallocation holds only for
// its first write, and once the disk is full the pod's next write over
// its own data fails with ENOSPC. Only an empty file can be changed so. A
// copy follows its source (btrfs reflinks only between files alike): one
// of a volume made copy-on-write stays so.
func writeInPlace(out *os.File, source string) error {
	if source != "" {
		in, err := os.OpenFile(source, os.O_RDONLY|unix.O_NOFOLLOW, 0)
		if err != nil {
			return fmt.Errorf("opening source: %w", err)
		}
		flags, err := unix.IoctlGetUint32(int(in.Fd()), unix.FS_IOC_GETFLAGS)
		in.Close()
		if err != nil {
			return fmt.Errorf("reading the flags of %s: %w", source, err)
		}
		if flags&fsNoCOWFlag == 0 {
			return nil
		}
	}
	flags, err := unix.IoctlGetUint32(int(out.Fd()), unix.FS_IOC_GETFLAGS)
	if err == nil {
		err = unix.IoctlSetPointerInt(int(out.Fd()), unix.FS_IOC_SETFLAGS, int(flags|fsNoCOWFlag))
	}
	if err != nil {
		return fmt.Errorf("making data file %s NOCOW: %w", out.Name(), err)
	}
	return nil
}

// fillDataFile makes the new, empty file out a copy of source when source
// is set, a reflink one or, with byteCopy, one of its bytes, and allocates
// it to size when size is positive.
func fillDataFile(out *os.File, source string, byteCopy bool, size int64) error {
	if source != "" {
		in, err := os.OpenFile(source, os.O_RDONLY|unix.O_NOFOLLOW, 0)
		if err != nil {
			return fmt.Errorf("opening source: %w", err)
		}
		if byteCopy {
			// Plain reads and writes: copy_file_range, which io.Copy
			// would use, may share the extents after all.
			_, err = io.CopyBuffer(struct{ io.Writer }{out}, struct{ io.Reader }{in}, make([]byte, 1<<20))
		} else {
			err = unix.IoctlFileClone(int(out.Fd()), int(in.Fd()))
		}
		in.Close()
		if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
			return fmt.Errorf("copying %s: %w: %w", source, ErrNoSpace, err)
		}
		if err != nil {
			return fmt.Errorf("copying %s: %w", source, err)
		}
	}
	if size <= 0 {
		return nil
	}
	// A volume is allocated to its whole size, also where a copy came out
	// larger than asked for.
	st, err := out.Stat()
	if err != nil {
		return fmt.Errorf("data file: %w", err)
	}
	return allocate(out, max(size, st.Size()))
}

// allocate grows f to size with the blocks really reserved, so a volume can
// never run out of space that the disk promised it.
func allocate(f *os.File, size int64) error {
	if err := unix.Fallocate(int(f.Fd()), 0, 0, size); err != nil {
		if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
			return fmt.Errorf("allocating %d bytes: %w: %w", size, ErrNoSpace, err)
		}
		return fmt.Errorf("allocating %d bytes: %w", size, err)
	}
	return nil
}

// DeleteVolume implements Backend. On an unhealthy disk it fails rather
// than succeed on a path that no longer holds the volume: an unmounted
// disk's directory is empty, and "deleted" would orphan the volume.
func (f *File) DeleteVolume(ctx context.Context, key string) error {
	if err := f.Health(ctx); err != nil {
		return fmt.Errorf("%w: %w", ErrUnhealthy, err)
	}
	devs, err := loop.FindAll(ctx, f.loopFile(key))
	if err != nil {
		return err
	}
	if len(devs) > 0 {
		return fmt.Errorf("%w: attached to %s", ErrInUse, strings.Join(devs, ", "))
	}
	return f.removeRecordFirst(f.volumes, key, fault.DeleteVolumeRecordRemoved, fault.DeleteVolumeDataRemoved)
}

// GetVolume implements Backend. An unhealthy disk answers ErrUnhealthy,
// not ErrNotFound: the volume may well exist once the disk is back.
func (f *File) GetVolume(ctx context.Context, key string) (*Volume, error) {
	if err := f.Health(ctx); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnhealthy, err)
	}
	var vol Volume
	if err := readRecord(filepath.Join(f.volumes, key+metaSuffix), key, &vol.Key, &vol, &vol.State); err != nil {
		return nil, err
	}
	if err := checkDataFile(f.volumeFile(key)); err != nil {
		return nil, err
	}
	return &vol, nil
}

// ListVolumes implements Backend.
func (f *File) ListVolumes(ctx context.Context) ([]Volume, error) {
	keys, err := listKeys(f.volumes)
	if err != nil {
		return nil, err
	}
	vols := make([]Volume, 0, len(keys))
	for _, key := range keys {
		v, err := f.GetVolume(ctx, key)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		vols = append(vols, *v)
	}
	return vols, nil
}

// SetVolumeRefs implements Backend: the record is replaced durably.
func (f *File) SetVolumeRefs(ctx context.Context, key string, refs Refs) error {
	vol, err := f.GetVolume(ctx, key)
	if err != nil {
		return err
	}
	vol.Refs = refs
	return f.writeJSONAtomic(filepath.Join(f.volumes, key+metaSuffix), vol, true, fault.Step{})
}

// SetVolumeContent implements Backend: the record is replaced durably.
func (f *File) SetVolumeContent(ctx context.Context, key string, content Content) error {
	vol, err := f.GetVolume(ctx, key)
	if err != nil {
		return err
	}
	if vol.Content == content {
		return nil
	}
	vol.Content = content
	return f.writeJSONAtomic(filepath.Join(f.volumes, key+metaSuffix), vol, true, fault.NodeStageVolumeRecordTempWritten)
}

// SetSnapshotRefs implements Backend, like SetVolumeRefs.
func (f *File) SetSnapshotRefs(ctx context.Context, key string, refs Refs) error {
	snap, err := f.GetSnapshot(ctx, key)
	if err != nil {
		return err
	}
	snap.Refs = refs
	return f.writeJSONAtomic(filepath.Join(f.snapshots, key+metaSuffix), snap, true, fault.Step{})
}

// ExpandVolume implements Backend: the file grows first, then the record,
// then the loop device's idea of the size. A crash in between leaves a file
// larger than its record, which Start cuts back (or a retry grows to the
// same size again), or a record larger than its loop device, which a retry
// (or the next Attach) refreshes. Any failure after the file grew restores
// the old record and cuts the file back to its size on entry before
// returning: ext4 keeps whatever part of a fallocate it managed before
// ENOSPC, and a file left larger would hold the disk's space, and could
// later be attached at its larger size and grown into. Never below its
// size on entry: a file that start left larger than its record (its loop
// device already had the larger size) may hold data there.
func (f *File) ExpandVolume(ctx context.Context, key string, size int64) (*Volume, error) {
	vol, err := f.GetVolume(ctx, key)
	if err != nil {
		return nil, err
	}
	if size <= vol.SizeBytes {
		return vol, f.refreshLoop(ctx, key, vol.SizeBytes)
	}
	file, err := os.OpenFile(f.volumeFile(key), os.O_WRONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, fmt.Errorf("opening data file: %w", err)
	}
	defer file.Close()
	st, err := file.Stat()
	if err != nil {
		return nil, fmt.Errorf("data file: %w", err)
	}
	entry := max(st.Size(), vol.SizeBytes)
	meta := filepath.Join(f.volumes, key+metaSuffix)
	grown := *vol
	grown.SizeBytes = size
	recordTouched := false
	err = f.space.allocate(ctx, f.Usage, size-entry, func() error { return allocate(file, size) })
	if err == nil {
		err = file.Sync()
	}
	if err == nil {
		err = f.faults.Reach(fault.NodeExpandVolumeDataAllocated)
	}
	if err == nil {
		recordTouched = true
		err = f.writeJSONAtomic(meta, &grown, true, fault.NodeExpandVolumeRecordTempWritten)
	}
	if err != nil {
		// The loop device is refreshed only after the record, so nothing
		// has seen the new size yet: the file is cut back first, which
		// also frees the room a record needs on a full disk, then the old
		// record goes back (a rename whose directory sync failed may have
		// put the new size in place).
		if terr := file.Truncate(entry); terr != nil {
			return nil, fmt.Errorf("%w (and cutting the file back to %d bytes: %w)", err, entry, terr)
		}
		if recordTouched {
			if rerr := f.writeJSONAtomic(meta, vol, true, fault.Step{}); rerr != nil {
				return nil, fmt.Errorf("%w (and restoring the record of %d bytes: %w)", err, vol.SizeBytes, rerr)
			}
		}
		return nil, err
	}
	f.faults.Reach(fault.NodeExpandVolumeRecorded)
	return &grown, f.refreshLoop(ctx, key, size)
}

// refreshLoop makes the volume's loop device, if it has one, as large as
// the recorded size.
func (f *File) refreshLoop(ctx context.Context, key string, size int64) error {
	dev, err := loop.Find(ctx, f.loopFile(key))
	if err != nil || dev == "" {
		return err
	}
	return refreshIfSmaller(ctx, dev, size)
}

// refreshIfSmaller runs losetup --set-capacity on dev when sysfs says it is
// smaller than size, so the common case costs one read and no process.
func refreshIfSmaller(ctx context.Context, dev string, size int64) error {
	devBytes, err := loopSize(dev)
	if err != nil || devBytes >= size {
		return err
	}
	if err := loop.Refresh(ctx, dev); err != nil {
		return fmt.Errorf("refreshing the size of %s: %w", dev, err)
	}
	return nil
}

// loopSize reads the size of an attached loop device from sysfs.
func loopSize(dev string) (int64, error) {
	data, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "size"))
	if err != nil {
		return 0, fmt.Errorf("reading size of %s: %w", dev, err)
	}
	var sectors int64
	if _, err := fmt.Sscan(string(data), &sectors); err != nil {
		return 0, fmt.Errorf("parsing size of %s %q: %w", dev, data, err)
	}
	// sysfs counts 512-byte sectors whatever the device's sector size.
	return sectors * 512, nil
}

// VolumeHealth implements Backend.
func (f *File) VolumeHealth(ctx context.Context, key string) error {
	if err := f.Health(ctx); err != nil {
		return err
	}
	if _, err := os.Lstat(f.volumeFile(key)); err != nil {
		return fmt.Errorf("backing file: %w", err)
	}
	return nil
}

// Attach implements Backend. Attachments are found again by backing file,
// which also re-creates them after a reboot when the volume is staged again.
// An attachment that outlived an interrupted expansion is refreshed to the
// recorded size, so what is staged on it (an ext4 grown offline at stage)
// sees the size the volume was grown to. A disk that started before its
// space check could run attaches nothing once that check refuses it
// (spaceKept).
func (f *File) Attach(ctx context.Context, key string, readOnly bool) (string, error) {
	if err := f.spaceKept(ctx); err != nil {
		return "", err
	}
	vol, err := f.GetVolume(ctx, key)
	if err != nil {
		return "", err
	}
	dev, err := loop.Attach(ctx, f.loopFile(key), readOnly)
	if errors.Is(err, loop.ErrReadOnlyDiffers) {
		return "", fmt.Errorf("%w: %w; an earlier stage of the volume on this node must be unstaged first", ErrInUse, err)
	}
	if errors.Is(err, loop.ErrBeingDetached) {
		return "", fmt.Errorf("%w: %w", ErrInUse, err)
	}
	if err != nil {
		return "", err
	}
	return dev, refreshIfSmaller(ctx, dev, vol.SizeBytes)
}

// Device implements Backend. It finds the device also while the disk's
// filesystem is away (detached lazily after a failure), so that
// NodeUnstageVolume can still free it.
func (f *File) Device(ctx context.Context, key string) (string, error) {
	return loop.Find(ctx, f.loopFile(key))
}

// Detach implements Backend; it works while the disk is away, as Device.
func (f *File) Detach(ctx context.Context, key string) error {
	return loop.Detach(ctx, f.loopFile(key))
}

// Blank implements Backend: a preallocated file that was never written
// has only unwritten extents, which SEEK_DATA skips like holes (XFS and
// ext4 both; dirty page cache over them counts as data), so one system
// call proves it blank. A reflink copy shares written extents and is not.
func (f *File) Blank(_ context.Context, key string) (bool, error) {
	return blankFile(f.volumeFile(key))
}

// blankFile reports whether path has no data: only holes and unwritten
// extents.
func blankFile(path string) (bool, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return false, fmt.Errorf("opening data file: %w", err)
	}
	defer unix.Close(fd)
	_, err = unix.Seek(fd, 0, unix.SEEK_DATA)
	switch {
	case errors.Is(err, unix.ENXIO):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("looking for data in %s: %w", path, err)
	}
	return false, nil
}

// SupportsSnapshots implements Backend: only with reflink, because a full
// copy of a large file would make CreateSnapshot take minutes and double the
// space without the caller asking for it.
func (f *File) SupportsSnapshots() bool { return f.hasReflink() }

// howToCopy says how the disk copies a volume (for a snapshot or a clone,
// live: ofVolume) or a snapshot (a restore): as a reflink, sharing the
// source's extents, or as a copy of its bytes (byteCopy); an error when it
// cannot. Without reflink it cannot. On a filesystem that copies every
// overwrite (btrfs) a shared extent's first overwrite needs space that
// the booking of a snapshot (written bytes, from statfs) was measured not
// to guarantee: a pod's write over its own data failed with ENOSPC on a
// full disk (TestVolumeOnBtrfsKeepsItsSpace). There a snapshot (still
// there from before) is restored as a copy of its bytes, which a snapshot
// does not change, into a NOCOW file; a live volume is not copied at all,
// as a copy of its bytes would not be one instant's.
func (f *File) howToCopy(ofVolume bool) (byteCopy bool, err error) {
	switch {
	case !f.hasReflink():
		return false, fmt.Errorf("%w: the filesystem has no reflink", ErrUnsupported)
	case f.copiesOnWrite.Load() && ofVolume:
		return false, fmt.Errorf("%w: btrfs cannot keep the space a shared extent's next write needs; use XFS for disks that take snapshots", ErrUnsupported)
	}
	return f.copiesOnWrite.Load(), nil
}

// CreateSnapshot implements Backend.
func (f *File) CreateSnapshot(ctx context.Context, req SnapshotRequest) (*Snapshot, error) {
	key, sourceKey := req.Key, req.SourceKey
	if _, err := f.howToCopy(true); err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	src, err := f.GetVolume(ctx, sourceKey)
	if err != nil {
		return nil, fmt.Errorf("source volume: %w", err)
	}
	snap := &Snapshot{Key: key, Name: req.Name, SourceVolume: sourceKey, SizeBytes: src.SizeBytes, State: StateCreating, CreatedAt: time.Now().UTC(),
		For: req.For, Refs: Refs{NeverReferenced: true}}
	meta := filepath.Join(f.snapshots, key+metaSuffix)
	if err := f.claimBeforeCreating(ctx); err != nil {
		return nil, err
	}
	if err := f.clearLeftover(ctx, f.snapshots, key); err != nil {
		return nil, err
	}
	// As for a volume, the only record is the "ready" one.
	f.faults.Reach(fault.CreateSnapshotWayCleared)
	// Every written extent of the source gets one more sharer, whose
	// rewrite the disk must be able to hold.
	written, err := writtenBytes(f.volumeFile(sourceKey))
	var data *os.File
	if err == nil {
		var size int64
		data, size, err = f.makeDataFile(ctx, f.snapshotFile(key), f.volumeFile(sourceKey), false, 0, written)
		snap.SizeBytes = max(snap.SizeBytes, size)
	}
	if err == nil {
		defer data.Close()
		f.faults.Reach(fault.CreateSnapshotDataCloned)
		snap.State = StateReady
		err = f.writeJSONAtomic(meta, snap, true, fault.CreateSnapshotReadyTempWritten, data)
	}
	if err != nil {
		return nil, errors.Join(err, f.removePair(ctx, f.snapshots, key))
	}
	f.faults.Reach(fault.CreateSnapshotReadyRecorded)
	return snap, nil
}

// DeleteSnapshot implements Backend; like DeleteVolume it refuses to
// work on an unhealthy disk.
func (f *File) DeleteSnapshot(ctx context.Context, key string) error {
	if err := f.Health(ctx); err != nil {
		return fmt.Errorf("%w: %w", ErrUnhealthy, err)
	}
	return f.removeRecordFirst(f.snapshots, key, fault.DeleteSnapshotRecordRemoved, fault.DeleteSnapshotDataRemoved)
}

// GetSnapshot implements Backend; see GetVolume for an unhealthy disk.
func (f *File) GetSnapshot(ctx context.Context, key string) (*Snapshot, error) {
	if err := f.Health(ctx); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnhealthy, err)
	}
	var snap Snapshot
	if err := readRecord(filepath.Join(f.snapshots, key+metaSuffix), key, &snap.Key, &snap, &snap.State); err != nil {
		return nil, err
	}
	if err := checkDataFile(f.snapshotFile(key)); err != nil {
		return nil, err
	}
	return &snap, nil
}

// ListSnapshots implements Backend.
func (f *File) ListSnapshots(ctx context.Context) ([]Snapshot, error) {
	keys, err := listKeys(f.snapshots)
	if err != nil {
		return nil, err
	}
	snaps := make([]Snapshot, 0, len(keys))
	for _, key := range keys {
		s, err := f.GetSnapshot(ctx, key)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		snaps = append(snaps, *s)
	}
	return snaps, nil
}

// The reflink probe's answers.
const (
	reflinkUnknown int32 = iota
	reflinkYes
	reflinkNo
)

// hasReflink reports whether the disk's filesystem can share extents
// between files (reflink copies), as Start's probe found. A probe that
// could not run (a full filesystem has no room for its files, a read-only
// one none at all) runs again at the next ask, and until one answers the
// disk is taken to have reflink: a snapshot then fails for want of space
// rather than being refused as unsupported, and Usage keeps back what
// copy-on-write may take (nothing where nothing is shared). Taken as "no",
// a full disk's snapshots would have been reported unsupported, and their
// copy-on-write space given out as free, until the next start.
func (f *File) hasReflink() bool {
	if r := f.reflink.Load(); r != reflinkUnknown {
		return r == reflinkYes
	}
	ok, err := probeReflink(filepath.Join(f.path, stateDirName))
	if err != nil {
		return true
	}
	answer := reflinkNo
	if ok {
		answer = reflinkYes
	}
	f.reflink.Store(answer)
	return ok
}

// probeReflink reports whether dir's filesystem can share extents between
// files, by trying it. An error says that the probe could not tell: its
// files could not be made or written, or the clone ran out of space.
func probeReflink(dir string) (bool, error) {
	src, err := os.CreateTemp(dir, "reflink-probe"+tmpInfix)
	if err != nil {
		return false, err
	}
	defer os.Remove(src.Name())
	defer src.Close()
	if _, err := src.Write(make([]byte, 4096)); err != nil {
		return false, err
	}
	dst, err := os.CreateTemp(dir, "reflink-probe"+tmpInfix)
	if err != nil {
		return false, err
	}
	defer os.Remove(dst.Name())
	defer dst.Close()
	err = unix.IoctlFileClone(int(dst.Fd()), int(src.Fd()))
	if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
		return false, err
	}
	return err == nil, nil
}
