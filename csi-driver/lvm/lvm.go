// Package lvm runs the lvm2 tools and reads their reports. It knows the
// commands and what they print, and nothing of what the LVM backend
// (csi-driver/backend) keeps in a volume group: the backend builds its own
// command lines and reads its own tags on top of this.
package lvm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Runner runs a command and returns its standard output. It is the seam
// between the LVM backend's logic and the lvm2 tools.
type Runner interface {
	Run(ctx context.Context, name string, args ...string) (string, error)
}

// ExecRunner runs commands with os/exec. The lvm2 tools it runs read no
// loop device but Device (LoopFilter).
type ExecRunner struct {
	// Device is the LVM disk's configured device, which its lvm2
	// commands read even when it is a loop device.
	Device string
}

// Run implements Runner; the error carries the command's standard error.
func (r ExecRunner) Run(ctx context.Context, name string, args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	line := name + " " + strings.Join(args, " ")
	if lvm2Commands[name] {
		args = append([]string{"--config", LoopFilter(r.Device)}, args...)
	}
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	// The driver's own descriptors (sockets, loop files) are no concern
	// of lvm's; without this every call warns about them.
	cmd.Env = append(os.Environ(), "LVM_SUPPRESS_FD_WARNINGS=1")
	if err := cmd.Run(); err != nil {
		status := -1
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			status = exit.ExitCode()
		}
		return stdout.String(), &CommandError{Command: line, ExitStatus: status,
			Stderr: strings.TrimSpace(stderr.String()), Err: err}
	}
	return stdout.String(), nil
}

// lvm2Commands are the lvm2 tools the LVM backend runs, which take
// --config.
var lvm2Commands = map[string]bool{
	"lvchange": true, "lvconvert": true, "lvcreate": true, "lvextend": true,
	"lvremove": true, "lvrename": true, "lvs": true, "pvcreate": true,
	"pvs": true, "vgchange": true, "vgcreate": true, "vgs": true,
}

// LoopFilter is the lvm2 configuration that hides every loop device from
// an lvm2 command except device, when it is one. The file backend's Block
// volumes are loop devices whose every byte a tenant writes: one that
// writes an LVM label and a volume group of a node's volume group's name
// would otherwise make lvm2 see two groups of that name and refuse the
// real one (the disk then reads as failed), or, were the real group
// missing, serve the tenant's. lvm2 accepts a device if any of its names
// (/dev/loop7, or a symlink to it) matches an "a" pattern before an "r"
// one and rejects it if every name it matches, matches "r" first; so no
// pattern accepts everything else, which would accept a loop device under
// another of its names.
func LoopFilter(device string) string {
	patterns := []string{`"r|^/dev/loop|"`}
	if resolved, err := filepath.EvalSymlinks(device); err == nil && isLoopDevice(resolved) {
		patterns = append([]string{`"a|^` + resolved + `$|"`}, patterns...)
	}
	return "devices { global_filter = [ " + strings.Join(patterns, ", ") + " ] }"
}

// isLoopDevice reports whether path is a loop device's own name
// (/dev/loopN), the only form of it that may go into a pattern unquoted.
func isLoopDevice(path string) bool {
	n, ok := strings.CutPrefix(path, "/dev/loop")
	if !ok || n == "" {
		return false
	}
	_, err := strconv.ParseUint(n, 10, 32)
	return err == nil
}

// CommandError is a command that failed: its exit status and what it
// printed on standard error, which tell lvm2's "does not exist" from its
// other failures (VGNotFound).
type CommandError struct {
	// Command is the command line.
	Command string
	// ExitStatus is the command's exit status, -1 when it did not exit
	// by itself (killed, or never started).
	ExitStatus int
	// Stderr is what the command printed on standard error.
	Stderr string
	// Err is the error the command's run ended with, if any.
	Err error
}

func (e *CommandError) Error() string {
	cause := e.Err
	if cause == nil {
		cause = fmt.Errorf("exit status %d", e.ExitStatus)
	}
	return fmt.Sprintf("%s: %v: %s", e.Command, cause, e.Stderr)
}

func (e *CommandError) Unwrap() error { return e.Err }

// DeviceMapperControl is the device the kernel's device-mapper is reached
// through; without it no logical volume can be activated.
const DeviceMapperControl = "/dev/mapper/control"

