package backend

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
	"github.com/diskfit/diskfit/csi-driver/lvm"
	"k8s.io/klog/v2"
)

// LVM keeps each volume as a logical volume of one volume group. It runs
// the lvm2 tools through package lvm; what it records in the group (LV
// names and tags) is in lvm_tags.go.
type LVM struct {
	// name is the disk's name, vg its volume group.
	name            string
	vg              string
	device          string
	allowInitialize bool
	reserved        atomic.Int64
	run             lvm.Runner
	dmControl       string
	// dmErr is set at Start when device-mapper is missing; the disk then
	// stays unhealthy instead of failing every request in a confusing way.
	dmErr error
	space spaceGuard
	// lockDir holds the volume groups' lock files (lockVG); lock is held
	// on this group's while this backend serves it.
	lockDir string
	lock    serveLock
	// wiper zeroes and removes deleted LVs (lvm_wipe.go).
	wiper *wiper
	// claimed says that the group is tagged as this disk's (claimVG).
	claimed atomic.Bool
	// servedPath is the group's servedRecord.
	servedPath string
	// uuid is the UUID of the group Start found or made, which every
	// later read must find again (readVG).
	uuid atomic.Pointer[string]
}

// servedRecord, <stateDir>/<group>.json, records that this node served
// the volume group, and which group it was: lvm2's UUID for it, given when
// it was made. A group that was served and is gone (its disk died, or is
// slow to appear at boot) is not made again on the configured device,
// which may by then be another disk under that name (a replacement, a
// spare, another driver's LUN: blank, so initialize would take it), and a
// group of the name with another UUID (made since, or a tenant's copy on a
// device lvm2 reads) is not served in its place.
type servedRecord struct {
	VolumeGroup string `json:"volumeGroup"`
	UUID        string `json:"uuid"`
	Disk        string `json:"disk"`
}

var (
	_ Backend = &LVM{}
	_ Wiping  = &LVM{}
)

// NewLVM returns a backend for disk name, the volume group vg. When allowInitialize is set,
// the group does not exist and device is blank, Start creates it on device
// (initialize). lockDir is the
// node's directory for the lock of each volume group a driver serves
// (lockVG): every driver on the node must see it as the same directory.
// stateDir is a directory of the node that outlives its boots, where the
// group is recorded once served (servedRecord).
func NewLVM(name, vg, device string, allowInitialize bool, reserved int64, run lvm.Runner, lockDir, stateDir string) *LVM {
	l := &LVM{name: name, vg: vg, device: device, allowInitialize: allowInitialize, run: run, dmControl: lvm.DeviceMapperControl, lockDir: lockDir,
		servedPath: filepath.Join(stateDir, vg+".json"), wiper: newWiper()}
	l.reserved.Store(reserved)
	return l
}

// SetReserved implements Backend.
func (l *LVM) SetReserved(bytes int64) { l.reserved.Store(bytes) }

// Kind implements Backend.
func (l *LVM) Kind() v1alpha1.Backend { return v1alpha1.BackendLVM }

// Close implements Backend: it stops the wiper, killing a wipe in progress
// (the next Start resumes it), and releases the volume group's lock
// (lockVG).
func (l *LVM) Close() error {
	l.wiper.stop()
	return l.lock.release()
}

// lockVG takes the volume group (serveLock) until Close. The lock is a
// file of the group's name in lockDir, a directory of the node that every
// driver on it mounts: a volume group has no file of its own to lock that
// exists whether or not its LVs are active, and lvm2's own locks are held
// only while one command runs. The file is never removed, since a process
// may hold it open: removing it would let another lock a new file of the
// same name.
func (l *LVM) lockVG() error {
	if !filepath.IsAbs(l.lockDir) {
		return fmt.Errorf("the lock directory %q is not an absolute path", l.lockDir)
	}
	if err := os.MkdirAll(l.lockDir, 0o755); err != nil {
		return err
	}
	return l.lock.take(filepath.Join(l.lockDir, "lvm-"+l.vg+".lock"), os.O_RDONLY|os.O_CREATE, "volume group "+l.vg)
}

