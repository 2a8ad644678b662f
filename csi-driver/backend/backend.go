// Package backend stores volumes on one disk. A Backend is the only thing
// that knows how a disk keeps its volumes (files on a filesystem, logical
// volumes in a volume group); the CSI services above it deal in keys, sizes
// and sentinel errors.
//
// The on-disk state is the source of truth: every Backend rebuilds what it
// knows from the disk itself, so a restarted driver needs no database.
package backend

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
)

// Sentinel errors; the CSI services map them to gRPC codes with errors.Is.
var (
	// ErrNotFound: no such volume or snapshot.
	ErrNotFound = errors.New("not found")
	// ErrNoSpace: the disk cannot hold the requested bytes.
	ErrNoSpace = errors.New("not enough space on disk")
	// ErrInUse: the volume is in use (attached, its device open): it
	// cannot be deleted, nor be the source of an LVM clone.
	ErrInUse = errors.New("volume is in use")
	// ErrUnsupported: the disk cannot do this (no reflink, no device-mapper).
	ErrUnsupported = errors.New("not supported by this disk")
	// ErrUnhealthy: the disk is not usable right now.
	ErrUnhealthy = errors.New("disk is unhealthy")
	// ErrExists: a create found the volume or snapshot complete already.
	ErrExists = errors.New("already exists")
	// ErrAnotherDisk: the filesystem at the disk's path, or the disk's
	// volume group, holds another disk's state; an *AnotherDiskError says
	// whose.
	ErrAnotherDisk = errors.New("the path holds another disk's state")
	// ErrDuplicateGroup: lvm2 finds the disk's volume group more than
	// once under its name and refuses it; the group's own device is not
	// lost (lvm.DuplicateVG).
	ErrDuplicateGroup = errors.New("another volume group has the same name")
)

// AnotherDiskError is why a file disk does not start on a path whose
// state directory is recorded as another disk's: two disks mounted at each
// other's paths, say by device names a boot handed out in another order;
// or why an lvm disk does not start on a volume group tagged as another
// disk's: a node config that swapped two disks' groups, or renamed a disk.
// It is ErrAnotherDisk.
type AnotherDiskError struct {
	// Disk is the disk that did not start, Path its path (a file disk).
	Disk, Path string
	// VolumeGroup is an lvm disk's volume group, "" for a file disk.
	VolumeGroup string
	// Holder is the disk the state directory at Path, or VolumeGroup, is
	// recorded as; Record is that record's file, or the group's tag.
	Holder, Record string
}

func (e *AnotherDiskError) Error() string {
	if e.VolumeGroup != "" {
		return fmt.Sprintf("volume group %s is disk %q's, not %q's (tagged %s): are volume groups swapped between disks, or a disk renamed, in the node config? "+
			"(to give it to %q, move or reclaim what %q holds there and remove the tag: vgchange --deltag %s %s)",
			e.VolumeGroup, e.Holder, e.Disk, e.Record, e.Disk, e.Holder, e.Record, e.VolumeGroup)
	}
	return fmt.Sprintf("%s is disk %q's, not %q's: are disks mounted at each other's paths? (to give it to %q, move or reclaim what %q holds there and remove %s)",
		e.Path, e.Holder, e.Disk, e.Disk, e.Holder, e.Record)
}

// Is makes an AnotherDiskError ErrAnotherDisk.
func (e *AnotherDiskError) Is(target error) bool { return target == ErrAnotherDisk }

// State is where a volume or snapshot is in its life. What a crash
// interrupted is told by its state: an LV is made tagged "creating"; the
// file backend records a volume only once it is complete, so a data file
// without a record is one to undo.
type State string

const (
	// StateCreating marks an LV being made (and a file-backend record of
	// an older driver, which wrote one before the data file).
	StateCreating State = "creating"
	// StateReady marks a complete volume or snapshot.
	StateReady State = "ready"
)

// Content is what a volume holds as far as the driver knows. It decides
// whether NodeStageVolume may format the volume: only one that nothing
// but the driver's own unfinished mkfs can have written.
type Content string

const (
	// ContentUnknown is a record made before the field existed: the
	// volume may hold data. Staging keeps the behaviour of those drivers:
	// a volume proven blank is formatted, any other is left to
	// SafeFormatAndMount.
	ContentUnknown Content = ""
	// ContentNone is a volume made empty by this driver that no stage has
	// finished formatting and no pod has been given: at most an mkfs that
	// did not finish wrote to it, so it may be formatted (again).
	ContentNone Content = "none"
	// ContentFilesystem is a volume holding a complete filesystem: the
	// driver's mkfs finished and was synced before this was recorded, or
	// the volume was copied from a snapshot or volume that was written.
	// It may hold data and is never formatted.
	ContentFilesystem Content = "filesystem"
	// ContentBlock is a volume staged as a Block volume: a pod may have
	// written anything to it. It is never formatted.
	ContentBlock Content = "block"
)

