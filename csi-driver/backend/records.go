package backend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/diskfit/diskfit/csi-driver/fault"
)

// The file backend's records. A disk's filesystem holds
// <path>/diskfit/volumes/<key>.json (the record) and <key>.img (the data),
// the same under snapshots/. A record is written only once its data file
// is complete (synced with it), a deletion removes it before the data, and
// it is only ever replaced atomically (writeJSONAtomic). Whatever a crash
// interrupts therefore leaves a data file without a record, a data file
// larger than its record, or (from an older driver, which wrote one
// before the data file) a record that is not ready, and Start puts each
// right (recovery.go). The backend serving the disk holds a lock on
// <path>/diskfit itself (lockDisk).

const (
	stateDirName    = "diskfit"
	volumesDirName  = "volumes"
	snapshotDirName = "snapshots"
	diskRecordName  = "disk.json"
	metaSuffix      = ".json"
	dataSuffix      = ".img"
	tmpInfix        = ".tmp-"
)

// diskRecord, <path>/diskfit/disk.json, names the disk whose volumes and
// snapshots the state directory holds. Their IDs carry the disk's name,
// and a disk is whatever filesystem is mounted at its path: two disks
// mounted at each other's paths (by device names, which a boot may hand
// out in another order) would otherwise serve each other's volumes under
// the wrong IDs, and answer DeleteVolume for a volume whose data is on
// the other disk as done.
type diskRecord struct {
	Name string `json:"name"`
}

// claimStateDir refuses a state directory recorded as another disk's (an
// AnotherDiskError, naming that disk), and records this disk's name in one
// that has no record yet (new, or made by an older driver). Also an empty
// one is refused: with one of two swapped disks empty, the other would
// otherwise take the empty filesystem and answer for its volumes there as
// gone. Removing the record by hand gives a filesystem to another name.
//
// A record that cannot be written (a full filesystem, one mounted
// read-only) does not stop the disk: it is served as before records
// existed, rather than its volumes made unavailable for want of a file
// that protects nothing yet, and the next creation (claimBeforeCreating)
// or start writes it.
func (f *File) claimStateDir(ctx context.Context) error {
	path := filepath.Join(f.path, stateDirName, diskRecordName)
	var rec diskRecord
	switch err := readJSON(path, &rec); {
	case err == nil && rec.Name == f.name:
		f.claimed.Store(true)
		return nil
	case err == nil:
		return &AnotherDiskError{Disk: f.name, Path: f.path, Holder: rec.Name, Record: path}
	case !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("cannot tell which disk %s is: %w", f.path, err)
	}
	if err := f.writeJSONAtomic(path, diskRecord{Name: f.name}, true, fault.Step{}); err != nil {
		klog.FromContext(ctx).Error(err, "Cannot record the disk's name in its state directory yet; the next creation tries again", "disk", f.name, "path", path)
		return nil
	}
	f.claimed.Store(true)
	return nil
}

// claimBeforeCreating claims the state directory, if Start could not, before
// a creation adds to it.
func (f *File) claimBeforeCreating(ctx context.Context) error {
	if f.claimed.Load() {
		return nil
	}
	return f.claimStateDir(ctx)
}

// readRecord reads the record of key and returns ErrNotFound unless it is
// ready and names that key: the key in a record is used to build paths, so
// a record that names another one (copied or tampered with) is not trusted.
func readRecord(path, key string, recordKey *string, v any, state *State) error {
	err := readJSON(path, v)
	if errors.Is(err, fs.ErrNotExist) {
		return ErrNotFound
	}
	if err != nil {
		return err
	}
	if *recordKey != key {
		return fmt.Errorf("%w: record %s names key %q", ErrNotFound, path, *recordKey)
	}
	if *state != StateReady {
		return fmt.Errorf("%w: record %s is %s", ErrNotFound, path, *state)
	}
	return nil
}

func readJSON(path string, v any) error {
	// Records are small; a symlink in their place is not followed.
	file, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("reading record: %w", err)
	}
	data, err := io.ReadAll(io.LimitReader(file, maxRecordBytes))
	file.Close()
	if err != nil {
		return fmt.Errorf("reading record: %w", err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("decoding record %s: %w", path, err)
	}
	return nil
}

// maxRecordBytes bounds what is read of a record; a real one is a few
// hundred bytes.
const maxRecordBytes = 64 << 10

// checkDataFile refuses a data file that is not a regular file: a symlink
// or device planted in the state directory must never be attached, grown,
// cloned or reported as a volume. A missing one is not refused here; the
// volume's health reports it.
func checkDataFile(path string) error {
	st, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("data file: %w", err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%w: data file %s is not a regular file (%s)", ErrNotFound, path, st.Mode().Type())
	}
	return nil
}