// Start implements Backend: it takes the volume group (lockVG), creates
// it when allowed, missing and its device blank (initialize), removes the LVs of creations that did not
// finish (tagged creating), and starts the wiper, which also wipes what an
// earlier driver deleted and did not wipe yet. A Start that fails lets go
// of the group again.
func (l *LVM) Start(ctx context.Context) (err error) {
	if err := l.lockVG(); err != nil {
		if errors.Is(err, ErrServedByAnotherProcess) {
			// The process holding the group may be one hung on it.
			if _, verr := l.vgUsage(ctx); verr != nil {
				return fmt.Errorf("volume group %s is gone: %w", l.vg, verr)
			}
		}
		return err
	}
	defer func() {
		if err != nil {
			l.Close()
		}
	}()
	if l.dmErr = lvm.CheckDeviceMapper(l.dmControl); l.dmErr != nil {
		// Not fatal: the other disks of the node still work, and the
		// DiskNode tells the scheduler why this one does not.
		return nil
	}
	if err := l.startGroup(ctx); err != nil {
		return err
	}
	lvs, err := l.lvs(ctx)
	if err != nil {
		return err
	}
	pending := false
	for _, lv := range lvs {
		switch {
		case strings.HasPrefix(lv.name, wipePrefix):
			pending = true
		case lv.state != StateReady:
			if err := l.discard(ctx, lv.name); err != nil {
				return fmt.Errorf("rolling back interrupted operation: %w", err)
			}
			pending = true
		case lv.snapshot && lv.origin != "" && lv.area < cowNeeded(lv.size):
			l.growSnapshot(ctx, lv)
		}
	}
	l.wiper.start(klog.NewContext(ctx, klog.FromContext(ctx).WithValues("volumeGroup", l.vg)), l.wipeAll, pending)
	return nil
}

// startGroup finds the volume group, or makes it (initialize), checks
// that it is the group the disk served before (servedRecord) and this
// disk's (claimVG), and records it as served.
func (l *LVM) startGroup(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	// Found anew (the record, if any, says which group it must be).
	l.uuid.Store(nil)
	var served *servedRecord
	unread := readJSON(l.servedPath, &served)
	if errors.Is(unread, fs.ErrNotExist) {
		served, unread = nil, nil
	}
	vg, found, err := l.readVG(ctx)
	if err == nil && !found {
		err = errors.New("vgs answered without it")
	}
	switch {
	case err != nil && !l.allowInitialize:
		return fmt.Errorf("volume group %s: %w", l.vg, err)
	case err != nil && unread != nil:
		return fmt.Errorf("volume group %s: %w; it is not made on %s, as whether this node served it before cannot be told: %w", l.vg, err, l.device, unread)
	case err != nil && served != nil:
		return fmt.Errorf("volume group %s (UUID %s), which disk %q served, is not found (%w); it is not made again on %s, which may be another disk by now: "+
			"if its disk is gone for good, and its volumes with it, remove %s to have the group made anew", l.vg, served.UUID, served.Disk, err, l.device, l.servedPath)
	case err != nil:
		if err := l.initialize(ctx, err); err != nil {
			return err
		}
		if vg, found, err = l.readVG(ctx); err != nil || !found {
			return fmt.Errorf("reading volume group %s just made: %w (reported: %v)", l.vg, err, found)
		}
		l.claimed.Store(true)
	case served != nil && served.UUID != vg.UUID:
		return fmt.Errorf("volume group %s is not the group disk %q served (UUID %s, now %s): one of the name made since, or on a device that is not the group's, is not served in its place; "+
			"if the group was made anew on purpose, remove %s", l.vg, served.Disk, served.UUID, vg.UUID, l.servedPath)
	default:
		if err := l.claimVG(ctx, vg.Tags); err != nil {
			return err
		}
	}
	l.uuid.Store(&vg.UUID)
	// The group is found and the disk's. A record that cannot be read or
	// written only guards against making or taking a group anew: the
	// disk is served (not read as failed, its claims released), and the
	// next start tries again.
	switch {
	case served != nil:
		return nil
	case unread != nil:
		logger.Error(unread, "Cannot read whether this node served the volume group before; serving it, and not making it should it go", "volumeGroup", l.vg)
		return nil
	case vg.UUID == "":
		logger.Error(nil, "vgs reported no UUID for the volume group; serving it unrecorded", "volumeGroup", l.vg)
		return nil
	}
	err = os.MkdirAll(filepath.Dir(l.servedPath), 0o700)
	if err == nil {
		err = writeJSONAtomic(l.servedPath, servedRecord{VolumeGroup: l.vg, UUID: vg.UUID, Disk: l.name}, true, nil)
	}
	if err != nil {
		logger.Error(err, "Cannot record the volume group as served yet; the next start tries again", "volumeGroup", l.vg, "record", l.servedPath)
	}
	return nil
}

