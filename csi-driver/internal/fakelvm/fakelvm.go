// Package fakelvm is a fake lvm2 for tests: an lvm.Runner that keeps one
// volume group, vg0, in memory and answers vgs, lvs, lvcreate (volumes and
// thick snapshots), lvchange, lvextend, lvrename, lvconvert
// --splitsnapshot, lvremove, the LV copy (dd), blkdiscard and blockdev like lvm2 and
// util-linux do, so the LVM backend's command building and report parsing
// run against realistic output. It is a fake because the project's test
// machines have no device-mapper, so real lvm2 cannot activate a logical
// volume there; TestLVMReal runs it where it can. A tag lvm2 would refuse
// fails the command that adds it (validTag). An LV may be marked
// open (SetOpen), as a mount or a pod's Block device holds it: lvs
// reports it in lv_attr, and lvm2's refusals follow.
//
// The host's block devices are modelled as far as making the group goes
// (Devices): pvcreate and vgcreate refuse and wipe signatures as lvm2
// does, wipefs lists what util-linux would find on a device and lsblk
// what the kernel has on it (partitions), and a device may fail every
// read (Device.ReadError), as a dying disk does. NewUncreated starts
// without the group: vgs answers as lvm2 does for a group that does not
// exist until vgcreate makes it. Commands fail as lvm.ExecRunner reports
// a command's failure (lvm.CommandError) where the backend reads lvm2's
// exit status and words.
//
// The fake keeps data as well: the group is an array of 4 MiB extents, and
// an LV is a list of them. As in lvm2, lvremove frees an LV's extents
// without touching what they hold and lvcreate or lvextend hands them out
// again as they are, so a test sees what a new LV would read on a real
// disk. lvcreate and lvextend take the lowest-numbered free extents, an LV
// non-contiguous when the free space is (lvm2's normal policy also splits
// an LV over free areas, though it may pick them in another order). A
// snapshot's extents hold a copy of its origin's data as it was when the
// snapshot was made, which is what its copy-on-write area holds once the
// origin has been written.
//
// The disk has a volatile write cache: what dd and blkdiscard write is
// lost at a power cut (PowerCut) until it is flushed, by dd's conv=fsync
// or by sync on the LV's device (fsync), as on a disk that acknowledges
// writes from its cache. lvm2's metadata (LVs, tags) and what WriteLV
// writes (a pod that syncs) survive it.
//
// A thick snapshot's copy-on-write area fills as the kernel's persistent
// exception store does (drivers/md/dm-snap-persistent.c): one chunk of
// header, then areas of one metadata chunk followed by the data chunks it
// indexes (a chunk's bytes / 16 of them), a chunk's worth of data taken
// for every origin chunk written for the first time since the snapshot,
// and the next metadata area zeroed as soon as one is full. A write that
// needs more than the area holds makes the snapshot invalid: reading it
// fails with an I/O error from then on, as dm-snapshot's does. A snapshot
// keeps the size its origin had when it was made: what is written to an
// origin extended since, beyond that size, takes no room in its area.
package fakelvm

import (
	"context"
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/diskfit/diskfit/csi-driver/lvm"
)

// Name is the volume group's name.
const Name = "vg0"

// ExtentSize is the volume group's extent size, lvm2's default.
const ExtentSize = 4 << 20

// VG is the volume group. Its LVs may be read and their tags changed
// between commands; Run serialises the commands, as lvm2's own locks do,
// so two backends may run them at once on one VG.
type VG struct {
	// Size is the group's size; Free is kept by the fake: the bytes of the
	// extents no LV holds.
	Size, Free int64
	LVs        map[string]*LV
	// Calls is every command run, "name arg arg ...".
	Calls []string
	// Fail makes every command of that name fail with the error. A key
	// with arguments ("lvchange --deltag") fails only the commands whose
	// line starts with it.
	Fail map[string]error
	// Devices are the host's block devices by path, for the commands
	// that make the group (pvcreate, vgcreate) and probe devices (wipefs,
	// lsblk). PV is the one the group is on, "" when the test does not
	// say.
	Devices map[string]*Device
	PV      string
	// Tags are the group's own tags (vg_tags): vgcreate --addtag,
	// vgchange --addtag and --deltag change them.
	Tags []string
	// UUID is the group's (vg_uuid): vgcreate gives a new one.
	UUID string

	// name is the group's name; missing is a group vgcreate has not made
	// yet (NewUncreated).
	name    string
	missing bool

	mu sync.Mutex
	// before is called with every command's name before it runs, outside
	// the lock (Hold).
	before func(ctx context.Context, name string) error
	// data holds each extent's bytes; nil is an extent of zeroes.
	data [][]byte
	// used marks the extents an LV holds.
	used []bool
	// unflushed holds, for each extent written by dd or blkdiscard since
	// its last flush, what it held before: what a power cut brings back.
	unflushed map[int][]byte
}

