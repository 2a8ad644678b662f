// Package config reads a node's disk configuration: which disks the diskfit
// CSI driver manages, with which backend and how much headroom to keep.
package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
)

// NodeConfig is one node's config: the node config file resolved for the
// node (see File.Resolve).
type NodeConfig struct {
	// MaxVolumes caps the volumes this node takes (NodeGetInfo's
	// max_volumes_per_node); 0 means no limit.
	MaxVolumes int64 `json:"maxVolumes,omitempty"`
	// Disks are the disks this node offers, at least one.
	Disks []Disk `json:"disks"`
	// Section names the part of the file the config comes from.
	Section string `json:"-"`
	// Notes say which mounts discovery skipped and why.
	Notes []string `json:"-"`
	// Skipped are the disks discovery found mounted, with a disk's name,
	// but did not take because their device class file, read, is not one
	// word (an admin's edit), and why: their data is there, so the volumes
	// on them are not on a failed disk. A class file that cannot be read
	// (EIO) leaves the disk out of Skipped: it may have failed.
	Skipped map[string]string `json:"-"`
	// Discovers is true when the node's disks include those discovery
	// finds among the mounted filesystems.
	Discovers bool `json:"-"`
}

// Disk is one disk of the node.
type Disk struct {
	// Name is the disk's name in PVC annotations, volume IDs and the DiskNode.
	Name string `json:"name"`
	// Backend is file (default) or lvm.
	Backend v1alpha1.Backend `json:"backend,omitempty"`
	// DeviceClass groups disks for StorageClasses (nvme, ssd, hdd).
	DeviceClass string `json:"deviceClass,omitempty"`
	// Path is the mounted filesystem that holds a file disk's volumes.
	Path string `json:"path,omitempty"`
	// VolumeGroup is an lvm disk's volume group.
	VolumeGroup string `json:"volumeGroup,omitempty"`
	// Device is the block device VolumeGroup is on: with AllowInitialize,
	// the one it is made on when it does not exist yet. The driver's lvm2
	// reads no loop device but this one (lvm.LoopFilter).
	Device string `json:"device,omitempty"`
	// AllowInitialize lets the driver make VolumeGroup on Device (vgcreate)
	// when lvm2 says the group does not exist and Device is blank (no
	// signature, no partitions); it never wipes a device. Off by default.
	AllowInitialize bool `json:"allowInitialize,omitempty"`
	// Reserved is headroom kept free on the disk and never offered to
	// volumes (filesystem metadata, snapshots' copy-on-write growth).
	Reserved *resource.Quantity `json:"reserved,omitempty"`
}

// ReservedBytes is the disk's headroom in bytes.
func (d *Disk) ReservedBytes() int64 {
	if d.Reserved == nil {
		return 0
	}
	return d.Reserved.Value()
}

var vgNameRE = regexp.MustCompile(`^[A-Za-z0-9+_.][A-Za-z0-9+_.-]{0,126}$`)

// Parse decodes data strictly (unknown keys and duplicate keys are errors)
// and resolves it for a node that no section names or selects: the
// top-level config, defaults filled and validated, including that the
// paths and devices it names exist.
func Parse(data []byte) (*NodeConfig, error) {
	f, err := Decode(data)
	if err != nil {
		return nil, err
	}
	return f.Resolve("", nil)
}

// complete fills defaults and validates the config.
func (c *NodeConfig) complete() error {
	for i := range c.Disks {
		if c.Disks[i].Backend == "" {
			c.Disks[i].Backend = v1alpha1.BackendFile
		}
	}
	return c.Validate()
}

// CheckAlongside returns an error when disk cannot be served beside the
// disks served already: the same name, overlapping paths, the same
// filesystem or the same volume group.
func CheckAlongside(served []Disk, disk Disk) error {
	c := NodeConfig{Disks: append(slices.Clone(served), disk)}
	return c.Validate()
}