// initialize makes the volume group on the disk's device, vgs having
// failed with vgsErr. It does so only when lvm2 said that the group does
// not exist (lvm.VGNotFound) and the device is blank: no signature that
// util-linux knows (a filesystem, a partition table, another group's PV)
// and nothing the kernel has on it (partitions). Any other vgs failure (a
// device it could not read, two groups of the name, a vgs killed) says
// nothing of whether the group exists, and a device name may since have
// been handed to another disk (the group's disk died, or is slow to
// appear at boot): a start that wiped what it found would destroy that
// disk's data, and starts are retried at every status refresh. Nothing
// is then written to the device; the error names it and what was found,
// and the disk is reported unavailable with it.
//
// vgcreate makes the device a PV itself, with no --yes or --force: a
// signature that appeared since the probe makes lvm2 ask, read no answer
// and refuse.
func (l *LVM) initialize(ctx context.Context, vgsErr error) error {
	if !lvm.VGNotFound(vgsErr, l.vg) {
		return fmt.Errorf("volume group %s: %w; %s is not initialised while lvm2 cannot tell that the group does not exist", l.vg, vgsErr, l.device)
	}
	sigs, err := lvm.Signatures(ctx, l.run, l.device)
	if err != nil {
		return fmt.Errorf("volume group %s not found, and %s cannot be probed for signatures, so it is not initialised: %w", l.vg, l.device, err)
	}
	children, err := lvm.Children(ctx, l.run, l.device)
	if err != nil {
		return fmt.Errorf("volume group %s not found, and the devices on %s cannot be listed, so it is not initialised: %w", l.vg, l.device, err)
	}
	var found []string
	for _, s := range sigs {
		found = append(found, s.String())
	}
	if len(children) > 0 {
		found = append(found, "partitions or devices on it: "+strings.Join(children, ", "))
	}
	if len(found) > 0 {
		return fmt.Errorf("volume group %s not found, and %s is not blank (%s), so it is not initialised: "+
			"it may be another disk under that name (device names can change at boot); if it is the disk meant for %s, wipe it first",
			l.vg, l.device, strings.Join(found, "; "), l.vg)
	}
	klog.FromContext(ctx).Info("Making the volume group on a blank device", "volumeGroup", l.vg, "device", l.device)
	if _, err := l.run.Run(ctx, "vgcreate", "--addtag", tagDisk+l.name, l.vg, l.device); err != nil {
		return fmt.Errorf("making volume group %s on %s: %w", l.vg, l.device, err)
	}
	return nil
}

// claimVG refuses a volume group tagged as another disk's (tagDisk; an
// AnotherDiskError naming that disk), and tags one that has no disk tag
// yet (made by an older driver, or by an admin) with this disk's name, as
// the file backend does with its state directory (claimStateDir). A
// volume ID names its disk, and an lvm disk is whatever group the node
// config gives it: a config that swapped two disks' groups, or renamed a
// disk, would otherwise serve their volumes under the wrong IDs, and
// answer DeleteVolume for a volume whose LV is in the other group as done.
// Removing the tag by hand gives the group to another name.
//
// A tag that cannot be added does not stop the disk: it is served as
// before disks were tagged, and the next creation (claimBeforeCreating)
// or start tags it.
func (l *LVM) claimVG(ctx context.Context, tags []string) error {
	own := false
	for _, tag := range tags {
		name, ok := strings.CutPrefix(tag, tagDisk)
		switch {
		case !ok:
		case name == l.name:
			own = true
		default:
			return &AnotherDiskError{Disk: l.name, VolumeGroup: l.vg, Holder: name, Record: tag}
		}
	}
	if own {
		l.claimed.Store(true)
		return nil
	}
	if _, err := l.run.Run(ctx, "vgchange", "--addtag", tagDisk+l.name, l.vg); err != nil {
		klog.FromContext(ctx).Error(err, "Cannot tag the volume group with the disk's name yet; the next creation tries again", "disk", l.name, "volumeGroup", l.vg)
		return nil
	}
	l.claimed.Store(true)
	return nil
}

