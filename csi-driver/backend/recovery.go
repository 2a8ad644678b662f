package backend

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/klog/v2"

	"github.com/diskfit/diskfit/csi-driver/loop"
)

// recover removes temporary records, data files without a record, and
// everything whose record is not "ready": a creation that did not finish
// is undone rather than finished, because the caller never got an answer
// and will retry.
func (f *File) recover(ctx context.Context, dir string) error {
	logger := klog.FromContext(ctx)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("reading %s: %w", dir, err)
	}
	for _, e := range entries {
		name := e.Name()
		if strings.Contains(name, tmpInfix) {
			if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("removing stale temporary file: %w", err)
			}
			continue
		}
		key, ok := strings.CutSuffix(name, metaSuffix)
		if !ok {
			if key, ok := strings.CutSuffix(name, dataSuffix); ok {
				if _, err := os.Stat(filepath.Join(dir, key+metaSuffix)); errors.Is(err, fs.ErrNotExist) {
					logger.Info("Removing data file without a record", "file", filepath.Join(dir, name))
					if _, err := removeFile(filepath.Join(dir, name)); err != nil {
						return err
					}
				}
			}
			continue
		}
		var rec struct {
			State     State `json:"state"`
			SizeBytes int64 `json:"sizeBytes"`
		}
		record := filepath.Join(dir, name)
		err := readJSON(record, &rec)
		switch {
		case err != nil:
			// No crash leaves a record that does not read or decode: every
			// record is fsynced before it is renamed into place. So this is
			// an I/O error or damage, which says nothing about the volume:
			// it may be complete and hold data. Keep everything; the disk
			// stays unavailable, with this reason, until the record is
			// readable again (or removed by hand).
			return fmt.Errorf("cannot tell whether %s is complete, keeping every file of the disk: %w", record, err)
		case rec.State == StateReady:
			// Only an expansion grows a data file after it is made, and
			// only volumes are expanded: a snapshot larger than its record
			// holds what it copied and is never cut.
			if dir == f.volumes {
				if err := cutBack(ctx, f.loopFile(key), rec.SizeBytes); err != nil {
					return err
				}
			}
			continue
		}
		logger.Info("Rolling back interrupted operation", "record", record, "state", rec.State)
		if err := f.removePair(ctx, dir, key); err != nil {
			return err
		}
	}
	return nil
}

// cutBack truncates a data file larger than its record to the recorded
// size. Only an expansion interrupted between growing the file and
// recording the new size leaves one (a failed one cuts back itself), and
// giving the space back keeps the disk's free space what the records say.
// A retried expansion grows the file again.
//
// A loop device refreshed past the recorded size may hold a filesystem
// grown into the extra space (the record was lost after the device saw the
// new size), so a file attached to such a device is never cut: truncating
// under a live filesystem would destroy what it wrote there.
func cutBack(ctx context.Context, file loop.File, size int64) error {
	logger := klog.FromContext(ctx)
	path := file.Path
	st, err := os.Lstat(path)
	if err != nil || !st.Mode().IsRegular() || st.Size() <= size {
		return nil
	}
	devs, err := loop.FindAll(ctx, file)
	if err != nil {
		return fmt.Errorf("looking for loop devices of %s: %w", path, err)
	}
	for _, dev := range devs {
		devBytes, err := loopSize(dev)
		if err != nil {
			return err
		}
		if devBytes > size {
			logger.Info("Keeping a data file larger than its record: its loop device already has the larger size",
				"file", path, "fileBytes", st.Size(), "recordBytes", size, "device", dev, "deviceBytes", devBytes)
			return nil
		}
	}
	logger.Info("Cutting back a data file grown by an interrupted expansion", "file", path, "from", st.Size(), "to", size)
	if err := os.Truncate(path, size); err != nil {
		return fmt.Errorf("cutting %s back to %d bytes: %w", path, size, err)
	}
	return nil
}
