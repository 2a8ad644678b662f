package driver

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

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	"k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"

	"github.com/diskfit/diskfit/csi-driver/backend"
	"github.com/diskfit/diskfit/csi-driver/fault"
)

var _ csi.NodeServer = &Driver{}

// NodeGetCapabilities implements csi.NodeServer.
func (d *Driver) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	return &csi.NodeGetCapabilitiesResponse{Capabilities: []*csi.NodeServiceCapability{
		nodeCap(csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME),
		nodeCap(csi.NodeServiceCapability_RPC_GET_VOLUME_STATS),
		nodeCap(csi.NodeServiceCapability_RPC_EXPAND_VOLUME),
		nodeCap(csi.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER),
		nodeCap(csi.NodeServiceCapability_RPC_GET_VOLUME_HEALTH),
		nodeCap(csi.NodeServiceCapability_RPC_GET_STORAGE_HEALTH),
	}}, nil
}

// NodeGetInfo implements csi.NodeServer.
func (d *Driver) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{
		NodeId:             d.cfg.NodeID,
		MaxVolumesPerNode:  d.cfg.Node.MaxVolumes,
		AccessibleTopology: d.topology(),
	}, nil
}

// checkPath validates a stage or publish path: absolute, clean, not itself
// a symlink, and below the kubelet directory even after resolving symlinks
// of its parent, so a request can never make the driver mount over, remove
// or report on something else on the host.
func (d *Driver) checkPath(kind, p string) (string, error) {
	switch {
	case p == "":
		return "", status.Errorf(codes.InvalidArgument, "%s is missing", kind)
	case strings.ContainsRune(p, 0):
		return "", status.Errorf(codes.InvalidArgument, "%s contains NUL", kind)
	case !filepath.IsAbs(p):
		return "", status.Errorf(codes.InvalidArgument, "%s %q is not absolute", kind, p)
	}
	clean := filepath.Clean(p)
	outside := func(path string) bool {
		return path == d.kubeletDir || !mount.PathWithinBase(path, d.kubeletDir)
	}
	if outside(clean) {
		return "", status.Errorf(codes.InvalidArgument, "%s %s is outside the kubelet directory %s", kind, p, d.kubeletDir)
	}
	// The deepest ancestor that exists, with its symlinks resolved, must
	// stay inside: the driver makes the missing directories below it, and
	// making them would follow a symlinked ancestor wherever it leads.
	existing, rest := filepath.Dir(clean), filepath.Base(clean)
	for existing != d.kubeletDir {
		if _, err := os.Lstat(existing); err == nil {
			break
		}
		existing, rest = filepath.Dir(existing), filepath.Join(filepath.Base(existing), rest)
	}
	parent, err := filepath.EvalSymlinks(existing)
	if err != nil {
		return "", status.Errorf(codes.InvalidArgument, "%s %s: resolving %s: %v", kind, p, existing, err)
	}
	if outside(filepath.Join(parent, rest)) {
		return "", status.Errorf(codes.InvalidArgument, "%s %s resolves outside the kubelet directory %s", kind, p, d.kubeletDir)
	}
	// The kubelet never passes a symlink; mount(2) and removal would
	// follow one wherever it points.
	if st, err := os.Lstat(clean); err == nil && st.Mode()&fs.ModeSymlink != 0 {
		return "", status.Errorf(codes.InvalidArgument, "%s %s is a symlink", kind, p)
	}
	return clean, nil
}

// nodeRequest validates the volume ID and path every stage and publish
// call carries, then runs the call's other argument checks, and only then
// looks the volume up: the CSI spec wants InvalidArgument for a malformed
// request before NotFound for an unknown volume.
func (d *Driver) nodeRequest(resolve func(id string) (*disk, string, error), id, pathKind, path string, checks ...func() error) (*disk, string, string, error) {
	if id == "" {
		return nil, "", "", status.Error(codes.InvalidArgument, "volume ID is missing")
	}
	clean, err := d.checkPath(pathKind, path)
	if err != nil {
		return nil, "", "", err
	}
	for _, check := range checks {
		if err := check(); err != nil {
			return nil, "", "", err
		}
	}
	dk, key, err := resolve(id)
	if err != nil {
		return nil, "", "", err
	}
	return dk, key, clean, nil
}

// keyOf resolves a volume ID to its key only, for calls that need no disk.
func keyOf(id string) (*disk, string, error) {
	_, key, err := parseID("volume", id)
	return nil, key, err
}