// LV is one logical volume.
type LV struct {
	Size int64
	Tags []string
	// Origin is the LV a snapshot is of, "" for other LVs.
	Origin string
	// Inactive is an LV without a device node: dd and blkdiscard cannot
	// open it. LVs are active when made, as lvcreate leaves them.
	Inactive bool
	// ReadOnly is an active LV whose device refuses writes (blockdev
	// --setro); deactivating it ends that.
	ReadOnly bool
	// Open is an LV whose device something holds open (a mount, a pod's
	// Block device, a copy): lvm2 refuses to deactivate or remove it, and
	// lvrename does not check.
	Open bool
	// Invalid is a snapshot whose copy-on-write area overflowed.
	Invalid bool
	// Chunk is a snapshot's chunk size in bytes (lvcreate --chunksize,
	// lvm2's default 4 KiB); copied holds the origin chunks its
	// copy-on-write area holds.
	Chunk  int64
	copied map[int64]bool
	// OriginSize is a snapshot's origin's size when it was made, the size
	// of the snapshot's device. An origin extended since takes no room in
	// the area for what is written beyond it (dm-snapshot's
	// __origin_write: "Nothing to do if writing beyond end of snapshot").
	OriginSize int64
	// extents are the group's extents the LV maps, in order.
	extents []int
}

// Device is a block device of the host.
type Device struct {
	// Data is what the device holds at its start: a test's stand-in for
	// a filesystem's or another group's blocks. pvcreate overwrites it.
	Data []byte
	// Signatures are what util-linux's probe finds on the device (what
	// wipefs lists): a filesystem ("xfs", "ext4"), a partition table
	// ("dos", "gpt"), a PV's label ("LVM2_member").
	Signatures []Signature
	// VG is the group a PV (an LVM2_member signature) belongs to, "" for
	// a PV of none.
	VG string
	// Children are the devices the kernel has on this one, as lsblk
	// lists them: its partitions, device-mapper devices.
	Children []string
	// ReadError makes every read of the device fail with an I/O error,
	// as a dying disk's do.
	ReadError bool
}

// Signature is one signature on a device: its type and where its magic
// string is, as wipefs reports them.
type Signature struct {
	Type   string
	Offset int64
}

// pvLabel is what pvcreate writes at a device's start in the fake: lvm2's
// label sector (LABELONE, in the second 512-byte sector) stands for it.
var pvLabel = append(make([]byte, 512), []byte("LABELONE\x00\x00\x00\x00\x00\x00\x00\x00LVM2 001")...)

// New returns an empty volume group of size bytes, named Name.
func New(size int64) *VG { return NewGroup(Name, size) }

// uuids numbers the groups the fake makes, for their UUIDs.
var uuids atomic.Int64

// newUUID returns a UUID no other group of the process has.
func newUUID() string { return fmt.Sprintf("fake-%06d", uuids.Add(1)) }

// NewGroup returns an empty volume group of size bytes named name.
func NewGroup(name string, size int64) *VG {
	n := size / ExtentSize
	return &VG{Size: size, Free: n * ExtentSize, LVs: map[string]*LV{}, Fail: map[string]error{}, Devices: map[string]*Device{}, UUID: newUUID(),
		name: name, data: make([][]byte, n), used: make([]bool, n), unflushed: map[int][]byte{}}
}

// NewUncreated returns a host where the volume group Name does not exist
// yet, with a blank device at device: vgcreate makes the group, of size
// bytes, on a device of Devices.
func NewUncreated(size int64, device string) *VG {
	f := New(size)
	f.missing = true
	f.Devices[device] = &Device{}
	return f
}

// GroupName returns the volume group's name.
func (f *VG) GroupName() string { return f.name }

// Exists reports whether the volume group exists (vgcreate made it, or
// the fake started with it).
func (f *VG) Exists() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return !f.missing
}

// DeviceState returns a copy of device path as it is now, nil when the
// host has none.
func (f *VG) DeviceState(path string) *Device {
	f.mu.Lock()
	defer f.mu.Unlock()
	d := f.Devices[path]
	if d == nil {
		return nil
	}
	return &Device{Data: slices.Clone(d.Data), Signatures: slices.Clone(d.Signatures), VG: d.VG,
		Children: slices.Clone(d.Children), ReadError: d.ReadError}
}