// Refs is what the driver has seen of the API object that refers to a
// volume (its PersistentVolume) or a snapshot (its VolumeSnapshotContent).
// It decides what the driver may remove on its own: only what provably
// never had such an object, so that data a PV or content once stood for is
// kept whatever happens to that object (a PV deleted with reclaim policy
// Retain, a control plane restored from an older backup).
type Refs struct {
	// NeverReferenced is set when the volume or snapshot is made and
	// cleared for good the first time something is seen referring to it. A
	// record without it (made before the field existed, or referred to
	// since) is never removed by the driver on its own.
	NeverReferenced bool `json:"neverReferenced,omitempty"`
	// UnreferencedSince is when the driver first found nothing referring
	// to it; zero while something does.
	UnreferencedSince time.Time `json:"unreferencedSince,omitzero"`
}

// Equal reports whether r and o say the same.
func (r Refs) Equal(o Refs) bool {
	return r.NeverReferenced == o.NeverReferenced && r.UnreferencedSince.Equal(o.UnreferencedSince)
}

// Volume is a volume as its disk records it.
type Volume struct {
	// Key names the volume on its disk; see KeyForName.
	Key string `json:"key"`
	// Name is the CSI volume name the volume was created with.
	Name string `json:"name"`
	// SizeBytes is the volume's size.
	SizeBytes int64 `json:"sizeBytes"`
	// PVCNamespace and PVCName name the claim the volume was made for.
	PVCNamespace string `json:"pvcNamespace,omitempty"`
	PVCName      string `json:"pvcName,omitempty"`
	// SourceSnapshot and SourceVolume are the keys of the content source.
	SourceSnapshot string `json:"sourceSnapshot,omitempty"`
	SourceVolume   string `json:"sourceVolume,omitempty"`
	// State is the volume's state.
	State State `json:"state"`
	// CreatedAt is when creation started.
	CreatedAt time.Time `json:"createdAt"`
	// Content is what the volume holds; see Content.
	Content Content `json:"content,omitempty"`
	Refs
}

// Snapshot is a point-in-time copy of a volume, kept on the same disk.
type Snapshot struct {
	// Key names the snapshot on its disk; see KeyForName.
	Key string `json:"key"`
	// Name is the CSI snapshot name.
	Name string `json:"name"`
	// SourceVolume is the key of the volume it copies.
	SourceVolume string `json:"sourceVolume"`
	// SizeBytes is the source volume's size when the snapshot was taken.
	SizeBytes int64 `json:"sizeBytes"`
	// State is the snapshot's state.
	State State `json:"state"`
	// CreatedAt is when the snapshot was taken.
	CreatedAt time.Time `json:"createdAt"`
	// For is the VolumeSnapshotContent the snapshot was made for, when
	// the request named it: csi-snapshotter may give two VolumeSnapshots
	// one snapshot name (--snapshot-name-uuid-length), never one content
	// name.
	For string `json:"for,omitempty"`
	Refs
}

// SnapshotRequest asks for a new snapshot.
type SnapshotRequest struct {
	Key  string
	Name string
	// SourceKey is the key of the volume to copy.
	SourceKey string
	// For is the VolumeSnapshotContent it is made for; see Snapshot.For.
	For string
}

// CreateRequest asks for a new volume.
type CreateRequest struct {
	Key          string
	Name         string
	SizeBytes    int64
	PVCNamespace string
	PVCName      string
	// FromSnapshot or FromVolume, when set, is the key of the content
	// source on the same disk.
	FromSnapshot string
	FromVolume   string
}

// Usage is a disk's space, headroom already taken off.
type Usage struct {
	CapacityBytes int64
	FreeBytes     int64
}

// spaceGuard holds a disk's reserve: every allocation on the disk
// (creating, cloning or growing a volume) is checked against the space the
// disk offers beyond its reserve and made under one lock, so concurrent
// allocations cannot together eat into the reserve that each alone would
// leave alone.
type spaceGuard struct{ mu sync.Mutex }

// allocate runs alloc when the disk offers need bytes beyond its reserve,
// and answers ErrNoSpace otherwise. usage must already take the reserve
// off, as every Backend's Usage does.
func (g *spaceGuard) allocate(ctx context.Context, usage func(context.Context) (Usage, error), need int64, alloc func() error) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	u, err := usage(ctx)
	if err != nil {
		return err
	}
	if need > u.FreeBytes {
		return fmt.Errorf("%w: %d bytes needed, the disk offers %d beyond its reserve", ErrNoSpace, need, u.FreeBytes)
	}
	return alloc()
}