func listKeys(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", dir, err)
	}
	var keys []string
	for _, e := range entries {
		if key, ok := strings.CutSuffix(e.Name(), metaSuffix); ok && !strings.Contains(e.Name(), tmpInfix) {
			keys = append(keys, key)
		}
	}
	sort.Strings(keys)
	return keys, nil
}

// writeJSONAtomic replaces path with v's JSON: write a temporary file, fsync
// it and rename it over path, so readers (and a restarted driver) see the
// old record or the new one, never a torn one. With durable set the
// directory is synced too, so the new record survives a crash. tempWritten
// is the crash-test step between the synced temporary file and the rename.
//
// vouches are files the record vouches for (a new volume's data file, which
// its ready record says is complete): they are fsynced together with the
// temporary file, and the rename waits for every sync, so the record is
// never in place before what it vouches for is durable. Started together,
// the syncs share the filesystem's log writes instead of waiting for one
// another.
func (f *File) writeJSONAtomic(path string, v any, durable bool, tempWritten fault.Step, vouches ...*os.File) error {
	return writeJSONAtomic(path, v, durable, func() error { return f.faults.Reach(tempWritten) }, vouches...)
}

// writeJSONAtomic writes v as JSON to a temporary file beside path, syncs
// it with vouches, calls beforeRename (when not nil) and renames it to
// path; durable syncs the directory too.
func writeJSONAtomic(path string, v any, durable bool, beforeRename func() error, vouches ...*os.File) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encoding record: %w", err)
	}
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, filepath.Base(path)+tmpInfix)
	if err != nil {
		return fmt.Errorf("writing record: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("writing record: %w", err)
	}
	if err := syncAll(append([]*os.File{tmp}, vouches...)); err != nil {
		tmp.Close()
		return fmt.Errorf("syncing record: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing record: %w", err)
	}
	if beforeRename != nil {
		if err := beforeRename(); err != nil {
			return err
		}
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("renaming record: %w", err)
	}
	if !durable {
		return nil
	}
	return syncDir(dir)
}

// syncAll fsyncs files at once and returns when every sync has ended.
func syncAll(files []*os.File) error {
	errs := make([]error, len(files))
	var wg sync.WaitGroup
	for i, file := range files[1:] {
		wg.Go(func() { errs[i+1] = file.Sync() })
	}
	errs[0] = files[0].Sync()
	wg.Wait()
	return errors.Join(errs...)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("opening directory: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, syscall.EINVAL) {
		return fmt.Errorf("syncing directory %s: %w", dir, err)
	}
	return nil
}

// removeRecordFirst deletes a volume or snapshot: the record goes first
// (synced), then the data. A crash in between leaves a data file without a
// record, which Start removes; it never leaves a record claiming data that
// is gone.
func (f *File) removeRecordFirst(dir, key string, recordRemoved, dataRemoved fault.Step) error {
	defer f.cow.invalidate() // what the removed file shared is no longer shared
	if _, err := removeFile(filepath.Join(dir, key+metaSuffix)); err != nil {
		return err
	}
	if err := syncDir(dir); err != nil {
		return err
	}
	f.faults.Reach(recordRemoved)
	if _, err := removeFile(filepath.Join(dir, key+dataSuffix)); err != nil {
		return err
	}
	f.faults.Reach(dataRemoved)
	return nil
}

// clearLeftover makes way for creating key in dir: it removes what an
// earlier, failed attempt left (a leftover is replaced, not reused: its data
// file may be half-made), but never a volume or snapshot that is complete
// (ErrExists), nor one whose record cannot be read.
func (f *File) clearLeftover(ctx context.Context, dir, key string) error {
	var rec struct {
		State State `json:"state"`
	}
	record := filepath.Join(dir, key+metaSuffix)
	switch err := readJSON(record, &rec); {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return fmt.Errorf("cannot tell whether %s is complete: %w", record, err)
	case rec.State == StateReady:
		return fmt.Errorf("%s: %w", key, ErrExists)
	}
	return f.removePair(ctx, dir, key)
}

// removePair removes a data file and then its record, so that no ready
// record is ever left without its data; used to undo a creation and to
// clear the way for one. The directory is synced only when something was removed:
// removing nothing, what clearing the way for a creation usually comes
// to, changes nothing a sync could make durable.
func (f *File) removePair(_ context.Context, dir, key string) error {
	removedData, err := removeFile(filepath.Join(dir, key+dataSuffix))
	if err != nil {
		return err
	}
	removedRecord, err := removeFile(filepath.Join(dir, key+metaSuffix))
	if err != nil || !removedData && !removedRecord {
		return err
	}
	return syncDir(dir)
}

// removeFile removes path, if it exists, and reports whether it did.
func removeFile(path string) (bool, error) {
	err := os.Remove(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("removing %s: %w", path, err)
	}
	return true, nil
}