// NodeStageVolume implements csi.NodeServer: attach, and for Filesystem
// volumes format once and mount at the staging path. What the volume's
// record says it holds decides whether it may be formatted (see
// formatAndMount). A Block volume is recorded as holding data before the
// first pod can get it.
func (d *Driver) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	dk, key, staging, err := d.nodeRequest(d.volumeOf, req.GetVolumeId(), "staging target path", req.GetStagingTargetPath(),
		func() error { return checkCapability(req.GetVolumeCapability()) })
	if err != nil {
		return nil, err
	}
	unlock, err := d.locks.lock(ctx, "volume/"+key)
	if err != nil {
		return nil, err
	}
	defer unlock()
	// The kubelet stages only volumes of PVs: from here on the volume may
	// hold data, and the driver never removes it on its own.
	if err := d.changeRefs(ctx, d.volumeRefs(), dk, key, func(backend.Refs) backend.Refs { return backend.Refs{} }); err != nil {
		return nil, toStatus(fmt.Errorf("recording that volume %s has a PV: %w", req.GetVolumeId(), err))
	}
	// A device already attached belongs to an earlier stage, whose
	// mounts and publications may be in use: a failure here leaves it.
	attached, err := dk.backend.Device(ctx, key)
	if err != nil {
		return nil, toStatus(fmt.Errorf("looking for the device of volume %s: %w", req.GetVolumeId(), err))
	}
	// A reader-only Block volume is a read-only device: a read-only bind
	// mount would not stop a pod from writing to the device node. (A
	// Filesystem volume is mounted read-only instead; its device stays
	// writable, as mounting an XFS that needs log recovery requires.)
	mnt := req.GetVolumeCapability().GetMount()
	dev, err := dk.backend.Attach(ctx, key, mnt == nil && readerOnly(req.GetVolumeCapability()))
	if err != nil {
		return nil, toStatus(fmt.Errorf("attaching volume %s: %w", req.GetVolumeId(), err))
	}
	undo := func() {
		if attached == "" {
			// Also when the caller has given up: a loop device left
			// attached holds the volume for good.
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), backend.UndoTimeout)
			defer cancel()
			d.detachAfterFailedStage(ctx, dk, key, req.GetVolumeId(), dev)
		}
	}
	d.cfg.Faults.Reach(fault.NodeStageVolumeAttached)
	view, err := d.mountsOf(dev, mnt == nil, staging, "")
	if err != nil {
		undo()
		return nil, toStatus(err)
	}
	if err := view.usedInTheOtherMode(req.GetVolumeId(), mnt == nil); err != nil {
		undo()
		return nil, err
	}
	vol, err := dk.backend.GetVolume(ctx, key)
	if err != nil {
		undo()
		return nil, toStatus(fmt.Errorf("volume %s: %w", req.GetVolumeId(), err))
	}
	if mnt == nil {
		// Block: the device itself is published; nothing to mount. A pod
		// may write anything to it from now on, so no later stage (as a
		// Filesystem volume, say through a PV made again by hand) may
		// format it.
		if vol.Content == backend.ContentNone || vol.Content == backend.ContentUnknown {
			if err := dk.backend.SetVolumeContent(ctx, key, backend.ContentBlock); err != nil {
				undo()
				return nil, toStatus(fmt.Errorf("recording that volume %s is staged as a Block volume: %w", req.GetVolumeId(), err))
			}
		}
		return &csi.NodeStageVolumeResponse{}, nil
	}
	fsType := mnt.GetFsType()
	if fsType == "" {
		fsType = defaultFSType
	}
	if view.staged != nil {
		if !view.stagedIsVolume {
			undo()
			return nil, status.Errorf(codes.AlreadyExists, "staging path %s holds %s, not volume %s (%s)", staging, view.staged.Source, req.GetVolumeId(), dev)
		}
		return &csi.NodeStageVolumeResponse{}, nil
	}
	if err := os.MkdirAll(staging, 0o750); err != nil {
		undo()
		return nil, status.Errorf(codes.Internal, "creating staging path: %v", err)
	}
	// One option per entry: mount(8) and a PV's mountOptions also take
	// "noatime,ro" in one, and a read-only stage must be seen as such
	// (no mkfs, fsck or grow).
	var opts []string
	for _, f := range mnt.GetMountFlags() {
		for o := range strings.SplitSeq(f, ",") {
			if o = strings.TrimSpace(o); o != "" {
				opts = append(opts, o)
			}
		}
	}
	if readerOnly(req.GetVolumeCapability()) && !slices.Contains(opts, "ro") {
		opts = append(opts, "ro")
	}
	if fsType == "xfs" {
		// Snapshots and clones carry their source's filesystem UUID; XFS
		// refuses to mount a second filesystem with a UUID already mounted.
		opts = append(opts, "nouuid")
	}
	if err := d.formatAndMount(ctx, dk, req.GetVolumeId(), key, vol, dev, staging, fsType, opts); err != nil {
		undo()
		if _, ok := status.FromError(err); ok {
			return nil, err
		}
		return nil, status.Errorf(codes.Internal, "formatting and mounting %s at %s: %v", dev, staging, err)
	}
	if fsType == "xfs" && vol.Content != backend.ContentNone && !slices.Contains(opts, "ro") {
		d.growXFSToVolume(ctx, req.GetVolumeId(), dev, staging, vol.SizeBytes)
	}
	d.cfg.Faults.Reach(fault.NodeStageVolumeMounted)
	klog.FromContext(ctx).V(2).Info("Staged volume", "volume", req.GetVolumeId(), "device", dev, "path", staging, "fsType", fsType)
	return &csi.NodeStageVolumeResponse{}, nil
}

// detachAfterFailedStage detaches the device a failed stage attached,
// unless something (a publication) uses it: a detached loop device that
// is still open goes when it is closed, and a pod's device node would then
// lead to whatever volume gets that loop device next.
func (d *Driver) detachAfterFailedStage(ctx context.Context, dk *disk, key, id, dev string) {
	logger := klog.FromContext(ctx)
	if pubs, err := d.devicePublications(dev); err != nil || len(pubs) > 0 {
		logger.Info("Leaving the device of a failed stage attached", "volume", id, "device", dev, "publications", pubs, "err", err)
		return
	}
	if err := dk.backend.Detach(ctx, key); err != nil {
		logger.Error(err, "Detaching after failed stage", "volume", id)
	}
}