// Host is a node's lvm2 with several volume groups: it runs each command
// on the group it names (a group's name, one of its LVs, an LV's device,
// a device of the group's Devices). A command that names none answers as
// lvm2 does for a group that does not exist.
type Host []*VG

// Run implements lvm.Runner.
func (h Host) Run(ctx context.Context, name string, args ...string) (string, error) {
	for _, f := range h {
		if f.named(args) {
			return f.Run(ctx, name, args...)
		}
	}
	last := args[len(args)-1]
	return "", failed(name, args, 5, "Volume group \"%s\" not found\n  Cannot process volume group %s", last, last)
}

// named reports whether a command's arguments name the group.
func (f *VG) named(args []string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, a := range args {
		a = strings.TrimPrefix(strings.TrimPrefix(a, "if="), "of=") // dd's
		if a == f.name || strings.HasPrefix(a, f.name+"/") || strings.HasPrefix(a, "/dev/"+f.name+"/") || f.Devices[a] != nil {
			return true
		}
	}
	return false
}

// failed is a command's failure as lvm.ExecRunner reports it: its exit
// status and what it printed on standard error.
func failed(name string, args []string, status int, stderr string, a ...any) error {
	return &lvm.CommandError{Command: name + " " + strings.Join(args, " "), ExitStatus: status, Stderr: fmt.Sprintf(stderr, a...)}
}

// PowerCut loses what the disk's write cache held: every extent written
// by dd or blkdiscard and not flushed since holds what it held before.
func (f *VG) PowerCut() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for e, was := range f.unflushed {
		f.data[e] = was
	}
	clear(f.unflushed)
}

// cached notes that lv's extents are about to be written through the
// disk's write cache.
func (f *VG) cached(lv *LV) {
	for _, e := range lv.extents {
		if _, ok := f.unflushed[e]; !ok {
			f.unflushed[e] = slices.Clone(f.data[e])
		}
	}
}

// flush writes lv's extents out of the disk's write cache.
func (f *VG) flush(lv *LV) {
	for _, e := range lv.extents {
		delete(f.unflushed, e)
	}
}

// Create makes an active LV of size bytes with tags, as lvcreate does; a
// test sets up a group with it. It panics when the group has no room.
func (f *VG) Create(name string, size int64, tags ...string) *LV {
	f.mu.Lock()
	defer f.mu.Unlock()
	lv := &LV{Tags: tags}
	if !f.grow(lv, size) {
		panic(fmt.Sprintf("fakelvm: no room for %s (%d bytes) in %s", name, size, f.name))
	}
	f.LVs[name] = lv
	return lv
}

// WriteLV writes data into LV name at byte offset off, as a pod writing to
// its block device would.
func (f *VG) WriteLV(name string, off int64, data []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	lv := f.LVs[name]
	if lv == nil {
		return fmt.Errorf("fakelvm: no LV %s", name)
	}
	if off < 0 || off+int64(len(data)) > int64(len(lv.extents))*ExtentSize {
		return fmt.Errorf("fakelvm: writing %d bytes at %d beyond the end of %s", len(data), off, name)
	}
	f.copyOnWrite(name, off, int64(len(data)))
	f.write(lv, off, data)
	return nil
}

// ReadLV returns the bytes of LV name, as reading its block device would.
func (f *VG) ReadLV(name string) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	lv := f.LVs[name]
	if lv == nil {
		return nil, fmt.Errorf("fakelvm: no LV %s", name)
	}
	if lv.Invalid {
		return nil, fmt.Errorf("fakelvm: reading %s: input/output error (invalid snapshot)", name)
	}
	return f.read(lv), nil
}

// Extents returns the group's extents LV name maps, in order.
func (f *VG) Extents(name string) []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if lv := f.LVs[name]; lv != nil {
		return slices.Clone(lv.extents)
	}
	return nil
}

// Names returns the names of the group's LVs, sorted.
func (f *VG) Names() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	names := make([]string, 0, len(f.LVs))
	for n := range f.LVs {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Commands returns a copy of Calls; it may be called while commands run.
func (f *VG) Commands() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.Calls)
}

// SetFail sets Fail[key] to err, or clears it when err is nil; it may be
// called while commands run.
func (f *VG) SetFail(key string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err == nil {
		delete(f.Fail, key)
	} else {
		f.Fail[key] = err
	}
}

// SetOpen marks LV name open or closed, as a process opening or closing
// its device (a mount, a pod's Block device) would; it may be called
// while commands run.
func (f *VG) SetOpen(name string, open bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	lv := f.LVs[name]
	if lv == nil {
		return fmt.Errorf("fakelvm: no LV %s", name)
	}
	lv.Open = open
	return nil
}