// CheckDeviceMapper returns an error saying why device-mapper is unusable
// at control, or nil.
func CheckDeviceMapper(control string) error {
	f, err := os.OpenFile(control, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("device-mapper is not available (%w): this kernel cannot activate logical volumes, so the lvm backend cannot serve volumes on this node", err)
	}
	return f.Close()
}

// DevicePath is the block device of logical volume lv of volume group vg
// once it is active.
func DevicePath(vg, lv string) string { return "/dev/" + vg + "/" + lv }

// InsufficientSpace reports whether err is lvcreate's or lvextend's
// "insufficient free space".
func InsufficientSpace(err error) bool {
	return err != nil && strings.Contains(err.Error(), "nsufficient free space")
}

// VG is a volume group's size and free space, in bytes, its tags and its
// UUID, which lvm2 gives it when it is made and keeps when it is renamed.
type VG struct {
	SizeBytes int64
	FreeBytes int64
	Tags      []string
	UUID      string
}

type vgsReport struct {
	Report []struct {
		VG []struct {
			Name string `json:"vg_name"`
			Size string `json:"vg_size"`
			Free string `json:"vg_free"`
			Tags string `json:"vg_tags"`
			UUID string `json:"vg_uuid"`
		} `json:"vg"`
	} `json:"report"`
}

// ReadVG runs vgs for the volume group vg. The bool is false when vgs
// answers without reporting it.
func ReadVG(ctx context.Context, run Runner, vg string) (VG, bool, error) {
	out, err := run.Run(ctx, "vgs", "--reportformat", "json", "--units", "b", "--nosuffix", "-o", "vg_name,vg_size,vg_free,vg_tags,vg_uuid", vg)
	if err != nil {
		return VG{}, false, err
	}
	return ParseVGs(out, vg)
}

// ParseVGs reads the volume group vg from vgs' JSON report. The bool is
// false when the report does not list it.
func ParseVGs(out, vg string) (VG, bool, error) {
	var r vgsReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		return VG{}, false, fmt.Errorf("parsing vgs output: %w", err)
	}
	for _, rep := range r.Report {
		for _, g := range rep.VG {
			if g.Name != vg {
				continue
			}
			size, err := strconv.ParseInt(g.Size, 10, 64)
			if err != nil {
				return VG{}, false, fmt.Errorf("parsing vg_size %q: %w", g.Size, err)
			}
			free, err := strconv.ParseInt(g.Free, 10, 64)
			if err != nil {
				return VG{}, false, fmt.Errorf("parsing vg_free %q: %w", g.Free, err)
			}
			v := VG{SizeBytes: size, FreeBytes: free, UUID: g.UUID}
			if g.Tags != "" {
				v.Tags = strings.Split(g.Tags, ",")
			}
			return v, true, nil
		}
	}
	return VG{}, false, nil
}

// LV is one logical volume as lvs reports it.
type LV struct {
	Name      string
	SizeBytes int64
	Tags      []string
	// Time is when the LV was created; zero when lvs gave none it reads.
	Time time.Time
	// Origin is the LV a snapshot is of, "" for other LVs.
	Origin string
	// Open is an LV whose device something holds open: a mount, a
	// process, a loop device on it (the kubelet keeps one on a Block
	// volume a pod maps). lvs reports it as "o", the sixth character of
	// lv_attr.
	Open bool
	// VGUUID is the UUID of the LV's volume group.
	VGUUID string
}

type lvsReport struct {
	Report []struct {
		LV []struct {
			Name   string `json:"lv_name"`
			Size   string `json:"lv_size"`
			Tags   string `json:"lv_tags"`
			Time   string `json:"lv_time"`
			Origin string `json:"origin"`
			Attr   string `json:"lv_attr"`
			VGUUID string `json:"vg_uuid"`
		} `json:"lv"`
	} `json:"report"`
}

// ListLVs runs lvs for the volume group vg.
func ListLVs(ctx context.Context, run Runner, vg string) ([]LV, error) {
	out, err := run.Run(ctx, "lvs", "--reportformat", "json", "--units", "b", "--nosuffix", "-o", "lv_name,lv_size,lv_tags,lv_time,origin,lv_attr,vg_uuid", vg)
	if err != nil {
		return nil, err
	}
	return ParseLVs(out)
}