// formatAndMount mounts dev at target, formatting it first only when the
// volume's record allows it:
//
//   - ContentNone: nothing but an mkfs that did not finish can have
//     written the volume. No pod has had it: pods get a volume only after
//     a stage succeeded, and a stage records ContentFilesystem (or
//     ContentBlock) before that. So it is formatted, whatever is on it
//     (a torn filesystem of a stage that was killed during mkfs, which
//     SafeFormatAndMount would refuse to format or try to mount).
//   - ContentFilesystem, ContentBlock: the volume may hold data and is
//     never formatted; finding no filesystem on it is an error.
//   - ContentUnknown (a record of an older driver): as that driver did, a
//     volume its backend proves never written (a fresh preallocated file)
//     is formatted, anything else goes through SafeFormatAndMount, which
//     formats only a device on which blkid finds nothing.
//
// The fresh volume is formatted with the arguments SafeFormatAndMount
// would use, without its blkid probe, which is the driver's largest cost
// over doing these steps by hand.
func (d *Driver) formatAndMount(ctx context.Context, dk *disk, id, key string, vol *backend.Volume, dev, target, fsType string, opts []string) error {
	// A read-only mount must not format; SafeFormatAndMount says so. Nor
	// may it write anything else: an ext4 that an expansion left smaller
	// than its device is grown offline (e2fsck, resize2fs) only by a
	// writable stage, and only to a device within the volume's record.
	readOnly := slices.Contains(opts, "ro")
	growExt := fsType == "ext4" && !readOnly && withinRecord(dev, vol.SizeBytes)
	switch content := vol.Content; content {
	case backend.ContentNone:
		if readOnly {
			return status.Errorf(codes.FailedPrecondition, "volume %s has never been formatted, and a read-only stage cannot format it", id)
		}
		return d.formatFresh(ctx, dk, key, dev, target, fsType, opts)
	case backend.ContentUnknown:
		blank, err := dk.backend.Blank(ctx, key)
		if err != nil {
			klog.FromContext(ctx).V(2).Info("Cannot tell whether the volume is blank, probing it", "device", dev, "err", err.Error())
		}
		if blank && !readOnly {
			return d.formatFresh(ctx, dk, key, dev, target, fsType, opts)
		}
		if growExt {
			if err := d.growExtOffline(ctx, dev); err != nil {
				return err
			}
		}
		if err := d.mounter.FormatAndMount(dev, target, fsType, opts); err != nil {
			return err
		}
		// It holds a filesystem now; from here on it is never formatted.
		if err := dk.backend.SetVolumeContent(ctx, key, backend.ContentFilesystem); err != nil {
			klog.FromContext(ctx).Error(err, "Recording that the volume holds a filesystem; it is staged as before until that is recorded", "volume", id)
		}
		return nil
	default:
		if growExt {
			if err := d.growExtOffline(ctx, dev); err != nil {
				return err
			}
		}
		return d.mountWithoutFormatting(id, content, dev, target, fsType, opts)
	}
}

// growXFSToVolume grows the XFS mounted at target to its device, as
// NodeExpandVolume does, when the device is within the volume's recorded
// size (withinRecord): a restore or clone made larger than its source
// carries the source's filesystem, and no expansion ever follows for it
// (its claim has that size already), so without this its pod would get
// the source's size for good. xfs_growfs leaves a filesystem that fills
// its device as it is. (ext4 is grown offline before it is mounted,
// growExtOffline.) A failure is logged: the volume works at the size it
// has, and the next stage or expansion grows it.
func (d *Driver) growXFSToVolume(ctx context.Context, id, dev, target string, recorded int64) {
	if !withinRecord(dev, recorded) {
		return
	}
	if _, err := mount.NewResizeFs(d.exec).Resize(dev, target); err != nil {
		klog.FromContext(ctx).Error(err, "Growing the filesystem to its volume; it keeps its size until the next stage or expansion", "volume", id)
	}
}

// withinRecord says whether dev is no larger than the volume's recorded
// size: only then does a stage grow the filesystem on it to the device. A
// device larger than the record, which only an expansion cut short
// leaves, is left to the retried expansion: start cuts such a file back
// to its record once no device holds it, and a filesystem grown into that
// tail would lose its end.
func withinRecord(dev string, recorded int64) bool {
	devBytes, err := deviceSize(dev)
	return err == nil && devBytes <= recorded
}

// formatFresh formats a volume that holds no data (forced: a torn
// filesystem of an earlier attempt may be on it), syncs the filesystem to
// the disk, records that the volume holds it, and only then mounts it.
func (d *Driver) formatFresh(ctx context.Context, dk *disk, key, dev, target, fsType string, opts []string) error {
	args := []string{"-f", dev}
	if fsType != "xfs" {
		args = []string{"-F", "-m0", dev}
	}
	if out, err := d.exec.CommandContext(ctx, "mkfs."+fsType, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("mkfs.%s %s: %w: %s", fsType, dev, err, out)
	}
	d.cfg.Faults.Reach(fault.NodeStageVolumeFormatting)
	// mkfs syncs what it wrote itself; this makes the record below true
	// whatever the mkfs version does. The loop device passes the flush on
	// to its backing file.
	if err := syncDevice(dev); err != nil {
		return err
	}
	d.cfg.Faults.Reach(fault.NodeStageVolumeFormatted)
	if err := dk.backend.SetVolumeContent(ctx, key, backend.ContentFilesystem); err != nil {
		return fmt.Errorf("recording that the volume holds a filesystem: %w", err)
	}
	d.cfg.Faults.Reach(fault.NodeStageVolumeRecorded)
	klog.FromContext(ctx).V(2).Info("Formatted volume", "device", dev, "fsType", fsType)
	return d.mounter.Mount(dev, target, fsType, append(opts, "defaults"))
}

// syncDevice flushes a block device's written data to stable storage.
func syncDevice(dev string) error {
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening %s: %w", dev, err)
	}
	defer unix.Close(fd)
	if err := unix.Fsync(fd); err != nil {
		return fmt.Errorf("syncing %s: %w", dev, err)
	}
	return nil
}