// Hold makes the first command called name that runs from now on wait,
// before it runs, until resume is called; paused is closed once it waits.
// A test holds an operation there (its lvcreate, its copy) while other
// commands run. A held command whose context ends returns its error
// without running, as a process killed by exec.CommandContext would.
func (f *VG) Hold(name string) (paused <-chan struct{}, resume func()) {
	p, r := make(chan struct{}), make(chan struct{})
	var once sync.Once
	f.mu.Lock()
	defer f.mu.Unlock()
	f.before = func(ctx context.Context, command string) error {
		var err error
		if command == name {
			once.Do(func() {
				close(p)
				select {
				case <-r:
				case <-ctx.Done():
					err = fmt.Errorf("%s: signal: killed: %w", command, ctx.Err())
				}
			})
		}
		return err
	}
	return p, sync.OnceFunc(func() { close(r) })
}

// Run implements lvm.Runner. A command run with a context that has ended
// fails without running, as exec.CommandContext's does.
func (f *VG) Run(ctx context.Context, name string, args ...string) (string, error) {
	f.mu.Lock()
	before := f.before
	f.mu.Unlock()
	if before != nil {
		if err := before(ctx, name); err != nil {
			return "", err
		}
	}
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("%s: %w", name, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	call := name + " " + strings.Join(args, " ")
	f.Calls = append(f.Calls, call)
	for key, err := range f.Fail {
		if err != nil && (key == name || strings.Contains(key, " ") && strings.HasPrefix(call, key)) {
			return "", err
		}
	}
	return f.run(name, args)
}

func (f *VG) run(name string, args []string) (string, error) {
	flag := func(n string) string {
		for i, a := range args {
			if a == n && i+1 < len(args) {
				return args[i+1]
			}
		}
		return ""
	}
	has := func(n string) bool { return slices.Contains(args, n) }
	size := func() int64 {
		var n int64
		fmt.Sscanf(strings.TrimSuffix(flag("--size"), "b"), "%d", &n)
		return n
	}
	notFound := func(lvName string) error {
		return fmt.Errorf("%s: exit status 5: Failed to find logical volume \"%s/%s\"", name, f.name, lvName)
	}
	for i, a := range args {
		if (a == "--addtag" || a == "--deltag") && i+1 < len(args) && !validTag(args[i+1]) {
			return "", fmt.Errorf("%s: exit status 3: Invalid argument for %s: %s", name, a, args[i+1])
		}
	}
	last := args[len(args)-1]
	lvName := last[strings.Index(last, "/")+1:]
	lv := f.LVs[lvName]
	switch name {
	case "vgs":
		// lvm2 2.03's words and exit status, and its report, empty, on
		// standard output.
		const none = `{"report":[{"vg":[]}]}`
		if d := f.Devices[f.PV]; d != nil && d.ReadError && last == f.name {
			return none, failed(name, args, 5, "Error reading device %s at 0 length 512.\n  Volume group \"%s\" not found\n  Cannot process volume group %s", f.PV, last, last)
		}
		if last != f.name || f.missing {
			return none, failed(name, args, 5, "Volume group \"%s\" not found\n  Cannot process volume group %s", last, last)
		}
		return fmt.Sprintf(`{"report":[{"vg":[{"vg_name":%q,"vg_size":"%d","vg_free":"%d","vg_tags":%q,"vg_uuid":%q}]}]}`, f.name, f.Size, f.Free, strings.Join(f.Tags, ","), f.UUID), nil
	case "vgchange":
		if last != f.name || f.missing {
			return "", failed(name, args, 5, "Volume group \"%s\" not found\n  Cannot process volume group %s", last, last)
		}
		for i := 0; i+1 < len(args); i++ {
			switch args[i] {
			case "--addtag":
				if !slices.Contains(f.Tags, args[i+1]) {
					f.Tags = append(f.Tags, args[i+1])
				}
			case "--deltag":
				f.Tags = slices.DeleteFunc(f.Tags, func(tag string) bool { return tag == args[i+1] })
			default:
				if strings.HasPrefix(args[i], "-") {
					return "", fmt.Errorf("vgchange: the fake knows only --addtag and --deltag: %q", args)
				}
			}
		}
	case "pvcreate":
		return "", f.pvcreate(name, args, last)
	case "vgcreate":
		dev, group := last, args[len(args)-2]
		switch {
		case group != f.name:
			return "", fmt.Errorf("vgcreate: the fake makes only group %s, not %s", f.name, group)
		case !f.missing:
			return "", failed(name, args, 5, "A volume group called %s already exists.", group)
		}
		d := f.Devices[dev]
		if d == nil || !slices.ContainsFunc(d.Signatures, func(s Signature) bool { return s.Type == "LVM2_member" }) || d.VG != "" {
			// Not a PV of no group: vgcreate runs pvcreate on it first.
			if err := f.pvcreate(name, args, dev); err != nil {
				return "", err
			}
		}
		d = f.Devices[dev]
		d.VG, f.PV, f.missing, f.UUID = group, dev, false, newUUID()
		for i, a := range args {
			if a == "--addtag" {
				f.Tags = append(f.Tags, args[i+1])
			}
		}
	case "wipefs":
		// Only listing: the backend never wipes a device.
		if !has("--no-act") && !has("-n") || !has("--json") {
			return "", fmt.Errorf("wipefs: the fake only lists signatures, with --no-act --json: %q", args)
		}
		d := f.Devices[last]
		switch {
		case d == nil:
			return "", failed(name, args, 1, "wipefs: error: %s: probing initialization failed: No such file or directory", last)
		case d.ReadError:
			return "", failed(name, args, 1, "wipefs: error: %s: probing initialization failed: Input/output error", last)
		}
		type sig struct {
			Device string  `json:"device"`
			Offset string  `json:"offset"`
			Type   string  `json:"type"`
			UUID   *string `json:"uuid"`
			Label  *string `json:"label"`
		}
		out := struct {
			Signatures []sig `json:"signatures"`
		}{Signatures: []sig{}}
		for _, s := range d.Signatures {
			out.Signatures = append(out.Signatures, sig{Device: path.Base(last), Offset: fmt.Sprintf("0x%x", s.Offset), Type: s.Type})
		}
		b, _ := json.MarshalIndent(out, "", "   ")
		return string(b) + "\n", nil
	case "lsblk":
		d := f.Devices[last]
		if d == nil {
			return "", failed(name, args, 32, "lsblk: %s: not a block device", last)
		}
		type dev struct {
			Name     string `json:"name"`
			Type     string `json:"type"`
			Children []dev  `json:"children,omitempty"`
		}
		top := dev{Name: path.Base(last), Type: "disk"}
		for _, c := range d.Children {
			top.Children = append(top.Children, dev{Name: c, Type: "part"})
		}
		b, _ := json.MarshalIndent(map[string][]dev{"blockdevices": {top}}, "", "   ")
		return string(b) + "\n", nil
	case "lvs":
		var rows []string
		for n, lv := range f.LVs {
			rows = append(rows, fmt.Sprintf(`{"lv_name":%q,"lv_size":"%d","lv_tags":%q,"lv_time":"2026-11-29 23:40:01 +0000","origin":%q,"lv_attr":%q,"vg_uuid":%q}`,
				n, lv.Size, strings.Join(lv.Tags, ","), lv.Origin, f.attr(n, lv), f.UUID))
		}
		return `{"report":[{"lv":[` + strings.Join(rows, ",") + `]}]}`, nil
	case "lvcreate":
		newName := flag("--name")
		if f.LVs[newName] != nil {
			return "", fmt.Errorf("lvcreate: exit status 5: Logical Volume %q already exists in volume group %q", newName, f.name)
		}
		lv := &LV{}
		if snap := flag("--snapshot"); snap != "" {
			lv.Origin, lv.Chunk, lv.copied = snap[strings.Index(snap, "/")+1:], 4<<10, map[int64]bool{}
			if c := flag("--chunksize"); c != "" {
				if _, err := fmt.Sscanf(c, "%dk", &lv.Chunk); err != nil {
					return "", fmt.Errorf("lvcreate: the fake reads --chunksize in k only: %q", c)
				}
				lv.Chunk <<= 10
			}
			if f.LVs[lv.Origin] == nil {
				//lint:ignore ST1005 lvm2's own message, which the backend parses
				return "", fmt.Errorf("lvcreate: exit status 5: Snapshot origin LV %s not found in Volume group %s.", lv.Origin, f.name)
			}
			lv.OriginSize = f.LVs[lv.Origin].Size
		}
		want := size()
		if lv.Origin != "" {
			// lvm2 trims a snapshot to what a copy of every origin chunk
			// needs ("Reducing COW size ... down to maximum usable size").
			want = min(want, f.cowMax(lv))
		}
		if !f.grow(lv, want) {
			//lint:ignore ST1005 lvm2's own message, which the backend parses
			return "", fmt.Errorf("lvcreate: exit status 5: Volume group %q has insufficient free space (%d extents): %d required.", f.name, f.freeExtents(), extents(want))
		}
		for i, a := range args {
			if a == "--addtag" {
				lv.Tags = append(lv.Tags, args[i+1])
			}
		}
		if lv.Origin != "" {
			// What the copy-on-write area holds once the origin is written.
			data := f.read(f.LVs[lv.Origin])
			f.write(lv, 0, data[:min(int64(len(data)), lv.Size)])
		}
		f.LVs[newName] = lv
	case "dd":
		// The copy from one LV to another: both must be active.
		var from, to *LV
		var toName string
		for _, a := range args {
			op, dev, _ := strings.Cut(a, "=")
			if op != "if" && op != "of" {
				continue
			}
			v := f.LVs[path.Base(dev)]
			if v == nil || v.Inactive {
				return "", fmt.Errorf("dd: failed to open '%s': No such file or directory", dev)
			}
			if op == "if" && v.Invalid {
				return "", fmt.Errorf("dd: error reading '%s': Input/output error", dev)
			}
			if op == "of" && v.ReadOnly {
				return "", fmt.Errorf("dd: failed to open '%s': Operation not permitted", dev)
			}
			if op == "if" {
				from = v
			} else {
				to, toName = v, path.Base(dev)
			}
		}
		if from != nil && to != nil {
			data := f.read(from)
			n := min(int64(len(data)), to.Size)
			f.copyOnWrite(toName, 0, n)
			f.cached(to)
			f.write(to, 0, data[:n])
			if slices.ContainsFunc(args, func(a string) bool {
				conv, ok := strings.CutPrefix(a, "conv=")
				return ok && slices.Contains(strings.Split(conv, ","), "fsync")
			}) {
				f.flush(to)
			}
		}
	case "blkdiscard":
		// Only --zeroout is sure to zero; what a plain discard leaves
		// depends on the device, so the fake leaves the data.
		v := f.LVs[path.Base(last)]
		if v == nil || v.Inactive || path.Dir(last) != "/dev/"+f.name {
			return "", fmt.Errorf("blkdiscard: cannot open %s: No such file or directory", last)
		}
		if v.ReadOnly {
			return "", fmt.Errorf("blkdiscard: cannot open %s: Operation not permitted", last)
		}
		if has("--zeroout") || has("-z") {
			f.copyOnWrite(path.Base(last), 0, v.Size)
			f.cached(v)
			for _, e := range v.extents {
				f.data[e] = nil
			}
		}
	case "sync":
		// coreutils' sync FILE: fsync, which flushes a block device's
		// write cache.
		for _, dev := range args {
			v := f.LVs[path.Base(dev)]
			if v == nil || v.Inactive || path.Dir(dev) != "/dev/"+f.name {
				return "", fmt.Errorf("sync: error opening '%s': No such file or directory", dev)
			}
			f.flush(v)
		}
	case "blockdev":
		v := f.LVs[path.Base(last)]
		if v == nil || v.Inactive || path.Dir(last) != "/dev/"+f.name {
			return "", fmt.Errorf("blockdev: cannot open %s: No such file or directory", last)
		}
		switch {
		case has("--setro"):
			v.ReadOnly = true
		case has("--setrw"):
			v.ReadOnly = false
		}
	case "lvrename":
		from, to := args[len(args)-2], lvName
		from = from[strings.Index(from, "/")+1:]
		v := f.LVs[from]
		if v == nil {
			return "", fmt.Errorf("lvrename: exit status 5: Existing logical volume \"%s\" not found in volume group \"%s\"", from, f.name)
		}
		if lv != nil {
			return "", fmt.Errorf("lvrename: exit status 5: Logical Volume \"%s\" already exists in volume group \"%s\"", to, f.name)
		}
		delete(f.LVs, from)
		f.LVs[to] = v
		for _, s := range f.LVs {
			if s.Origin == from {
				s.Origin = to
			}
		}
	case "lvconvert", "lvchange", "lvextend", "lvremove":
		if lv == nil {
			return "", notFound(lvName)
		}
		switch name {
		case "lvconvert":
			if !has("--splitsnapshot") {
				return "", fmt.Errorf("lvconvert: the fake knows only --splitsnapshot: %q", args)
			}
			if lv.Origin == "" {
				//lint:ignore ST1005 lvm2's own message, which the backend parses
				return "", fmt.Errorf("lvconvert: exit status 5: %s/%s is not a snapshot.", f.name, lvName)
			}
			if !lv.Inactive && !has("--yes") {
				// lvm2 asks first, and reads no answer from a driver.
				//lint:ignore ST1005 lvm2's own message, which the backend parses
				return "", fmt.Errorf("lvconvert: exit status 5: Do you really want to split off active logical volume %s/%s? [y/n]: [n]\n  Logical volume %s/%s not split.", f.name, lvName, f.name, lvName)
			}
			// The split-off LV keeps the copy-on-write extents as they are.
			lv.Origin = ""
		case "lvchange":
			for i := 0; i+1 < len(args); i++ {
				switch args[i] {
				case "--deltag":
					lv.Tags = slices.DeleteFunc(lv.Tags, func(tag string) bool { return tag == args[i+1] })
				case "--addtag":
					lv.Tags = append(lv.Tags, args[i+1])
				case "--activate":
					if args[i+1] == "n" && lv.Open {
						//lint:ignore ST1005 lvm2's own message, which the backend parses
						return "", fmt.Errorf("lvchange: exit status 5: Logical volume %s/%s in use.", f.name, lvName)
					}
					lv.Inactive = args[i+1] == "n"
					lv.ReadOnly = lv.ReadOnly && !lv.Inactive
				}
			}
		case "lvextend":
			want := size()
			if lv.Origin != "" {
				// As lvcreate, lvm2 trims a snapshot to its bound ("Reached
				// maximum COW size"), and refuses a size that is no change.
				want = min(want, f.cowMax(lv))
				if extents(want) <= len(lv.extents) {
					//lint:ignore ST1005 lvm2's own message
					return "", fmt.Errorf("lvextend: exit status 5: New size (%d extents) matches existing size (%d extents).", len(lv.extents), len(lv.extents))
				}
			}
			if !f.grow(lv, want) {
				//lint:ignore ST1005 lvm2's own message, which the backend parses
				return "", fmt.Errorf("Insufficient free space: %d extents needed, but only %d available", extents(want)-len(lv.extents), f.freeExtents())
			}
		case "lvremove":
			if lv.Open {
				//lint:ignore ST1005 lvm2's own message, which the backend parses
				return "", fmt.Errorf("lvremove: exit status 5: Logical volume %s/%s contains a filesystem in use.", f.name, lvName)
			}
			// With --yes lvm2 removes an origin's snapshots with it.
			var gone []string
			for n, s := range f.LVs {
				if s.Origin == lvName {
					gone = append(gone, n)
				}
			}
			sort.Strings(gone)
			for _, n := range append(gone, lvName) {
				f.release(f.LVs[n])
				delete(f.LVs, n)
			}
		}
	}
	return "", nil
}

// pvcreate makes device dev a PV, for the command name (pvcreate, or a
// vgcreate on a device that is not a PV yet) as lvm2 2.03 does: a
// partitioned device is refused; a PV of a group needs -ff; any other
// signature is wiped only with --yes, and without it lvm2 asks, reads no
// answer from a driver, and refuses. The label then replaces what the
// device held at its start.
func (f *VG) pvcreate(name string, args []string, dev string) error {
	d := f.Devices[dev]
	switch {
	case d == nil:
		return failed(name, args, 5, "No device found for %s.", dev)
	case d.ReadError:
		return failed(name, args, 5, "Error reading device %s at 0 length 512.", dev)
	case len(d.Children) > 0 || slices.ContainsFunc(d.Signatures, func(s Signature) bool { return s.Type == "dos" || s.Type == "gpt" }):
		return failed(name, args, 5, "Cannot use %s: device is partitioned", dev)
	}
	force := slices.Contains(args, "-ff") || len(slices.DeleteFunc(slices.Clone(args), func(a string) bool { return a != "--force" && a != "-f" })) >= 2
	yes := slices.Contains(args, "--yes") || slices.Contains(args, "-y")
	for _, s := range d.Signatures {
		switch {
		case s.Type == "LVM2_member" && d.VG != "" && !force:
			return failed(name, args, 5, "Can't initialize physical volume \"%s\" of volume group \"%s\" without -ff\n  %s: physical volume not initialized.", dev, d.VG, dev)
		case s.Type != "LVM2_member" && !yes:
			return failed(name, args, 5, "WARNING: %s signature detected on %s at offset %d. Wipe it? [y/n]: [n]\n  Aborted wiping of %s.\n  %d existing signature left on the device.",
				s.Type, dev, s.Offset, s.Type, len(d.Signatures))
		}
	}
	data := slices.Clone(d.Data)
	if len(data) < len(pvLabel) {
		data = append(data, make([]byte, len(pvLabel)-len(data))...)
	}
	copy(data, pvLabel)
	d.Data, d.Signatures, d.VG = data, []Signature{{Type: "LVM2_member", Offset: 0x218}}, ""
	return nil
}

// attr is LV name's lv_attr as lvs reports it: its type (o an origin, s
// a snapshot), permissions, allocation policy, fixed minor, state (a
// active, I an invalid snapshot), whether its device is open (o), target
// type (s for snapshots and origins), zeroing, health and activation
// skipping.
// maxTagLength is the longest tag lvm2 documents (lvm(8): 1024 characters
// since 2.02.78).
const maxTagLength = 1024

// validTag is lvm2's check of a tag given to --addtag or --deltag
// (validate_tag): A-Za-z0-9 and _+.-/=!:&#, at least one character. It
// also refuses what lvm(8) says a tag cannot be: longer than 1024, or
// starting with a hyphen.
func validTag(tag string) bool {
	if tag == "" || len(tag) > maxTagLength || tag[0] == '-' {
		return false
	}
	for _, c := range tag {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.ContainsRune("_+.-/=!:&#", c)) {
			return false
		}
	}
	return true
}

