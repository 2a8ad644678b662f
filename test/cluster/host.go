package cluster

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// BaseDir holds every run's files, one directory per process ID. It is short
// because unix socket paths under it must stay below 108 bytes.
const BaseDir = "/tmp/dfl"

// run executes a host command and returns its combined output in the error.
func run(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return string(out), nil
}

// DiskSpec describes one disk of a simulated node.
type DiskSpec struct {
	// Name is the disk's name in the node config and the DiskNode.
	Name string
	// SizeBytes is the size of the disk image.
	SizeBytes int64
	// FS is the filesystem on the disk: "xfs" (reflink on) or "ext4".
	FS string
	// DeviceClass is the disk's device class, may be empty.
	DeviceClass string
}

// disk is a loop-mounted filesystem image standing in for a physical disk.
type disk struct {
	DiskSpec
	image string
	loop  string
	// Path is where the filesystem is mounted.
	Path string
}

// makeDisk creates an image of spec's size, formats it and mounts it at dir/mnt.
func makeDisk(spec DiskSpec, dir string) (d *disk, err error) {
	d = &disk{DiskSpec: spec, image: filepath.Join(dir, "image"), Path: filepath.Join(dir, "mnt")}
	defer func() {
		if err != nil {
			d.remove()
		}
	}()
	if err := os.MkdirAll(d.Path, 0o755); err != nil {
		return d, err
	}
	f, err := os.Create(d.image)
	if err != nil {
		return d, err
	}
	err = f.Truncate(spec.SizeBytes)
	f.Close()
	if err != nil {
		return d, err
	}
	out, err := run("losetup", "--find", "--show", d.image)
	if err != nil {
		return d, err
	}
	d.loop = strings.TrimSpace(out)
	switch spec.FS {
	case "xfs", "":
		_, err = run("mkfs.xfs", "-q", "-f", "-m", "reflink=1", d.loop)
	case "ext4":
		_, err = run("mkfs.ext4", "-q", "-F", d.loop)
	default:
		err = fmt.Errorf("disk %s: unknown filesystem %q", spec.Name, spec.FS)
	}
	if err != nil {
		return d, err
	}
	_, err = run("mount", d.loop, d.Path)
	return d, err
}

func (d *disk) remove() {
	if mounted(d.Path) {
		_ = syscall.Unmount(d.Path, syscall.MNT_DETACH)
	}
	if d.loop != "" {
		_, _ = run("losetup", "-d", d.loop)
	}
}

func mounted(path string) bool {
	for _, m := range mountsUnder(path) {
		if m == path {
			return true
		}
	}
	return false
}

// mountsUnder lists the mount points at or below dir, deepest first.
func mountsUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var found []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMountPath(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			found = append(found, mp)
		}
	}
	sort.Slice(found, func(i, j int) bool { return len(found[i]) > len(found[j]) })
	return found
}

func unescapeMountPath(p string) string {
	if !strings.Contains(p, `\`) {
		return p
	}
	var b strings.Builder
	for i := 0; i < len(p); i++ {
		if p[i] == '\\' && i+3 < len(p) {
			if n, err := strconv.ParseUint(p[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(p[i])
	}
	return b.String()
}

// cleanHostState removes what a run left below dir: mounts (the kubelet
// bind-mounts its root onto itself, so unmount lazily and deepest first, more
// than once), loop devices whose backing file is below dir, then the files.
func cleanHostState(dir string) error {
	// Volumes' loop devices are backed by files on the disks: once a disk
	// is unmounted their backing path no longer shows under dir, so they
	// are listed first and detached after the unmounts (a device still in
	// use is then freed when its last lazy mount goes).
	loops, _ := LoopsBackedUnder(dir)
	for i := 0; i < 5; i++ {
		mps := mountsUnder(dir)
		if len(mps) == 0 {
			break
		}
		for _, mp := range mps {
			_ = syscall.Unmount(mp, syscall.MNT_DETACH)
		}
	}
	var errs []error
	more, err := LoopsBackedUnder(dir)
	if err != nil {
		errs = append(errs, err)
	}
	for _, loop := range slices.Compact(slices.Sorted(slices.Values(append(loops, more...)))) {
		if _, err := run("losetup", "-d", loop); err != nil {
			errs = append(errs, err)
		}
	}
	if left := mountsUnder(dir); len(left) > 0 {
		errs = append(errs, fmt.Errorf("mounts left under %s: %v", dir, left))
	}
	if err := os.RemoveAll(dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// LoopsBackedUnder lists loop devices whose backing file is below dir.
func LoopsBackedUnder(dir string) ([]string, error) {
	out, err := exec.Command("losetup", "--list", "--noheadings", "--output", "NAME,BACK-FILE").Output()
	if err != nil {
		return nil, fmt.Errorf("losetup --list: %w", err)
	}
	var loops []string
	for _, line := range strings.Split(string(out), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 2 {
			continue
		}
		back := strings.TrimSuffix(strings.Join(fields[1:], " "), " (deleted)")
		if strings.HasPrefix(back, dir+"/") {
			loops = append(loops, fields[0])
		}
	}
	return loops, nil
}

// SweepLeftovers cleans the directories of earlier runs whose process is gone
// (a killed test leaves mounts, loop devices and files behind).
func SweepLeftovers() error {
	entries, err := os.ReadDir(BaseDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || processAlive(pid) {
			continue
		}
		if err := cleanHostState(filepath.Join(BaseDir, e.Name())); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func processAlive(pid int) bool {
	if pid == os.Getpid() {
		return true
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