// claimBeforeCreating claims the volume group, if Start could not, before
// a creation adds to it.
func (l *LVM) claimBeforeCreating(ctx context.Context) error {
	if l.claimed.Load() {
		return nil
	}
	vg, found, err := l.readVG(ctx)
	if err != nil {
		return err
	}
	if !found {
		// Not ErrNotFound: CSI keeps NotFound for a missing source.
		return fmt.Errorf("volume group %s is gone: %w", l.vg, ErrUnhealthy)
	}
	return l.claimVG(ctx, vg.Tags)
}

// Health implements Backend.
func (l *LVM) Health(ctx context.Context) error {
	if l.dmErr != nil {
		return l.dmErr
	}
	if _, err := l.vgUsage(ctx); err != nil {
		return fmt.Errorf("volume group %s is gone: %w", l.vg, err)
	}
	return nil
}

// Usage implements Backend.
func (l *LVM) Usage(ctx context.Context) (Usage, error) {
	u, err := l.vgUsage(ctx)
	if err != nil {
		return Usage{}, err
	}
	reserved := l.reserved.Load()
	u.CapacityBytes = max(u.CapacityBytes-reserved, 0)
	u.FreeBytes = min(max(u.FreeBytes-reserved, 0), u.CapacityBytes)
	return u, nil
}

func (l *LVM) vgUsage(ctx context.Context) (Usage, error) {
	vg, ok, err := l.readVG(ctx)
	if err != nil {
		return Usage{}, err
	}
	if !ok {
		return Usage{}, fmt.Errorf("volume group %s: %w", l.vg, ErrNotFound)
	}
	return Usage{CapacityBytes: vg.SizeBytes, FreeBytes: vg.FreeBytes}, nil
}

// readVG reads the volume group (lvm.ReadVG); one lvm2 finds more than
// once is ErrDuplicateGroup.
// A group of another UUID than the one Start found is not the group
// served: its device gone and another group of its name in its place
// (planted on a device lvm2 reads), volumes must not be made there.
func (l *LVM) readVG(ctx context.Context) (lvm.VG, bool, error) {
	vg, ok, err := lvm.ReadVG(ctx, l.run, l.vg)
	if lvm.DuplicateVG(err) {
		err = fmt.Errorf("%w: %w", ErrDuplicateGroup, err)
	}
	if err == nil && ok {
		err = l.checkServed(vg.UUID)
	}
	return vg, ok, err
}

// checkServed refuses a group of another UUID than the one Start found
// (none before Start found one): an unhealthy disk's error.
func (l *LVM) checkServed(uuid string) error {
	if served := l.uuid.Load(); served != nil && *served != "" && uuid != *served {
		return fmt.Errorf("volume group %s is not the group served since start (UUID %s, now %s): %w", l.vg, *served, uuid, ErrUnhealthy)
	}
	return nil
}

// lvs lists diskfit's LVs of the group, sorted by name.
func (l *LVM) lvs(ctx context.Context) ([]lv, error) {
	raws, err := lvm.ListLVs(ctx, l.run, l.vg)
	if err != nil {
		return nil, err
	}
	for _, raw := range raws {
		// Not the group served (readVG): none of its LVs is.
		if err := l.checkServed(raw.VGUUID); err != nil {
			return nil, err
		}
	}
	return decodeLVs(raws)
}

// extent is LVM's default extent size; sizes are rounded up to it so
// that the size recorded equals the size allocated.
const extent = 4 << 20

// roundExtent rounds size up to whole extents.
func roundExtent(size int64) int64 {
	return (size + extent - 1) / extent * extent
}

// snapshotChunk is the chunk size of thick snapshots, lvm2's default,
// given on the command line so that cowSize holds whatever lvm.conf says.
const snapshotChunk = 4 << 10

// cowSize is the copy-on-write area a thick snapshot of an origin of size
// bytes needs to keep its data however much of the origin is written
// again: dm-snapshot's header chunk, a data chunk for every origin chunk,
// and the metadata chunks indexing them (one per chunk/16 data chunks, the
// next one zeroed as soon as one is full), plus the 1/64 lvm2 adds on
// kernels that may leak chunks in a crash. It is lvm2's own bound
// (cow_max_extents, what --extents 100%ORIGIN asks for), rounded up to
// whole extents; an area of the origin's size is a few chunks short, and
// a snapshot whose area overflows turns invalid and unreadable.
func cowSize(size int64) int64 {
	n := cowChunks(size)
	return roundExtent((n + (n+63)/64) * snapshotChunk)
}