func (f *VG) attr(name string, lv *LV) string {
	a := []byte("-wi-------")
	if lv.Origin != "" {
		a[0], a[6] = 's', 's'
	}
	for _, s := range f.LVs {
		if s.Origin == name {
			a[0], a[6] = 'o', 's'
		}
	}
	if !lv.Inactive {
		a[4] = 'a'
		if lv.Invalid {
			a[4] = 'I'
		}
		if lv.Open {
			a[5] = 'o'
		}
	}
	return string(a)
}

// copyOnWrite is what dm-snapshot does before n bytes at off of LV origin
// are written: each snapshot of it that does not hold those chunks yet
// takes a data chunk for each in its copy-on-write area, and turns invalid
// when the area, with the header and the metadata chunks indexing the data
// chunks, cannot hold them. Chunks beyond the snapshot's own size (an
// origin extended since it was made) are not copied. (The data itself is
// already in the snapshot's extents: see the package comment.)
func (f *VG) copyOnWrite(origin string, off, n int64) {
	for _, s := range f.LVs {
		if s.Origin != origin || s.Invalid || n <= 0 || off >= s.OriginSize {
			continue
		}
		for c := off / s.Chunk; c <= (min(off+n, s.OriginSize)-1)/s.Chunk; c++ {
			s.copied[c] = true
		}
		if cowBytes(int64(len(s.copied)), s.Chunk) > s.Size {
			s.Invalid = true
		}
	}
}