// mountWithoutFormatting mounts a volume that may hold data the way
// SafeFormatAndMount does (blkid, fsck unless read-only, mount), with an
// executor that refuses to run mkfs: a volume on which blkid finds no
// filesystem (its first blocks damaged, raw data of a Block volume) is an
// error, never a blank to format.
func (d *Driver) mountWithoutFormatting(id string, content backend.Content, dev, target, fsType string, opts []string) error {
	ex := &noMkfs{Interface: d.mounter.Exec}
	m := &mount.SafeFormatAndMount{Interface: d.mounter.Interface, Exec: ex}
	err := m.FormatAndMount(dev, target, fsType, opts)
	if ex.refused {
		what := "a filesystem"
		if content == backend.ContentBlock {
			what = "data written to it as a Block volume"
		}
		return status.Errorf(codes.FailedPrecondition,
			"volume %s is recorded as holding %s, but no filesystem was found on %s: the driver never formats a volume that may hold data (repair its filesystem or restore it from a snapshot)",
			id, what, dev)
	}
	return err
}

// noMkfs runs commands like the executor it wraps, except mkfs, which it
// refuses and remembers having been asked for.
type noMkfs struct {
	utilexec.Interface
	refused bool
}

func (e *noMkfs) Command(cmd string, args ...string) utilexec.Cmd {
	return e.guard(e.Interface.Command(cmd, args...), cmd)
}

func (e *noMkfs) CommandContext(ctx context.Context, cmd string, args ...string) utilexec.Cmd {
	return e.guard(e.Interface.CommandContext(ctx, cmd, args...), cmd)
}

func (e *noMkfs) guard(c utilexec.Cmd, cmd string) utilexec.Cmd {
	if !strings.HasPrefix(filepath.Base(cmd), "mkfs") {
		return c
	}
	e.refused = true
	return refusedCmd{Cmd: c}
}

// errFormatRefused is what a refused mkfs answers.
var errFormatRefused = errors.New("refusing to format a volume that may hold data")

// refusedCmd is a command that never runs.
type refusedCmd struct{ utilexec.Cmd }

func (refusedCmd) Run() error                      { return errFormatRefused }
func (refusedCmd) Start() error                    { return errFormatRefused }
func (refusedCmd) CombinedOutput() ([]byte, error) { return nil, errFormatRefused }
func (refusedCmd) Output() ([]byte, error)         { return nil, errFormatRefused }

// growExtOffline grows an ext4 filesystem that is smaller than its device.
// This kernel refuses ext4 online resize, so NodeExpandVolume cannot do it
// while mounted; staging is the next moment the filesystem is offline.
//
// e2fsck and resize2fs run to their end whatever the caller does: the
// kubelet gives up on NodeStageVolume after 2 minutes, and resize2fs
// killed while it moves blocks leaves the filesystem marked in error (a
// grow killed at every attempt would also never end). The caller holds
// the volume's lock meanwhile, so the kubelet's retries wait for it, and
// are Aborted when they give up; a driver told to stop waits for it too
// (Run, waitForGrows).
func (d *Driver) growExtOffline(ctx context.Context, dev string) error {
	ctx = context.WithoutCancel(ctx)
	format, err := d.mounter.GetDiskFormat(dev)
	if err != nil || (format != "ext4" && format != "ext3") {
		return nil
	}
	fsBytes, err := extSize(d, dev)
	if err != nil {
		return err
	}
	devBytes, err := deviceSize(dev)
	if err != nil {
		return err
	}
	if fsBytes >= devBytes {
		return nil
	}
	// Run waits for it when the driver is told to stop.
	d.grows.Add(1)
	defer d.grows.Done()
	klog.FromContext(ctx).Info("Growing ext4 filesystem offline", "device", dev, "from", fsBytes, "to", devBytes)
	// e2fsck exits 1 when it corrected something, which is fine here.
	if out, err := d.exec.CommandContext(ctx, "e2fsck", "-f", "-p", dev).CombinedOutput(); err != nil && !exitCode(err, 1) {
		return fmt.Errorf("e2fsck before growing %s: %w: %s", dev, err, out)
	}
	if out, err := d.exec.CommandContext(ctx, "resize2fs", dev).CombinedOutput(); err != nil {
		return fmt.Errorf("resize2fs %s: %w: %s", dev, err, out)
	}
	return nil
}

func exitCode(err error, code int) bool {
	var ee interface{ ExitStatus() int }
	return errors.As(err, &ee) && ee.ExitStatus() == code
}

// extSize reads an ext filesystem's size from its superblock.
func extSize(d *Driver, dev string) (int64, error) {
	out, err := d.exec.Command("dumpe2fs", "-h", dev).Output()
	if err != nil {
		return 0, fmt.Errorf("dumpe2fs %s: %w", dev, err)
	}
	var count, size int64
	for _, line := range strings.Split(string(out), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch strings.TrimSpace(k) {
		case "Block count":
			fmt.Sscan(strings.TrimSpace(v), &count)
		case "Block size":
			fmt.Sscan(strings.TrimSpace(v), &size)
		}
	}
	if count == 0 || size == 0 {
		return 0, fmt.Errorf("dumpe2fs %s printed no block count or size", dev)
	}
	return count * size, nil
}

// deviceSize returns a block device's size in bytes.
func deviceSize(dev string) (int64, error) {
	f, err := os.Open(dev)
	if err != nil {
		return 0, fmt.Errorf("opening %s: %w", dev, err)
	}
	defer f.Close()
	// Seeking to the end of a block device yields its size.
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return 0, fmt.Errorf("reading size of %s: %w", dev, err)
	}
	return size, nil
}