// cowNeeded is the least area that holds a rewrite of a whole origin of
// size bytes: cowSize without the 1/64 for kernels that leak chunks, what
// lvm2 trims a larger request to on other kernels. A snapshot whose area
// is smaller (one made before cowSize) is enlarged at start.
func cowNeeded(size int64) int64 {
	return roundExtent(cowChunks(size) * snapshotChunk)
}

// cowChunks is the header chunk, the data chunks and the metadata chunks
// of a full copy-on-write area for an origin of size bytes (lvm2's
// _cow_max_size).
func cowChunks(size int64) int64 {
	chunks := (size + snapshotChunk - 1) / snapshotChunk
	const perArea = snapshotChunk / 16
	return 1 + chunks + (chunks+perArea)/perArea
}

func (l *LVM) lvPath(name string) string { return lvm.DevicePath(l.vg, name) }

// noSpace turns lvm's "insufficient free space" into ErrNoSpace.
func noSpace(err error) error {
	if lvm.InsufficientSpace(err) {
		return fmt.Errorf("%w: %w", ErrNoSpace, err)
	}
	return err
}

func (l *LVM) find(ctx context.Context, lvName string) (*lv, error) {
	lvs, err := l.lvs(ctx)
	if err != nil {
		return nil, err
	}
	for i := range lvs {
		if lvs[i].name == lvName && lvs[i].state == StateReady {
			return &lvs[i], nil
		}
	}
	return nil, ErrNotFound
}

// clearLeftover removes a half-made LV an earlier attempt left, never a
// complete one (ErrExists).
func (l *LVM) clearLeftover(ctx context.Context, lvName string) error {
	if _, err := l.find(ctx, lvName); err == nil {
		return fmt.Errorf("%s: %w", lvName, ErrExists)
	} else if !errors.Is(err, ErrNotFound) {
		return err
	}
	return l.removeLV(ctx, lvName)
}

// CreateVolume implements Backend: the LV is created tagged "creating" and
// re-tagged "ready" once complete, so Start can undo a half-made one.
func (l *LVM) CreateVolume(ctx context.Context, req CreateRequest) (*Volume, error) {
	if err := l.Health(ctx); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnhealthy, err)
	}
	name := volumePrefix + req.Key
	pvc := ""
	if req.PVCName != "" {
		pvc = req.PVCNamespace + "/" + req.PVCName
	}
	var copyFrom string
	content := ContentNone
	switch {
	case req.FromSnapshot != "":
		copyFrom = snapPrefix + req.FromSnapshot
	case req.FromVolume != "":
		copyFrom = volumePrefix + req.FromVolume
	}
	if copyFrom != "" {
		src, err := l.find(ctx, copyFrom)
		if err != nil {
			return nil, fmt.Errorf("content source %s: %w", copyFrom, err)
		}
		// dd copies a volume block by block, with no snapshot or freeze:
		// one written meanwhile would give a copy of blocks from
		// different moments, a filesystem no journal replay repairs. So a
		// source in use is refused (Kubernetes asks for a clone's source
		// not to be), and the caller keeps it unused until the copy ends
		// (the driver holds the source volume's lock, which staging
		// takes). A snapshot is never in use: restores copy from it.
		if req.FromVolume != "" && src.open {
			return nil, fmt.Errorf("source volume %s: %w (its device is open: mounted, or a pod's Block device); "+
				"clone it once no pod uses it, or take a VolumeSnapshot and restore it", req.FromVolume, ErrInUse)
		}
		// A copy holds what its source held (a snapshot records what its
		// origin held when it was taken): a filesystem or a Block
		// volume's data, never formatted; or, of a source no stage ever
		// got to, nothing a pod wrote, so its first stage formats it as
		// a new volume's. A source of an older driver, whose record does
		// not say, counts as holding a filesystem.
		content = src.content
		if content == ContentUnknown {
			content = ContentFilesystem
		}
	}
	if err := l.claimBeforeCreating(ctx); err != nil {
		return nil, err
	}
	if err := l.clearLeftover(ctx, name); err != nil {
		return nil, err
	}
	err := l.space.allocate(ctx, l.Usage, roundExtent(req.SizeBytes), func() error {
		_, err := l.run.Run(ctx, "lvcreate", l.createArgs(name, req.Name, pvc, "", req.SizeBytes, false, content, sourceTags(req)...)...)
		return noSpace(err)
	})
	if err != nil {
		return nil, errors.Join(err, l.undo(ctx, name))
	}
	if copyFrom != "" {
		if err := l.copyLV(ctx, copyFrom, name); err != nil {
			return nil, errors.Join(err, l.undo(ctx, name))
		}
	}
	if err := l.markReady(ctx, name); err != nil {
		return nil, errors.Join(err, l.undo(ctx, name))
	}
	return l.GetVolume(ctx, req.Key)
}

