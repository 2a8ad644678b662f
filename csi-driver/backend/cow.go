package backend

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Copy-on-write space. Snapshots and clones are reflink copies: they share
// their source's written extents and take no space when made, but each
// later overwrite of a shared fileExtent, by any of the files sharing it,
// needs new blocks. A disk that handed that space out would fail the
// writes of a volume with I/O errors inside its pod. So the file backend
// books it: an fileExtent shared by n data files may be rewritten by n−1 of
// them, and that is what Usage keeps back from the disk's free space.

// fileExtent is a range of a data file's blocks on the disk.
type fileExtent struct {
	physical, length int64
	shared, written  bool
}

// FIEMAP, see linux/fiemap.h.
const (
	fsIOCFiemap        = 0xC020660B
	fiemapExtentLast   = 0x1
	fiemapExtentUnwrit = 0x800
	fiemapExtentShared = 0x2000
	fiemapBatch        = 128
)

type fiemapHeader struct {
	start, length                uint64
	flags, mapped, count, unused uint32
}

type fiemapExtent struct {
	logical, physical, length uint64
	reserved64                [2]uint64
	flags                     uint32
	reserved                  [3]uint32
}

// extentsOf returns the extents of the file at path.
func extentsOf(path string) ([]fileExtent, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	var out []fileExtent
	buf := make([]byte, int(unsafe.Sizeof(fiemapHeader{}))+fiemapBatch*int(unsafe.Sizeof(fiemapExtent{})))
	var start uint64
	for {
		clear(buf)
		h := (*fiemapHeader)(unsafe.Pointer(&buf[0]))
		h.start, h.length, h.count = start, ^uint64(0), fiemapBatch
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), fsIOCFiemap, uintptr(unsafe.Pointer(&buf[0]))); errno != 0 {
			return nil, fmt.Errorf("mapping the extents of %s: %w", path, errno)
		}
		if h.mapped == 0 {
			return out, nil
		}
		exts := unsafe.Slice((*fiemapExtent)(unsafe.Pointer(&buf[unsafe.Sizeof(fiemapHeader{})])), h.mapped)
		for _, e := range exts {
			out = append(out, fileExtent{physical: int64(e.physical), length: int64(e.length),
				shared: e.flags&fiemapExtentShared != 0, written: e.flags&fiemapExtentUnwrit == 0})
		}
		last := exts[len(exts)-1]
		if last.flags&fiemapExtentLast != 0 {
			return out, nil
		}
		start = last.logical + last.length
	}
}

// writtenBytes is how much of the file at path holds data: what a reflink
// copy of it shares.
func writtenBytes(path string) (int64, error) {
	exts, err := extentsOf(path)
	var n int64
	for _, e := range exts {
		if e.written {
			n += e.length
		}
	}
	return n, err
}

// cowBytes is what copy-on-write may still take from the disk: over every
// data file of the state directories, the shared extents' lengths added up,
// less the length of the disk ranges they cover (each shared range counted
// once: one of its sharers may rewrite it in place).
func (f *File) cowBytes() (int64, error) {
	var shared []fileExtent
	for _, dir := range []string{f.volumes, f.snapshots} {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return 0, fmt.Errorf("reading %s: %w", dir, err)
		}
		for _, e := range entries {
			if !strings.HasSuffix(e.Name(), dataSuffix) || !e.Type().IsRegular() {
				continue
			}
			exts, err := extentsOf(filepath.Join(dir, e.Name()))
			if errors.Is(err, fs.ErrNotExist) {
				continue // deleted meanwhile
			}
			if err != nil {
				return 0, err
			}
			for _, x := range exts {
				if x.shared {
					shared = append(shared, x)
				}
			}
		}
	}
	var total, covered, end int64
	slices.SortFunc(shared, func(a, b fileExtent) int { return cmp.Compare(a.physical, b.physical) })
	for _, x := range shared {
		total += x.length
		from, to := max(x.physical, end), x.physical+x.length
		if to > from {
			covered += to - from
			end = to
		}
	}
	return total - covered, nil
}
