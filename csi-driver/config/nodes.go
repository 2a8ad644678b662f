package config

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/mount-utils"
	"sigs.k8s.io/yaml"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
)

// ErrNoSection: no section of the file selects the node and the file has
// no top-level disks or discover to fall back to.
var ErrNoSection = errors.New("no section of the node config selects this node")

// File is the node config file: the disks of every node of the cluster.
// The top-level maxVolumes, disks and discover are the default; a section
// of nodes replaces disks and discover for the nodes it selects.
type File struct {
	// MaxVolumes caps the volumes a node takes; 0 means no limit. A
	// section's own maxVolumes replaces it.
	MaxVolumes int64 `json:"maxVolumes,omitempty"`
	// Disks are the default disks, for nodes no section selects.
	Disks []Disk `json:"disks,omitempty"`
	// Discover finds the default disks among the mounted filesystems.
	Discover *Discover `json:"discover,omitempty"`
	// Nodes are sections for groups of nodes; the first one that selects
	// a node is that node's config.
	Nodes []Section `json:"nodes,omitempty"`
}

// Section is the config of the nodes it selects.
type Section struct {
	// NodeNames selects nodes by name.
	NodeNames []string `json:"nodeNames,omitempty"`
	// NodeSelector selects nodes by label. With NodeNames as well, a node
	// must be named and match the selector.
	NodeSelector *metav1.LabelSelector `json:"nodeSelector,omitempty"`
	// MaxVolumes replaces the top-level maxVolumes when set.
	MaxVolumes *int64 `json:"maxVolumes,omitempty"`
	// Disks are the selected nodes' disks.
	Disks []Disk `json:"disks,omitempty"`
	// Discover finds the selected nodes' disks among the mounted
	// filesystems.
	Discover *Discover `json:"discover,omitempty"`
}

// Discover makes a file disk of every filesystem mounted directly below
// Path, named after its directory.
type Discover struct {
	// Path is the directory the disks are mounted below, e.g. /mnt/disks.
	Path string `json:"path"`
	// Backend is file, the only one discovery can find.
	Backend v1alpha1.Backend `json:"backend,omitempty"`
	// DeviceClass is the device class of a disk without DeviceClassFile.
	DeviceClass string `json:"deviceClass,omitempty"`
	// DeviceClassFile names a file at the top of a mounted filesystem
	// holding that disk's device class, e.g. .diskfit-device-class.
	DeviceClassFile string `json:"deviceClassFile,omitempty"`
	// Reserved is every discovered disk's headroom.
	Reserved *resource.Quantity `json:"reserved,omitempty"`
}

