package backend

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Copy-on-write space. Snapshots and clones are reflink copies: they share
// their source's written extents and take no space when made, but each
// later overwrite of a shared extent by a volume needs new blocks. A disk
// that handed that space out would fail the volume's writes with I/O
// errors inside its pod. So the file backend books it: every shared extent
// of a volume's data file, whoever shares it (a snapshot, a clone, a copy
// made outside diskfit), is what Usage keeps back from the disk's free
// space. Snapshots are never written, so their own extents need nothing.
// The count is conservative where two volumes share an extent (once one
// rewrites it, the other's is no longer shared).
//
// Mapping extents costs time on fragmented files (a volume with tens of
// thousands of extents takes a third of a second), so the count is cached
// for cowCacheFor and recomputed sooner when the driver itself makes or
// removes a copy. A stale count is never too small for the driver's own
// copies: rewrites only shrink it, and it is recomputed after each new one.

// cowCacheFor is how long a copy-on-write count is reused.
const cowCacheFor = 15 * time.Second

// cowCache holds the last copy-on-write count of a disk.
type cowCache struct {
	mu    sync.Mutex
	bytes int64
	at    time.Time
	stale bool
}

// invalidate makes the next count map the extents again.
func (c *cowCache) invalidate() {
	c.mu.Lock()
	c.stale = true
	c.mu.Unlock()
}

// get returns the cached count, or count's answer when it is stale.
func (c *cowCache) get(count func() (int64, error)) (int64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.stale && !c.at.IsZero() && time.Since(c.at) < cowCacheFor {
		return c.bytes, nil
	}
	n, err := count()
	if err != nil {
		return 0, err
	}
	c.bytes, c.at, c.stale = n, time.Now(), false
	return n, nil
}

// fileExtent is a range of a data file's blocks on the disk.
type fileExtent struct {
	length          int64
	shared, written bool
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
			out = append(out, fileExtent{length: int64(e.length),
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

// cowBytes is what copy-on-write may still take from the disk: the shared
// extents of every volume's data file.
func (f *File) cowBytes() (int64, error) {
	return f.cow.get(func() (int64, error) {
		entries, err := os.ReadDir(f.volumes)
		if err != nil {
			return 0, fmt.Errorf("reading %s: %w", f.volumes, err)
		}
		var n int64
		for _, e := range entries {
			if !strings.HasSuffix(e.Name(), dataSuffix) || !e.Type().IsRegular() {
				continue
			}
			exts, err := extentsOf(filepath.Join(f.volumes, e.Name()))
			if errors.Is(err, fs.ErrNotExist) {
				continue // deleted meanwhile
			}
			if err != nil {
				return 0, err
			}
			for _, x := range exts {
				if x.shared {
					n += x.length
				}
			}
		}
		return n, nil
	})
}