// NodeUnstageVolume implements csi.NodeServer; it is idempotent. It works
// on a disk that is not available too: the staging mount is found in the
// mount table, and detaching goes by the volume's path, which the backend
// knows without having started.
func (d *Driver) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	dk, key, staging, err := d.nodeRequest(d.diskOf, req.GetVolumeId(), "staging target path", req.GetStagingTargetPath())
	if err != nil {
		return nil, err
	}
	unlock, err := d.locks.lock(ctx, "volume/"+key)
	if err != nil {
		return nil, err
	}
	defer unlock()
	// A Block volume is published as bind mounts of its loop device's
	// node. Detached under a pod still using one, the node would lead to
	// whatever volume that loop device is attached to next.
	dev, err := dk.backend.Device(ctx, key)
	if err != nil {
		return nil, toStatus(fmt.Errorf("finding the device of volume %s: %w", req.GetVolumeId(), err))
	}
	if dev != "" {
		pubs, err := d.devicePublications(dev)
		if err != nil {
			return nil, toStatus(err)
		}
		if len(pubs) > 0 {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %s is still published as a block device at %s: unpublish it first", req.GetVolumeId(), strings.Join(pubs, ", "))
		}
	}
	if notMnt, err := d.mounter.IsLikelyNotMountPoint(staging); err == nil && !notMnt {
		if err := d.mounter.Unmount(staging); err != nil {
			return nil, status.Errorf(codes.Internal, "unmounting %s: %v", staging, err)
		}
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, status.Errorf(codes.Internal, "checking mount point %s: %v", staging, err)
	}
	if err := dk.backend.Detach(ctx, key); err != nil {
		return nil, toStatus(fmt.Errorf("detaching volume %s: %w", req.GetVolumeId(), err))
	}
	klog.FromContext(ctx).V(2).Info("Unstaged volume", "volume", req.GetVolumeId(), "path", staging)
	return &csi.NodeUnstageVolumeResponse{}, nil
}

// NodePublishVolume implements csi.NodeServer: bind mount the staged
// filesystem, or for Block the device node, onto the target.
func (d *Driver) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	var staging string
	vc := req.GetVolumeCapability()
	dk, key, target, err := d.nodeRequest(d.volumeOf, req.GetVolumeId(), "target path", req.GetTargetPath(),
		func() (err error) {
			staging, err = d.checkPath("staging target path", req.GetStagingTargetPath())
			return err
		},
		func() error { return checkCapability(vc) })
	if err != nil {
		return nil, err
	}
	unlock, err := d.locks.lock(ctx, "volume/"+key)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if _, err := dk.backend.GetVolume(ctx, key); err != nil {
		return nil, toStatus(fmt.Errorf("volume %s: %w", req.GetVolumeId(), err))
	}
	dev, err := dk.backend.Device(ctx, key)
	if err != nil {
		return nil, toStatus(err)
	}
	if dev == "" {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is not staged", req.GetVolumeId())
	}
	block := vc.GetBlock() != nil
	view, err := d.mountsOf(dev, block, staging, target)
	if err != nil {
		return nil, toStatus(err)
	}
	if err := view.usedInTheOtherMode(req.GetVolumeId(), block); err != nil {
		return nil, err
	}
	source := staging
	if block {
		source = dev
	} else if !view.stagedIsVolume {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is not staged at %s", req.GetVolumeId(), staging)
	}
	readOnly := req.GetReadonly() || readerOnly(vc)
	if t := view.target; t != nil {
		// Only this volume is the publication asked for: an OK for
		// another mount would give the pod another volume's data.
		if !view.targetIsVolume {
			return nil, status.Errorf(codes.AlreadyExists, "target %s holds %s (root %s), not volume %s (%s)",
				target, t.Source, t.Root, req.GetVolumeId(), dev)
		}
		// This volume writable where read-only was asked for is what a
		// driver killed between bindMount's two system calls leaves, and
		// this is the kubelet's retry: finish the publication. (A writable
		// request may find a read-only mount: a bind mount of a staging
		// mount made with "ro" is one.)
		if readOnly && !slices.Contains(t.MountOptions, "ro") {
			if err := remountReadOnly(target); err != nil {
				return nil, status.Errorf(codes.Internal, "%s at %s: %v", req.GetVolumeId(), target, err)
			}
		}
		return &csi.NodePublishVolumeResponse{}, nil
	}
	if len(view.others) > 0 && vc.GetAccessMode().GetMode() == csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is single-writer and already published at %s", req.GetVolumeId(), strings.Join(view.others, ", "))
	}
	if err := makeTarget(target, block); err != nil {
		return nil, status.Errorf(codes.Internal, "creating target %s: %v", target, err)
	}
	if err := bindMount(source, target, readOnly); err != nil {
		return nil, status.Errorf(codes.Internal, "bind mounting %s at %s: %v", source, target, err)
	}
	klog.FromContext(ctx).V(2).Info("Published volume", "volume", req.GetVolumeId(), "target", target, "block", block, "readOnly", readOnly)
	return &csi.NodePublishVolumeResponse{}, nil
}

// bindMount bind mounts source at target with mount(2) rather than
// mount(8): a bind mount inherits the source mount's flags (the staging
// mount's options, applied at NodeStageVolume), so the second "remount"
// process mount-utils runs for it would only add latency. Read-only needs
// the remount, done here as a second system call.
func bindMount(source, target string, readOnly bool) error {
	if err := unix.Mount(source, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind mount: %w", err)
	}
	if !readOnly {
		return nil
	}
	if err := remountReadOnly(target); err != nil {
		if uerr := unix.Unmount(target, 0); uerr != nil {
			return fmt.Errorf("%w (and unmounting again: %v)", err, uerr)
		}
		return err
	}
	return nil
}