// Decode decodes a node config file strictly (unknown and duplicate keys
// are errors) and checks what does not depend on the node: selectors,
// discover settings and disk names in every section. The rest is checked
// by Resolve, on the node.
func Decode(data []byte) (*File, error) {
	var f File
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		return nil, fmt.Errorf("decoding: %w", err)
	}
	var errs []error
	errs = append(errs, checkNames("", f.Disks)...)
	if f.Discover != nil {
		errs = append(errs, f.Discover.check("discover")...)
	}
	for i := range f.Nodes {
		s := &f.Nodes[i]
		at := fmt.Sprintf("nodes[%d]", i)
		if len(s.NodeNames) == 0 && s.NodeSelector == nil {
			errs = append(errs, fmt.Errorf("%s: needs nodeNames or nodeSelector", at))
		}
		if len(s.Disks) == 0 && s.Discover == nil {
			errs = append(errs, fmt.Errorf("%s: needs disks or discover", at))
		}
		if s.NodeSelector != nil {
			if _, err := metav1.LabelSelectorAsSelector(s.NodeSelector); err != nil {
				errs = append(errs, fmt.Errorf("%s.nodeSelector: %w", at, err))
			}
		}
		if s.MaxVolumes != nil && *s.MaxVolumes < 0 {
			errs = append(errs, fmt.Errorf("%s: maxVolumes must not be negative", at))
		}
		errs = append(errs, checkNames(at+".", s.Disks)...)
		if s.Discover != nil {
			errs = append(errs, s.Discover.check(at+".discover")...)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &f, nil
}

// checkNames checks the disk names of a section, which Resolve only checks
// for the section it picks.
func checkNames(at string, disks []Disk) []error {
	var errs []error
	for i := range disks {
		if err := diskfit.ValidateDiskName(disks[i].Name); err != nil {
			errs = append(errs, fmt.Errorf("%sdisks[%d]: %w", at, i, err))
		}
	}
	return errs
}

func (dc *Discover) check(at string) []error {
	var errs []error
	if !filepath.IsAbs(dc.Path) {
		errs = append(errs, fmt.Errorf("%s: path %q is not absolute", at, dc.Path))
	}
	if dc.Backend != "" && dc.Backend != v1alpha1.BackendFile {
		errs = append(errs, fmt.Errorf("%s: only the file backend can be discovered, not %q", at, dc.Backend))
	}
	if len(dc.DeviceClass) > 63 {
		errs = append(errs, fmt.Errorf("%s: deviceClass is longer than 63 characters", at))
	}
	if f := dc.DeviceClassFile; f != "" && (strings.Contains(f, "/") || f == "." || f == "..") {
		errs = append(errs, fmt.Errorf("%s: deviceClassFile %q must be a file name, without /", at, f))
	}
	if dc.Reserved != nil && dc.Reserved.Sign() < 0 {
		errs = append(errs, fmt.Errorf("%s: reserved must not be negative", at))
	}
	return errs
}

// NeedsLabels reports whether picking a section needs the node's labels.
func (f *File) NeedsLabels() bool {
	return slices.ContainsFunc(f.Nodes, func(s Section) bool { return s.NodeSelector != nil })
}

// selects reports whether the section selects the node.
func (s *Section) selects(nodeName string, nodeLabels map[string]string) bool {
	if len(s.NodeNames) > 0 && !slices.Contains(s.NodeNames, nodeName) {
		return false
	}
	if s.NodeSelector != nil {
		sel, err := metav1.LabelSelectorAsSelector(s.NodeSelector)
		if err != nil || !sel.Matches(labels.Set(nodeLabels)) {
			return false
		}
	}
	return true
}

// mountInfoPath is where discovery reads the mounted filesystems.
const mountInfoPath = "/proc/self/mountinfo"

// Resolve returns the config of one node: the first section that selects
// it, or the top level when none does, with its discovered disks, defaults
// filled and every check of Validate passed.
func (f *File) Resolve(nodeName string, nodeLabels map[string]string) (*NodeConfig, error) {
	cfg := &NodeConfig{MaxVolumes: f.MaxVolumes, Section: "top level"}
	disks, discover := f.Disks, f.Discover
	i := slices.IndexFunc(f.Nodes, func(s Section) bool { return s.selects(nodeName, nodeLabels) })
	switch {
	case i >= 0:
		s := &f.Nodes[i]
		cfg.Section = fmt.Sprintf("nodes[%d]", i)
		disks, discover = s.Disks, s.Discover
		if s.MaxVolumes != nil {
			cfg.MaxVolumes = *s.MaxVolumes
		}
	case len(f.Nodes) > 0 && len(f.Disks) == 0 && f.Discover == nil:
		return nil, fmt.Errorf("%w: node %s with labels %v, and there are no top-level disks", ErrNoSection, nodeName, nodeLabels)
	}
	cfg.Disks = slices.Clone(disks)
	cfg.Discovers = discover != nil
	if discover != nil {
		found, notes, skipped, err := discover.find(mountInfoPath, cfg.Disks)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", cfg.Section, err)
		}
		cfg.Disks = append(cfg.Disks, found...)
		cfg.Notes, cfg.Skipped = notes, skipped
	}
	if err := cfg.complete(); err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.Section, err)
	}
	return cfg, nil
}