// UndoTimeout bounds an undo that runs on after its caller gave up: its
// commands are quick unless the disk or lvm2 hangs, and a lock is held
// meanwhile.
const UndoTimeout = time.Minute

// undo removes the LV of a creation that failed (an lvcreate killed with
// its caller may have made it before it died), with a context that the
// end of the call's does not end: a copy fails most often because its
// caller gave up (external-provisioner's --timeout kills the dd with the
// call), and with the call's context every command of the removal would
// fail too, leaving the LV half made and holding its space until a retry
// of the same name or the next start.
func (l *LVM) undo(ctx context.Context, name string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), UndoTimeout)
	defer cancel()
	return l.removeLV(ctx, name)
}

// copyLV copies the data of one LV into another with direct I/O, and
// flushes the disk's write cache (conv=fsync) before the copy is tagged
// ready: direct I/O bypasses the page cache, not the disk's.
func (l *LVM) copyLV(ctx context.Context, from, to string) error {
	for _, name := range []string{from, to} {
		if _, err := l.run.Run(ctx, "lvchange", "--activate", "y", l.vg+"/"+name); err != nil {
			return err
		}
	}
	// No conv=sparse: skipped blocks would keep whatever an earlier LV
	// left on the extents.
	_, err := l.run.Run(ctx, "dd", "if="+l.lvPath(from), "of="+l.lvPath(to), "bs=4M", "iflag=direct", "oflag=direct", "conv=fsync")
	return err
}

func (l *LVM) markReady(ctx context.Context, name string) error {
	_, err := l.run.Run(ctx, "lvchange", "--deltag", tagState+string(StateCreating), "--addtag", tagState+string(StateReady), l.vg+"/"+name)
	return err
}

// removeLV removes an LV if it exists. It is renamed for the wiper
// (discard), which removes it once its data is zeroed.
func (l *LVM) removeLV(ctx context.Context, name string) error {
	lvs, err := l.lvs(ctx)
	if err != nil {
		return err
	}
	for _, v := range lvs {
		if v.name == name {
			return l.discard(ctx, name)
		}
	}
	return nil
}

// DeleteVolume implements Backend. A volume with snapshots is refused:
// LVM snapshots depend on their origin and would go with it, while CSI
// snapshots must outlive their source.
func (l *LVM) DeleteVolume(ctx context.Context, key string) error {
	if l.dmErr != nil {
		return fmt.Errorf("%w: %w", ErrUnhealthy, l.dmErr)
	}
	snaps, err := l.ListSnapshots(ctx)
	if err != nil {
		return err
	}
	for _, s := range snaps {
		if s.SourceVolume == key {
			return fmt.Errorf("%w: snapshot %s depends on it", ErrInUse, s.Key)
		}
	}
	return l.removeLV(ctx, volumePrefix+key)
}

// GetVolume implements Backend.
func (l *LVM) GetVolume(ctx context.Context, key string) (*Volume, error) {
	v, err := l.find(ctx, volumePrefix+key)
	if err != nil {
		return nil, err
	}
	return l.volume(v, key), nil
}

// ListVolumes implements Backend.
func (l *LVM) ListVolumes(ctx context.Context) ([]Volume, error) {
	lvs, err := l.lvs(ctx)
	if err != nil {
		return nil, err
	}
	var vols []Volume
	for i := range lvs {
		if key, ok := strings.CutPrefix(lvs[i].name, volumePrefix); ok && lvs[i].state == StateReady && !lvs[i].snapshot {
			vols = append(vols, *l.volume(&lvs[i], key))
		}
	}
	return vols, nil
}