// remountReadOnly makes the bind mount at target read-only. A bind
// remount sets the mount's nosuid, nodev, noexec and nosymfollow anew, so
// those it has (the staging mount's options, which the bind inherited) are
// passed along; MS_RDONLY alone would drop them. The atime flags, none of
// which is passed, the kernel keeps as they are.
func remountReadOnly(target string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(target, &st); err != nil {
		return fmt.Errorf("reading the flags of %s: %w", target, err)
	}
	flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY)
	for _, f := range []struct{ st, ms uintptr }{
		{unix.ST_NOSUID, unix.MS_NOSUID},
		{unix.ST_NODEV, unix.MS_NODEV},
		{unix.ST_NOEXEC, unix.MS_NOEXEC},
		{stNoSymFollow, unix.MS_NOSYMFOLLOW},
	} {
		if uintptr(st.Flags)&f.st != 0 {
			flags |= f.ms
		}
	}
	if err := unix.Mount("", target, "", flags, ""); err != nil {
		return fmt.Errorf("read-only remount: %w", err)
	}
	return nil
}

// stNoSymFollow is ST_NOSYMFOLLOW (linux/statfs.h), which x/sys/unix does
// not define.
const stNoSymFollow = 0x2000

func (d *Driver) isMountPoint(path string) (bool, error) {
	notMnt, err := d.mounter.IsLikelyNotMountPoint(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("checking mount point %s: %w", path, err)
	}
	return !notMnt, nil
}

// makeTarget creates the publish target: a file for Block, else a directory.
func makeTarget(target string, block bool) error {
	if !block {
		return os.MkdirAll(target, 0o750)
	}
	if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
		return err
	}
	f, err := os.OpenFile(target, os.O_CREATE|os.O_RDONLY, 0o640)
	if err != nil {
		return err
	}
	return f.Close()
}

// mountView is what the mount table says about one volume.
type mountView struct {
	// staged is what is mounted at the staging path, nil if nothing.
	staged *mount.MountInfo
	// stagedIsVolume says that staged is the volume's filesystem.
	stagedIsVolume bool
	// target is what is mounted at the target, nil if nothing.
	target *mount.MountInfo
	// targetIsVolume says that target is a publication of the volume.
	targetIsVolume bool
	// others are the volume's publications besides staging and target.
	others []string
	// otherMode are the volume's uses in the other mode: for a Block
	// volume, mounts of its filesystem; for a Filesystem volume, bind
	// mounts of its device node.
	otherMode []string
}

// usedInTheOtherMode refuses, FailedPrecondition, to use the volume id as a
// Block volume (block) while its filesystem is mounted, or as a Filesystem
// volume while its device is published as a Block device. Two PVs of
// different volumeMode can name one volume: a pod writing raw blocks under
// a mounted filesystem corrupts it, and a filesystem staged over a device a
// pod writes to is mounted from data anyone may have written.
func (v mountView) usedInTheOtherMode(id string, block bool) error {
	if len(v.otherMode) == 0 {
		return nil
	}
	used, want := "published as a Block device", "a Filesystem"
	if block {
		used, want = "mounted as a filesystem", "a Block"
	}
	return status.Errorf(codes.FailedPrecondition, "volume %s is %s at %s: it cannot be %s volume at the same time", id, used, strings.Join(v.otherMode, ", "), want)
}

// mountsOf reads the mount table once for everything NodeStageVolume and
// NodePublishVolume need to know about the volume whose device is dev, to
// be used as a Block volume (block) or a Filesystem volume. Without a
// device node nothing is mounted from it: an empty view.
func (d *Driver) mountsOf(dev string, block bool, staging, target string) (mountView, error) {
	infos, err := mount.ParseMountInfo("/proc/self/mountinfo")
	if err != nil {
		return mountView{}, fmt.Errorf("reading mountinfo: %w", err)
	}
	rdev, err := deviceNumber(dev)
	if errors.Is(err, fs.ErrNotExist) {
		return mountView{}, nil
	}
	if err != nil {
		return mountView{}, err
	}
	isPublication, isOtherMode := d.publicationsOf(rdev, block), d.publicationsOf(rdev, !block)
	var v mountView
	for _, mi := range infos {
		switch {
		case isOtherMode(mi):
			v.otherMode = append(v.otherMode, mi.MountPoint)
		case mi.MountPoint == staging:
			v.staged, v.stagedIsVolume = &mi, isFilesystemOf(mi, rdev)
		case mi.MountPoint == target:
			v.target, v.targetIsVolume = &mi, isPublication(mi)
		case isPublication(mi):
			v.others = append(v.others, mi.MountPoint)
		}
	}
	return v, nil
}

// deviceNumber returns the device number of the block device node dev.
// Mounts are told by it, never by the device's name: the mount table names
// the node mount(8) resolved dev to, and an lvm volume's /dev/<vg>/<lv> is
// a link to /dev/dm-N, which it lists as /dev/mapper/<vg>-<lv>.
func deviceNumber(dev string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		return 0, fmt.Errorf("device %s: %w", dev, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return 0, fmt.Errorf("device %s is not a block device", dev)
	}
	return st.Rdev, nil
}

// isFilesystemOf says that mi is a mount of the filesystem on the block
// device whose number is rdev.
func isFilesystemOf(mi mount.MountInfo, rdev uint64) bool {
	return unix.Mkdev(uint32(mi.Major), uint32(mi.Minor)) == rdev
}