// find returns a file disk for every filesystem mounted directly below
// dc.Path, sorted by name, except those explicit names or paths already
// have; notes say which mounts were skipped and why, and skipped which
// disks, by name, were skipped although mounted (see NodeConfig.Skipped).
func (dc *Discover) find(mountInfo string, explicit []Disk) (disks []Disk, notes []string, skipped map[string]string, err error) {
	root, err := filepath.EvalSymlinks(dc.Path)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("discover: %w", err)
	}
	infos, err := mount.ParseMountInfo(mountInfo)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("discover: reading mounts: %w", err)
	}
	taken := map[string]bool{}
	for _, d := range explicit {
		taken[d.Name] = true
		if real, err := filepath.EvalSymlinks(d.Path); err == nil && d.Path != "" {
			taken[real] = true
		}
	}
	for _, mi := range infos {
		mp := mi.MountPoint
		if filepath.Dir(mp) != root || taken[mp] {
			continue
		}
		// A mount point mounted over again is one disk.
		taken[mp] = true
		name := filepath.Base(mp)
		if taken[name] {
			continue
		}
		if err := diskfit.ValidateDiskName(name); err != nil {
			notes = append(notes, fmt.Sprintf("not a disk: %s: %v", mp, err))
			continue
		}
		class, err := dc.classOf(mp)
		if err != nil {
			notes = append(notes, fmt.Sprintf("not a disk: %s: %v", mp, err))
			// An admin's edit, not a failure; a file that cannot be
			// read may be a disk that failed.
			if errors.Is(err, errClassNotOneWord) {
				if skipped == nil {
					skipped = map[string]string{}
				}
				skipped[name] = fmt.Sprintf("mounted at %s but not served: %v", mp, err)
			}
			continue
		}
		disks = append(disks, Disk{Name: name, Backend: v1alpha1.BackendFile, DeviceClass: class, Path: mp, Reserved: dc.Reserved})
	}
	slices.SortFunc(disks, func(a, b Disk) int { return strings.Compare(a.Name, b.Name) })
	return disks, notes, skipped, nil
}

// classOf reads a discovered disk's device class from DeviceClassFile,
// DeviceClass when the file is missing.
func (dc *Discover) classOf(mountPoint string) (string, error) {
	if dc.DeviceClassFile == "" {
		return dc.DeviceClass, nil
	}
	p := filepath.Join(mountPoint, dc.DeviceClassFile)
	data, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return dc.DeviceClass, nil
	}
	if err != nil {
		return "", fmt.Errorf("device class: %w", err)
	}
	class := strings.TrimSpace(string(data))
	if class == "" || len(class) > 63 || strings.ContainsAny(class, " \t\r\n") {
		return "", fmt.Errorf("%w: device class file %s must hold one word of at most 63 characters", errClassNotOneWord, p)
	}
	return class, nil
}

// errClassNotOneWord is a device class file that was read and holds no
// device class.
var errClassNotOneWord = errors.New("malformed device class file")

// Source reads the node config file and resolves it for one node, every
// time it is asked, so that changes to the file and to the mounts below a
// discover path are both seen.
type Source struct {
	// Path is the node config file.
	Path string
	// NodeName is the node's name.
	NodeName string
	// Labels reads the node's labels. It is called only for a file with a
	// nodeSelector, and again only when the file changed or the node
	// matched no section: a node's labels are read once per config, not
	// at every reload.
	Labels func(ctx context.Context) (map[string]string, error)

	mu       sync.Mutex
	data     []byte
	labels   map[string]string
	haveLbls bool
}

// Load reads, decodes and resolves the file for the node.
func (s *Source) Load(ctx context.Context) (*NodeConfig, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	data, err := os.ReadFile(s.Path)
	if err != nil {
		return nil, fmt.Errorf("reading node config: %w", err)
	}
	f, err := Decode(data)
	if err != nil {
		return nil, fmt.Errorf("node config %s: %w", s.Path, err)
	}
	if !bytes.Equal(data, s.data) {
		s.data, s.haveLbls = data, false
	}
	if f.NeedsLabels() && !s.haveLbls {
		if s.Labels == nil {
			return nil, fmt.Errorf("node config %s selects nodes by label, and the node's labels cannot be read", s.Path)
		}
		l, err := s.Labels(ctx)
		if err != nil {
			return nil, fmt.Errorf("reading the labels of node %s: %w", s.NodeName, err)
		}
		s.labels, s.haveLbls = l, true
	}
	cfg, err := f.Resolve(s.NodeName, s.labels)
	if errors.Is(err, ErrNoSection) {
		// The node's labels may change to match one.
		s.haveLbls = false
	}
	if err != nil {
		return nil, fmt.Errorf("node config %s: %w", s.Path, err)
	}
	return cfg, nil
}
