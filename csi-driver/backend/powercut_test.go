package backend

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/diskfit/diskfit/csi-driver/internal/testdisk"
)

// XFS_IOC_GOINGDOWN and its flag that drops whatever the log has not yet
// written (linux/fs/xfs/libxfs/xfs_fs.h).
const (
	xfsIOCGoingDown        = 0x8004587d
	xfsGoingDownNoLogFlush = 0x2
)

// TestOperationsThatReturnedSurviveAPowerCut creates and deletes volumes
// from sixteen goroutines at once on a real XFS disk and cuts the power
// under them: the filesystem is shut down without writing its log, as
// xfstests simulate a crash, so whatever was not synced is lost. After
// the disk is mounted again (log recovery) and a new backend has started
// on it: every volume whose CreateVolume returned is there, ready, with
// its whole size allocated, unless its DeleteVolume returned too, and then
// it is gone; no record was torn (Start would fail), and no temporary
// file, record that is not ready or data file without a record is left.
// Operations cut short may have gone either way, and so may those that
// return after the cut: a directory's fsync on a shut down XFS answers
// success when the directory has nothing in the log that is not written,
// and the shutdown unpins what it drops, so an operation whose last sync
// comes just after the cut returns as if it had been made durable, which a
// real power cut never lets happen. The test cannot tell whether a data
// file is synced before its ready record: on XFS the directory's fsync
// forces the whole log, the data file's allocation with it.
// TestRecordWaitsForWhatItVouchesFor checks that order.
func TestOperationsThatReturnedSurviveAPowerCut(t *testing.T) {
	const (
		workers    = 16
		volumeSize = 16 * mi
		// The power is cut once this many creations and deletions have
		// returned, with the workers in the middle of others.
		cutAfter = 200
	)
	ctx := context.Background()
	f, p := newFile(t, "xfs", 2<<30, 0)

	type outcome struct{ created, deleteStarted, deleted bool }
	var (
		mu       sync.Mutex
		outcomes = map[string]*outcome{}
		returned int // creations and deletions
		cutting  bool
		cut      = make(chan struct{})
		cutOnce  sync.Once
	)
	note := func(key string, change func(*outcome)) {
		mu.Lock()
		defer mu.Unlock()
		if cutting {
			return // whether the power was on when it ended is unknown
		}
		o := outcomes[key]
		if o == nil {
			o = &outcome{}
			outcomes[key] = o
		}
		change(o)
		if o.deleteStarted && !o.deleted {
			return // not a return
		}
		if returned++; returned == cutAfter {
			cutOnce.Do(func() { close(cut) })
		}
	}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := 0; ; i++ {
				key := fmt.Sprintf("w%d-%d", w, i)
				if _, err := f.CreateVolume(ctx, CreateRequest{Key: key, Name: key, SizeBytes: volumeSize}); err != nil {
					return // the power is off
				}
				note(key, func(o *outcome) { o.created = true })
				if i%2 == 1 {
					continue // every other volume is kept
				}
				note(key, func(o *outcome) { o.deleteStarted = true })
				if err := f.DeleteVolume(ctx, key); err != nil {
					return
				}
				note(key, func(o *outcome) { o.deleted = true })
			}
		})
	}
	<-cut
	mu.Lock()
	cutting = true
	mu.Unlock()
	root, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	err = unix.IoctlSetPointerInt(int(root.Fd()), xfsIOCGoingDown, xfsGoingDownNoLogFlush)
	root.Close()
	if err != nil {
		t.Fatalf("shutting XFS down: %v", err)
	}
	wg.Wait()

	f.Close()
	dev := testdisk.Source(p)
	testdisk.Run(t, "umount", p)
	testdisk.Run(t, "mount", dev, p)
	restarted := closing(t, NewFile(testDiskName, p, 0, nil))
	if err := restarted.Start(ctx); err != nil {
		t.Fatalf("start after the power cut: %v", err)
	}

	mu.Lock()
	defer mu.Unlock()
	var kept, gone int
	for key, o := range outcomes {
		vol, err := restarted.GetVolume(ctx, key)
		switch {
		case o.deleted:
			gone++
			if !errors.Is(err, ErrNotFound) {
				t.Errorf("volume %s, deleted before the cut, after it: %+v, %v", key, vol, err)
			}
		case o.created && !o.deleteStarted:
			kept++
			if err != nil {
				t.Errorf("volume %s, created before the cut, is lost: %v", key, err)
				continue
			}
			var st unix.Stat_t
			if err := unix.Stat(restarted.volumeFile(key), &st); err != nil {
				t.Errorf("volume %s: %v", key, err)
			} else if vol.SizeBytes != volumeSize || st.Size != volumeSize || st.Blocks*512 < volumeSize {
				t.Errorf("volume %s: record says %d bytes, data file has %d bytes, %d allocated; want %d", key, vol.SizeBytes, st.Size, st.Blocks*512, volumeSize)
			}
		}
	}
	if kept == 0 || gone == 0 {
		t.Fatalf("%d volumes kept and %d deleted before the cut: the test checked nothing", kept, gone)
	}
	t.Logf("%d volumes kept and %d deleted before the power cut, after %d operations returned", kept, gone, returned)

	dir := filepath.Join(p, stateDirName, volumesDirName)
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, e := range entries {
		names[e.Name()] = true
	}
	for name := range names {
		switch key, isData := strings.CutSuffix(name, dataSuffix); {
		case strings.Contains(name, tmpInfix):
			t.Errorf("temporary file left: %s", name)
		case isData && !names[key+metaSuffix]:
			t.Errorf("data file without a record left: %s", name)
		case !isData:
			key = strings.TrimSuffix(name, metaSuffix)
			if _, err := restarted.GetVolume(ctx, key); err != nil {
				t.Errorf("record %s left that is not a ready volume: %v", name, err)
			}
		}
	}
}