// publicationsOf returns the test of whether a mount is a publication of
// the volume whose device number is rdev. A Filesystem volume's are mounts
// of its filesystem. A Block volume's are bind mounts of its device node,
// told by the device number: a block device node with rdev. Its name and
// filesystem say nothing certain: the node is in devtmpfs on a host, but
// in a tmpfs where /dev is a container's. Only mounts of those two are
// looked at (stat of a hung network filesystem's mount would hang).
//
// The kubelet's own mounts made from a publication are not publications
// (kubeletsOwnMount): a pod's subPath of it, or the kubelet's map of a
// Block volume's. Nor is a device node a pod made itself and mounted with
// subPath, whatever its device number.
func (d *Driver) publicationsOf(rdev uint64, block bool) func(mount.MountInfo) bool {
	if !block {
		return func(mi mount.MountInfo) bool { return isFilesystemOf(mi, rdev) && !d.kubeletsOwnMount(mi.MountPoint) }
	}
	return func(mi mount.MountInfo) bool {
		if mi.FsType != "devtmpfs" && mi.FsType != "tmpfs" || d.kubeletsOwnMount(mi.MountPoint) {
			return false
		}
		var st unix.Stat_t
		return unix.Stat(mi.MountPoint, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFBLK && st.Rdev == rdev
	}
}

// kubeletsOwnMount says that path is where the kubelet mounts what a pod
// asked for from a volume: a subPath, under
// pods/<uid>/volume-subpaths/, or the map of a Block volume's
// publication, under plugins/kubernetes.io/csi/volumeDevices/<pv>/dev/.
func (d *Driver) kubeletsOwnMount(path string) bool {
	rel, err := filepath.Rel(d.kubeletDir, path)
	if err != nil {
		return false
	}
	parts := strings.Split(rel, string(filepath.Separator))
	subPath := len(parts) > 3 && parts[0] == "pods" && parts[2] == "volume-subpaths"
	blockMap := len(parts) > 6 && strings.Join(parts[:4], "/") == "plugins/kubernetes.io/csi/volumeDevices" && parts[4] != "publish" && parts[5] == "dev"
	return subPath || blockMap
}

// devicePublications lists the bind mounts of dev's device node.
func (d *Driver) devicePublications(dev string) ([]string, error) {
	infos, err := mount.ParseMountInfo("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("reading mountinfo: %w", err)
	}
	rdev, err := deviceNumber(dev)
	if err != nil {
		return nil, err
	}
	isPublication := d.publicationsOf(rdev, true)
	var pubs []string
	for _, mi := range infos {
		if isPublication(mi) {
			pubs = append(pubs, mi.MountPoint)
		}
	}
	return pubs, nil
}

// NodeUnpublishVolume implements csi.NodeServer: unmount and remove the
// target, as the CSI spec requires; it is idempotent.
func (d *Driver) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	// The disk plays no part: the target is unmounted even for a disk that
	// is down or no longer configured, so that the pod can go.
	_, key, target, err := d.nodeRequest(keyOf, req.GetVolumeId(), "target path", req.GetTargetPath())
	if err != nil {
		return nil, err
	}
	unlock, err := d.locks.lock(ctx, "volume/"+key)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := mount.CleanupMountPoint(target, d.mounter, true); err != nil {
		return nil, status.Errorf(codes.Internal, "unmounting %s: %v", target, err)
	}
	klog.FromContext(ctx).V(2).Info("Unpublished volume", "volume", req.GetVolumeId(), "target", target)
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// NodeGetVolumeStats implements csi.NodeServer.
func (d *Driver) NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID is missing")
	}
	if req.GetVolumePath() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume path is missing")
	}
	dk, vol, err := d.getVolume(ctx, req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	// A volume is only ever published below the kubelet directory, so at
	// any other path (or a symlink) it is not found, and that path is not
	// looked at. Checked after the lookup, as the CSI spec orders them.
	volumePath, err := d.checkPath("volume path", req.GetVolumePath())
	if err != nil {
		return nil, status.Errorf(codes.NotFound, "volume %s is not published at %s: %s", req.GetVolumeId(), req.GetVolumePath(), status.Convert(err).Message())
	}
	mounted, err := d.isMountPoint(volumePath)
	if err != nil || !mounted {
		return nil, status.Errorf(codes.NotFound, "volume %s is not published at %s", req.GetVolumeId(), volumePath)
	}
	st, err := os.Stat(volumePath)
	if err != nil {
		return nil, status.Errorf(codes.NotFound, "volume path %s: %v", volumePath, err)
	}
	if !st.IsDir() {
		// A Block volume: only its size is known.
		return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{{Unit: csi.VolumeUsage_BYTES, Total: vol.SizeBytes}}}, nil
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(volumePath, &sfs); err != nil {
		if h := d.volumeHealth(ctx, dk, vol.Key); len(h.HealthStatuses) > 0 {
			return nil, status.Errorf(codes.Internal, "volume %s is unhealthy: %s", req.GetVolumeId(), h.HealthStatuses[0].Message)
		}
		return nil, status.Errorf(codes.Internal, "statfs %s: %v", req.GetVolumePath(), err)
	}
	bs := sfs.Frsize
	return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{
		{Unit: csi.VolumeUsage_BYTES, Total: int64(sfs.Blocks) * bs, Available: int64(sfs.Bavail) * bs, Used: int64(sfs.Blocks-sfs.Bfree) * bs},
		{Unit: csi.VolumeUsage_INODES, Total: int64(sfs.Files), Available: int64(sfs.Ffree), Used: int64(sfs.Files - sfs.Ffree)},
	}}, nil
}