// cowMax is lvm2's bound for snapshot lv's area, what a copy of every
// chunk of its origin needs, in whole extents (cow_max_extents on a kernel
// that does not leak chunks).
func (f *VG) cowMax(lv *LV) int64 {
	origin := f.LVs[lv.Origin].Size
	return int64(extents(cowBytes((origin+lv.Chunk-1)/lv.Chunk, lv.Chunk))) * ExtentSize
}

// cowBytes is what a copy-on-write area of chunk-byte chunks needs to hold
// n data chunks: the header, the data chunks, the metadata chunks indexing
// them (chunk/16 each) and the next one, zeroed as soon as one is full.
func cowBytes(n, chunk int64) int64 {
	return (1 + n + n/(chunk/16) + 1) * chunk
}

// extents is the number of extents size bytes take, rounded up.
func extents(size int64) int {
	return int((size + ExtentSize - 1) / ExtentSize)
}

func (f *VG) freeExtents() int {
	n := 0
	for _, u := range f.used {
		if !u {
			n++
		}
	}
	return n
}

// grow gives lv the lowest free extents until it holds size bytes, leaving
// what they hold. It is false, and lv unchanged, when there are too few.
func (f *VG) grow(lv *LV, size int64) bool {
	need := extents(size) - len(lv.extents)
	if need > f.freeExtents() {
		return false
	}
	for e := 0; need > 0; e++ {
		if !f.used[e] {
			f.used[e] = true
			lv.extents = append(lv.extents, e)
			need--
		}
	}
	lv.Size = max(lv.Size, int64(len(lv.extents))*ExtentSize)
	f.Free = int64(f.freeExtents()) * ExtentSize
	return true
}

// release frees lv's extents without zeroing them, as lvremove does.
func (f *VG) release(lv *LV) {
	for _, e := range lv.extents {
		f.used[e] = false
	}
	lv.extents = nil
	f.Free = int64(f.freeExtents()) * ExtentSize
}

func (f *VG) read(lv *LV) []byte {
	out := make([]byte, int64(len(lv.extents))*ExtentSize)
	for i, e := range lv.extents {
		if f.data[e] != nil {
			copy(out[int64(i)*ExtentSize:], f.data[e])
		}
	}
	return out
}

func (f *VG) write(lv *LV, off int64, data []byte) {
	for len(data) > 0 {
		e, at := lv.extents[off/ExtentSize], off%ExtentSize
		if f.data[e] == nil {
			f.data[e] = make([]byte, ExtentSize)
		}
		n := copy(f.data[e][at:], data)
		data, off = data[n:], off+int64(n)
	}
}