// ParseLVs decodes lvs' JSON report, sorted by name.
func ParseLVs(out string) ([]LV, error) {
	var r lvsReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		return nil, fmt.Errorf("parsing lvs output: %w", err)
	}
	var lvs []LV
	for _, rep := range r.Report {
		for _, raw := range rep.LV {
			size, err := strconv.ParseInt(raw.Size, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("parsing lv_size %q of %s: %w", raw.Size, raw.Name, err)
			}
			v := LV{Name: raw.Name, SizeBytes: size, Origin: raw.Origin, Open: len(raw.Attr) > 5 && raw.Attr[5] == 'o', VGUUID: raw.VGUUID}
			if raw.Tags != "" {
				v.Tags = strings.Split(raw.Tags, ",")
			}
			// lv_time looks like "2026-11-29 23:40:01 +0000".
			v.Time, _ = time.Parse("2006-01-02 15:04:05 -0700", raw.Time)
			lvs = append(lvs, v)
		}
	}
	sort.Slice(lvs, func(i, j int) bool { return lvs[i].Name < lvs[j].Name })
	return lvs, nil
}

// VGNotFound reports whether err is lvm2's answer that volume group vg
// does not exist: exit status 5 (ECMD_FAILED) with nothing on standard
// error but
//
//	Volume group "vg" not found
//	Cannot process volume group vg
//
// (lvm2 2.03). Any other words (a device it could not read, two groups of
// the name, a warning) or exit status, or a command killed, leave it
// unknown whether the group exists: a group whose disk failed a read is
// also "not found", and says so after the read error.
func VGNotFound(err error, vg string) bool {
	var cmd *CommandError
	if !errors.As(err, &cmd) || cmd.ExitStatus != 5 {
		return false
	}
	notFound := false
	for _, line := range strings.Split(cmd.Stderr, "\n") {
		switch strings.TrimSpace(line) {
		case "":
		case `Volume group "` + vg + `" not found`:
			notFound = true
		case "Cannot process volume group " + vg:
		default:
			return false
		}
	}
	return notFound
}

// DuplicateVG reports whether err is lvm2's refusal of a volume group it
// finds more than once under its name ("Multiple VGs found with the same
// name", lvm2 2.03).
func DuplicateVG(err error) bool {
	var cmd *CommandError
	return errors.As(err, &cmd) && strings.Contains(cmd.Stderr, "Multiple VGs found with the same name")
}

// Signature is one signature util-linux finds on a device: a filesystem,
// a partition table, a PV's label, a RAID member.
type Signature struct {
	Type   string `json:"type"`
	Offset string `json:"offset"`
}

func (s Signature) String() string { return s.Type + " signature at offset " + s.Offset }

// Signatures lists every signature on device, as wipefs finds them
// (--no-act: it only reads). A device it cannot read is an error.
func Signatures(ctx context.Context, run Runner, device string) ([]Signature, error) {
	out, err := run.Run(ctx, "wipefs", "--no-act", "--json", device)
	if err != nil {
		return nil, err
	}
	var r struct {
		Signatures []Signature `json:"signatures"`
	}
	// No output at all is no signature either.
	if strings.TrimSpace(out) == "" {
		return nil, nil
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		return nil, fmt.Errorf("parsing wipefs output: %w", err)
	}
	return r.Signatures, nil
}

// Children lists the devices the kernel has on device, as lsblk shows
// them below it: its partitions, and device-mapper or md devices made of
// it.
func Children(ctx context.Context, run Runner, device string) ([]string, error) {
	out, err := run.Run(ctx, "lsblk", "--json", "--output", "NAME,TYPE", device)
	if err != nil {
		return nil, err
	}
	type blockdev struct {
		Name     string     `json:"name"`
		Type     string     `json:"type"`
		Children []blockdev `json:"children"`
	}
	var r struct {
		Blockdevices []blockdev `json:"blockdevices"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		return nil, fmt.Errorf("parsing lsblk output: %w", err)
	}
	var names []string
	for _, d := range r.Blockdevices {
		for _, c := range d.Children {
			names = append(names, c.Name+" ("+c.Type+")")
		}
	}
	return names, nil
}