// ExpandVolume implements Backend.
func (l *LVM) ExpandVolume(ctx context.Context, key string, size int64) (*Volume, error) {
	vol, err := l.GetVolume(ctx, key)
	if err != nil {
		return nil, err
	}
	if size <= vol.SizeBytes {
		return vol, nil
	}
	err = l.space.allocate(ctx, l.Usage, roundExtent(size)-vol.SizeBytes, func() error {
		_, err := l.run.Run(ctx, "lvextend", "--size", strconv.FormatInt(roundExtent(size), 10)+"b", l.vg+"/"+volumePrefix+key)
		return noSpace(err)
	})
	if err != nil {
		return nil, err
	}
	return l.GetVolume(ctx, key)
}

// VolumeHealth implements Backend.
func (l *LVM) VolumeHealth(ctx context.Context, key string) error {
	if err := l.Health(ctx); err != nil {
		return err
	}
	_, err := l.find(ctx, volumePrefix+key)
	return err
}

// Attach implements Backend. The device of an active LV is set read-only
// or read-write as asked (BLKROSET, which lasts until the LV is
// deactivated): an LV has one device, whoever asked last sets it.
func (l *LVM) Attach(ctx context.Context, key string, readOnly bool) (string, error) {
	if _, err := l.GetVolume(ctx, key); err != nil {
		return "", err
	}
	if _, err := l.run.Run(ctx, "lvchange", "--activate", "y", l.vg+"/"+volumePrefix+key); err != nil {
		return "", err
	}
	path := l.lvPath(volumePrefix + key)
	setting := "--setrw"
	if readOnly {
		setting = "--setro"
	}
	if _, err := l.run.Run(ctx, "blockdev", setting, path); err != nil {
		return "", err
	}
	return path, nil
}

// Device implements Backend.
func (l *LVM) Device(_ context.Context, key string) (string, error) {
	p := l.lvPath(volumePrefix + key)
	if _, err := os.Stat(p); err != nil {
		return "", nil
	}
	return p, nil
}

// Detach implements Backend.
func (l *LVM) Detach(ctx context.Context, key string) error {
	if _, err := l.find(ctx, volumePrefix+key); errors.Is(err, ErrNotFound) {
		return nil
	}
	_, err := l.run.Run(ctx, "lvchange", "--activate", "n", l.vg+"/"+volumePrefix+key)
	return err
}

// Blank implements Backend: an LV's extents may hold what an earlier LV
// left there, so it is never assumed blank. (A new LV's Content is
// ContentNone, and staging formats it whatever is there; only an LV made
// before the content tag existed depends on this.)
func (l *LVM) Blank(context.Context, string) (bool, error) { return false, nil }

// SupportsSnapshots implements Backend.
func (l *LVM) SupportsSnapshots() bool { return l.dmErr == nil }

// CreateSnapshot implements Backend.
func (l *LVM) CreateSnapshot(ctx context.Context, req SnapshotRequest) (*Snapshot, error) {
	key, sourceKey := req.Key, req.SourceKey
	src, err := l.GetVolume(ctx, sourceKey)
	if err != nil {
		return nil, fmt.Errorf("source volume: %w", err)
	}
	lvName := snapPrefix + key
	if err := l.claimBeforeCreating(ctx); err != nil {
		return nil, err
	}
	if err := l.clearLeftover(ctx, lvName); err != nil {
		return nil, err
	}
	// A thick snapshot takes its whole copy-on-write area from the volume
	// group when it is made.
	err = l.space.allocate(ctx, l.Usage, cowSize(src.SizeBytes), func() error {
		var tags []string
		if req.For != "" {
			tags = append(tags, tagFor+req.For)
		}
		_, err := l.run.Run(ctx, "lvcreate", l.createArgs(lvName, req.Name, "", sourceKey, src.SizeBytes, true, src.Content, tags...)...)
		return noSpace(err)
	})
	if err != nil {
		return nil, errors.Join(err, l.undo(ctx, lvName))
	}
	if err := l.markReady(ctx, lvName); err != nil {
		return nil, errors.Join(err, l.undo(ctx, lvName))
	}
	return l.GetSnapshot(ctx, key)
}