// Wiping is a Backend that zeroes a deleted volume's space after
// DeleteVolume returned (LVM: lvm_wipe.go), while it serves the disk.
// PendingWipes counts the deleted volumes and snapshots not zeroed yet: a
// disk that stops being served before they are keeps their data.
type Wiping interface {
	PendingWipes(ctx context.Context) (int, error)
}

// Backend keeps the volumes of one disk. Callers serialise calls per key;
// calls for different keys may run concurrently.
type Backend interface {
	// Kind is the backend type published in the DiskNode.
	Kind() v1alpha1.Backend
	// Start prepares the disk and finishes or undoes whatever a crash
	// interrupted. It is called once before any other method.
	Start(ctx context.Context) error
	// Close releases the disk for another Backend (another process) to
	// start on it; a process that exits releases it too. Nothing else is
	// called after it.
	Close() error
	// Health returns nil when new volumes can be placed on the disk, or an
	// error saying why not.
	Health(ctx context.Context) error
	// Usage reports capacity and free space.
	Usage(ctx context.Context) (Usage, error)
	// SetReserved changes the headroom kept free, for the next Usage and
	// allocation on.
	SetReserved(bytes int64)
	// CreateVolume makes a volume. On failure nothing of it is left.
	CreateVolume(ctx context.Context, req CreateRequest) (*Volume, error)
	// DeleteVolume removes a volume; a missing volume is not an error.
	DeleteVolume(ctx context.Context, key string) error
	// GetVolume returns a ready volume or ErrNotFound.
	GetVolume(ctx context.Context, key string) (*Volume, error)
	// ListVolumes returns the ready volumes, sorted by key.
	ListVolumes(ctx context.Context) ([]Volume, error)
	// SetVolumeRefs records what the driver has seen of the volume's PV.
	SetVolumeRefs(ctx context.Context, key string, refs Refs) error
	// SetVolumeContent records, durably, what the volume holds.
	SetVolumeContent(ctx context.Context, key string, content Content) error
	// ExpandVolume grows a volume to at least sizeBytes; it never shrinks.
	ExpandVolume(ctx context.Context, key string, sizeBytes int64) (*Volume, error)
	// VolumeHealth returns nil when the volume's data is reachable.
	VolumeHealth(ctx context.Context, key string) error
	// Attach makes the volume a block device on this node and returns its
	// path; attaching an attached volume returns the same device. A
	// read-only device refuses every write. An attached volume whose
	// device is read-only where read-write is asked for, or the other way
	// round, is ErrInUse where the setting cannot change while it is
	// attached.
	Attach(ctx context.Context, key string, readOnly bool) (string, error)
	// Device returns the volume's block device, or "" when not attached.
	Device(ctx context.Context, key string) (string, error)
	// Detach undoes Attach; a detached volume is not an error.
	Detach(ctx context.Context, key string) error
	// Blank reports whether the volume was provably never written, so
	// that a volume whose Content is unknown can be formatted without
	// probing it for a filesystem. False when unsure.
	Blank(ctx context.Context, key string) (bool, error)
	// SupportsSnapshots reports whether snapshots and clones work here.
	SupportsSnapshots() bool
	// CreateSnapshot copies the volume req.SourceKey into a new snapshot.
	CreateSnapshot(ctx context.Context, req SnapshotRequest) (*Snapshot, error)
	// DeleteSnapshot removes a snapshot; a missing one is not an error.
	DeleteSnapshot(ctx context.Context, key string) error
	// GetSnapshot returns a ready snapshot or ErrNotFound.
	GetSnapshot(ctx context.Context, key string) (*Snapshot, error)
	// ListSnapshots returns the ready snapshots, sorted by key.
	ListSnapshots(ctx context.Context) ([]Snapshot, error)
	// SetSnapshotRefs records what the driver has seen of the snapshot's
	// VolumeSnapshotContent.
	SetSnapshotRefs(ctx context.Context, key string, refs Refs) error
}

// MaxKeyLength bounds a key; volume IDs are "<disk>:<key>".
const MaxKeyLength = 100

var plainKeyRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]*$`)

// hashPrefix marks keys derived by hashing. Plain names never start with
// it, so a hashed key and a plain one cannot collide.
const hashPrefix = "h-"

// KeyForName derives the on-disk key of a CSI name: the name itself when it
// is short, lower-case and safe in file and LV names, otherwise a hash of it.
// The mapping is deterministic, so an idempotent retry finds the same key;
// the volume's record keeps the full name to confirm the match.
func KeyForName(name string) string {
	if len(name) <= MaxKeyLength && plainKeyRE.MatchString(name) && !strings.HasPrefix(name, hashPrefix) {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	return hashPrefix + hex.EncodeToString(sum[:16])
}

// ValidKey reports whether key could have come from KeyForName.
func ValidKey(key string) bool {
	return len(key) <= MaxKeyLength && plainKeyRE.MatchString(key)
}