// Validate checks the config and returns every problem found, joined.
func (c *NodeConfig) Validate() error {
	var errs []error
	if c.MaxVolumes < 0 {
		errs = append(errs, fmt.Errorf("maxVolumes must not be negative"))
	}
	if len(c.Disks) == 0 {
		errs = append(errs, fmt.Errorf("no disks configured"))
	}
	if len(c.Disks) > 64 {
		errs = append(errs, fmt.Errorf("%d disks configured, at most 64 are allowed", len(c.Disks)))
	}
	names := map[string]bool{}
	vgs := map[string]string{}
	var paths []resolvedPath
	for i := range c.Disks {
		d := &c.Disks[i]
		if err := diskfit.ValidateDiskName(d.Name); err != nil {
			errs = append(errs, fmt.Errorf("disks[%d]: %w", i, err))
		}
		if names[d.Name] {
			errs = append(errs, fmt.Errorf("disks[%d]: duplicate disk name %q", i, d.Name))
		}
		names[d.Name] = true
		if len(d.DeviceClass) > 63 {
			errs = append(errs, fmt.Errorf("disk %q: deviceClass is longer than 63 characters", d.Name))
		}
		if d.Reserved != nil && d.Reserved.Sign() < 0 {
			errs = append(errs, fmt.Errorf("disk %q: reserved must not be negative", d.Name))
		}
		switch d.Backend {
		case v1alpha1.BackendFile:
			p, err := validateFileDisk(d)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			paths = append(paths, p)
		case v1alpha1.BackendLVM:
			if err := validateLVMDisk(d); err != nil {
				errs = append(errs, err)
				continue
			}
			if other, ok := vgs[d.VolumeGroup]; ok {
				errs = append(errs, fmt.Errorf("disk %q: volume group %q is already used by disk %q", d.Name, d.VolumeGroup, other))
			}
			vgs[d.VolumeGroup] = d.Name
		default:
			errs = append(errs, fmt.Errorf("disk %q: unknown backend %q (want %q or %q)", d.Name, d.Backend, v1alpha1.BackendFile, v1alpha1.BackendLVM))
		}
	}
	for i := range paths {
		for j := i + 1; j < len(paths); j++ {
			switch {
			case overlaps(paths[i].real, paths[j].real):
				errs = append(errs, fmt.Errorf("disks %q and %q have overlapping paths %s and %s", paths[i].disk, paths[j].disk, paths[i].real, paths[j].real))
			case paths[i].dev == paths[j].dev:
				// Both would report the same free space, which the scheduler
				// would then count twice.
				errs = append(errs, fmt.Errorf("disks %q and %q are on the same filesystem (%s and %s)", paths[i].disk, paths[j].disk, paths[i].real, paths[j].real))
			}
		}
	}
	return errors.Join(errs...)
}

type resolvedPath struct {
	disk, real string
	dev        uint64
}

func validateFileDisk(d *Disk) (resolvedPath, error) {
	if d.VolumeGroup != "" || d.Device != "" || d.AllowInitialize {
		return resolvedPath{}, fmt.Errorf("disk %q: volumeGroup, device and allowInitialize are only for the lvm backend", d.Name)
	}
	if d.Path == "" {
		return resolvedPath{}, fmt.Errorf("disk %q: the file backend needs a path", d.Name)
	}
	if !filepath.IsAbs(d.Path) {
		return resolvedPath{}, fmt.Errorf("disk %q: path %q is not absolute", d.Name, d.Path)
	}
	real, err := filepath.EvalSymlinks(d.Path)
	if err != nil {
		return resolvedPath{}, fmt.Errorf("disk %q: path: %w", d.Name, err)
	}
	st, err := os.Stat(real)
	if err != nil {
		return resolvedPath{}, fmt.Errorf("disk %q: path: %w", d.Name, err)
	}
	if !st.IsDir() {
		return resolvedPath{}, fmt.Errorf("disk %q: path %s is not a directory", d.Name, d.Path)
	}
	var sys unix.Stat_t
	if err := unix.Stat(real, &sys); err != nil {
		return resolvedPath{}, fmt.Errorf("disk %q: path: %w", d.Name, err)
	}
	d.Path = real
	return resolvedPath{disk: d.Name, real: real, dev: sys.Dev}, nil
}

func validateLVMDisk(d *Disk) error {
	if d.Path != "" {
		return fmt.Errorf("disk %q: path is only for the file backend", d.Name)
	}
	if !vgNameRE.MatchString(d.VolumeGroup) {
		return fmt.Errorf("disk %q: the lvm backend needs a valid volumeGroup, got %q", d.Name, d.VolumeGroup)
	}
	if d.AllowInitialize && d.Device == "" {
		return fmt.Errorf("disk %q: allowInitialize needs a device", d.Name)
	}
	if d.Device != "" {
		// Only its form: the device is used, and probed, only when the
		// group does not exist (backend.LVM's Start). A device gone since
		// the group was made on it (its disk died, a boot renamed it)
		// must not keep the node's other disks from being served.
		if !filepath.IsAbs(d.Device) {
			return fmt.Errorf("disk %q: device %q is not absolute", d.Name, d.Device)
		}
	}
	return nil
}

// overlaps reports whether one cleaned absolute path contains the other.
func overlaps(a, b string) bool {
	if a == b {
		return true
	}
	within := func(child, parent string) bool {
		return strings.HasPrefix(child, strings.TrimSuffix(parent, "/")+"/")
	}
	return within(a, b) || within(b, a)
}