// growSnapshot gives a snapshot whose copy-on-write area is smaller than
// a rewrite of its whole origin needs (one made before cowSize) that room,
// its size recorded first. Without room in the group
// it stays as it is, logged, and the next start tries again.
func (l *LVM) growSnapshot(ctx context.Context, s lv) {
	logger := klog.FromContext(ctx).WithValues("volumeGroup", l.vg, "lv", s.name)
	if !s.sizeTag {
		if _, err := l.run.Run(ctx, "lvchange", "--addtag", tagSize+strconv.FormatInt(s.size, 10), l.vg+"/"+s.name); err != nil {
			logger.Error(err, "Recording a snapshot's size failed")
			return
		}
	}
	err := l.space.allocate(ctx, l.Usage, cowSize(s.size)-s.area, func() error {
		_, err := l.run.Run(ctx, "lvextend", "--size", strconv.FormatInt(cowSize(s.size), 10)+"b", l.vg+"/"+s.name)
		return noSpace(err)
	})
	if err != nil {
		logger.Error(err, "A snapshot's copy-on-write area is too small to keep its data if its whole origin is written again; it was not enlarged")
		return
	}
	logger.Info("Enlarged a snapshot's copy-on-write area to hold a rewrite of its whole origin")
}

// DeleteSnapshot implements Backend.
func (l *LVM) DeleteSnapshot(ctx context.Context, key string) error {
	if l.dmErr != nil {
		return fmt.Errorf("%w: %w", ErrUnhealthy, l.dmErr)
	}
	return l.removeLV(ctx, snapPrefix+key)
}

// GetSnapshot implements Backend.
func (l *LVM) GetSnapshot(ctx context.Context, key string) (*Snapshot, error) {
	v, err := l.find(ctx, snapPrefix+key)
	if err != nil {
		return nil, err
	}
	return snapshot(v, key), nil
}

// SetVolumeRefs implements Backend: the Refs tags are replaced.
func (l *LVM) SetVolumeRefs(ctx context.Context, key string, refs Refs) error {
	return l.setRefs(ctx, volumePrefix+key, refs)
}

// SetVolumeContent implements Backend: the content tag is replaced.
func (l *LVM) SetVolumeContent(ctx context.Context, key string, content Content) error {
	name := volumePrefix + key
	v, err := l.find(ctx, name)
	if err != nil {
		return err
	}
	if v.content == content {
		return nil
	}
	var args []string
	if v.content != ContentUnknown {
		args = append(args, "--deltag", tagContent+string(v.content))
	}
	if content != ContentUnknown {
		args = append(args, "--addtag", tagContent+string(content))
	}
	_, err = l.run.Run(ctx, "lvchange", append(args, l.vg+"/"+name)...)
	return err
}

// SetSnapshotRefs implements Backend, like SetVolumeRefs.
func (l *LVM) SetSnapshotRefs(ctx context.Context, key string, refs Refs) error {
	return l.setRefs(ctx, snapPrefix+key, refs)
}

func (l *LVM) setRefs(ctx context.Context, lvName string, refs Refs) error {
	v, err := l.find(ctx, lvName)
	if err != nil {
		return err
	}
	args := []string{}
	if v.refs.NeverReferenced && !refs.NeverReferenced {
		args = append(args, "--deltag", tagNeverReferenced)
	} else if !v.refs.NeverReferenced && refs.NeverReferenced {
		args = append(args, "--addtag", tagNeverReferenced)
	}
	if !v.refs.UnreferencedSince.Equal(refs.UnreferencedSince) {
		if !v.refs.UnreferencedSince.IsZero() {
			args = append(args, "--deltag", tagUnreferencedSince+strconv.FormatInt(v.refs.UnreferencedSince.Unix(), 10))
		}
		if !refs.UnreferencedSince.IsZero() {
			args = append(args, "--addtag", tagUnreferencedSince+strconv.FormatInt(refs.UnreferencedSince.Unix(), 10))
		}
	}
	if len(args) == 0 {
		return nil
	}
	_, err = l.run.Run(ctx, "lvchange", append(args, l.vg+"/"+lvName)...)
	return err
}

// ListSnapshots implements Backend.
func (l *LVM) ListSnapshots(ctx context.Context) ([]Snapshot, error) {
	lvs, err := l.lvs(ctx)
	if err != nil {
		return nil, err
	}
	var snaps []Snapshot
	for _, v := range lvs {
		if key, ok := strings.CutPrefix(v.name, snapPrefix); ok && v.state == StateReady && v.snapshot {
			snaps = append(snaps, *snapshot(&v, key))
		}
	}
	return snaps, nil
}

// SetDeviceMapperControl points the device-mapper check at another path;
// tests use it to run the backend as if device-mapper existed or not.
func (l *LVM) SetDeviceMapperControl(path string) { l.dmControl = path }