// NodeGetVolumeHealth implements csi.NodeServer.
func (d *Driver) NodeGetVolumeHealth(ctx context.Context, req *csi.NodeGetVolumeHealthRequest) (*csi.NodeGetVolumeHealthResponse, error) {
	h, err := d.healthOf(ctx, req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	return &csi.NodeGetVolumeHealthResponse{VolumeHealth: h}, nil
}

// NodeGetStorageHealth implements csi.NodeServer: one entry per unhealthy
// disk, none when all are healthy.
func (d *Driver) NodeGetStorageHealth(ctx context.Context, _ *csi.NodeGetStorageHealthRequest) (*csi.NodeGetStorageHealthResponse, error) {
	resp := &csi.NodeGetStorageHealthResponse{}
	for _, dk := range d.disks() {
		if err := dk.health(ctx); err != nil {
			resp.BackendHealth = append(resp.BackendHealth, &csi.NodeGetStorageHealthResponse_StorageBackendHealth{
				Status: csi.StorageHealthErrorType_STORAGE_UNREACHABLE, Reason: "DiskUnhealthy",
				Message: fmt.Sprintf("disk %s: %v", dk.name, err),
			})
		}
	}
	return resp, nil
}

// NodeExpandVolume implements csi.NodeServer and does the whole expansion,
// because volumes are local to this node and the controller side of a
// cluster cannot reach them (see ControllerGetCapabilities): it grows the
// volume to the capacity range, refreshes its device, then grows the
// filesystem on it. XFS grows online. ext4 online grow is refused by some
// kernels (including the test machines'); then the answer says so and the
// filesystem grows offline at the next NodeStageVolume. Every step is a
// no-op when already done, so the kubelet's retries are safe.
func (d *Driver) NodeExpandVolume(ctx context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID is missing")
	}
	if req.GetVolumePath() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume path is missing")
	}
	vc := req.GetVolumeCapability()
	if vc != nil {
		if err := checkCapability(vc); err != nil {
			return nil, err
		}
	}
	size, err := expandSize(req.GetCapacityRange())
	if err != nil {
		return nil, err
	}
	dk, key, err := d.volumeOf(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	unlock, err := d.locks.lock(ctx, "volume/"+key)
	if err != nil {
		return nil, err
	}
	defer unlock()
	vol, err := dk.backend.GetVolume(ctx, key)
	if err != nil {
		return nil, toStatus(fmt.Errorf("volume %q: %w", req.GetVolumeId(), err))
	}
	block := vc.GetBlock() != nil
	volumePath := ""
	if !block {
		// The filesystem is grown through this path, so it must be one of
		// the kubelet's. Checked after the lookup: an unknown volume is
		// NotFound whatever the path. A Block volume's path is not used.
		if volumePath, err = d.checkPath("volume path", req.GetVolumePath()); err != nil {
			return nil, err
		}
	}
	dev, err := dk.backend.Device(ctx, key)
	if err != nil {
		return nil, toStatus(err)
	}
	if dev == "" {
		// The kubelet expands only volumes it has staged, and the
		// filesystem of one that is not could not be grown with it.
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is not staged on this node", req.GetVolumeId())
	}
	if !block {
		st, err := os.Stat(volumePath)
		if err != nil {
			return nil, status.Errorf(codes.NotFound, "volume path %s: %v", volumePath, err)
		}
		// Without a capability (csi-sanity sends none) a Block volume is
		// known by its publication: a file, not a directory.
		block = !st.IsDir()
	}
	if vol, err = d.growVolume(ctx, dk, req.GetVolumeId(), vol, size); err != nil {
		return nil, err
	}
	d.cfg.Faults.Reach(fault.NodeExpandVolumeDeviceRefreshed)
	if block {
		return &csi.NodeExpandVolumeResponse{CapacityBytes: vol.SizeBytes}, nil
	}
	format, err := d.mounter.GetDiskFormat(dev)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "reading filesystem type of %s: %v", dev, err)
	}
	if _, err := mount.NewResizeFs(d.exec).Resize(dev, volumePath); err != nil {
		if format == "ext4" || format == "ext3" {
			return nil, status.Errorf(codes.FailedPrecondition,
				"the kernel refused to grow ext4 on %s online (%v); the filesystem will be grown offline the next time the volume is staged, e.g. when its pod restarts", dev, err)
		}
		return nil, status.Errorf(codes.Internal, "growing %s filesystem on %s: %v", format, dev, err)
	}
	klog.FromContext(ctx).Info("Grew filesystem", "volume", req.GetVolumeId(), "fsType", format, "bytes", vol.SizeBytes)
	d.cfg.Faults.Reach(fault.NodeExpandVolumeFilesystemGrown)
	return &csi.NodeExpandVolumeResponse{CapacityBytes: vol.SizeBytes}, nil
}

// expandSize is the size an expansion grows a volume to: 0 (no growth, only
// the filesystem is fitted to its device) when the range requires nothing,
// which the CSI spec allows; otherwise the volumeSize rules. Growing never
// crosses a floor, so the Block one (alignment only) serves every volume
// mode.
func expandSize(cr *csi.CapacityRange) (int64, error) {
	if cr.GetRequiredBytes() == 0 && cr.GetLimitBytes() >= 0 {
		return 0, nil
	}
	return volumeSize(cr, true)
}

// growVolume grows vol's backing storage (file or LV, and its device) to
// size through the backend, which does nothing but finish an interrupted
// grow when the volume is already that large. A full disk is
// ResourceExhausted and leaves the volume as it was.
func (d *Driver) growVolume(ctx context.Context, dk *disk, id string, vol *backend.Volume, size int64) (*backend.Volume, error) {
	grown, err := dk.backend.ExpandVolume(ctx, vol.Key, size)
	if errors.Is(err, backend.ErrNoSpace) {
		u, _ := dk.backend.Usage(ctx)
		return nil, status.Errorf(codes.ResourceExhausted, "disk %s on node %s has %d bytes free, volume %s needs %d more to grow from %d to %d bytes: %v",
			dk.name, d.cfg.NodeID, u.FreeBytes, id, size-vol.SizeBytes, vol.SizeBytes, size, err)
	}
	if err != nil {
		return nil, toStatus(fmt.Errorf("growing volume %s to %d bytes: %w", id, size, err))
	}
	if grown.SizeBytes > vol.SizeBytes {
		klog.FromContext(ctx).Info("Expanded volume", "volume", id, "disk", dk.name, "from", vol.SizeBytes, "bytes", grown.SizeBytes)
		d.triggerStatus()
	}
	return grown, nil
}
