package backend

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/diskfit/diskfit/csi-driver/lvm"
	"k8s.io/klog/v2"
)

// Wiping deleted LVs. lvm2 frees the extents of a removed LV as they are
// and zeroes only the first 4 KiB of a new one, so a new volume, or the
// extents an expansion adds, would read what an earlier volume or
// snapshot stored there: a Block volume reads it directly. So no LV of
// diskfit's is removed as it is. It is renamed to a wipe name
// (wipePrefix), which commits the deletion: the LV is gone from every
// listing and its name is free at once, while its extents stay allocated,
// so lvm2 cannot hand them out and the group's free space leaves them
// out. The wiper, a goroutine that runs while the backend serves the
// group, then zeroes the LV and only then removes it. Zeroing a large LV
// takes minutes, longer than a CSI call may. A driver that stops
// mid-wipe leaves the LV renamed and allocated; the next Start wipes it.
//
// A deleted snapshot is first split off its origin (lvconvert
// --splitsnapshot): what remains is its copy-on-write area, which holds
// the origin's old data, as a plain LV to wipe. The split comes after the
// rename, so that a crash between the two never leaves what reads as a
// ready snapshot but is no longer one.

// wipeRetry is the first wait before a failed wipe is tried again; the
// wait doubles up to wipeRetryMax.
const (
	wipeRetry    = time.Second
	wipeRetryMax = 2 * time.Minute
)

// wiper runs wipe passes in a goroutine from start to stop.
type wiper struct {
	// kick asks for a pass (a new LV to wipe).
	kick chan struct{}
	// retry and retryMax bound the wait after a failed pass.
	retry, retryMax time.Duration
	// last is the last wipe name's number (wipeName).
	last atomic.Int64

	mu sync.Mutex
	// cancel ends the goroutine, closing done; nil when none runs.
	cancel context.CancelFunc
	done   chan struct{}
}

func newWiper() *wiper {
	return &wiper{kick: make(chan struct{}, 1), retry: wipeRetry, retryMax: wipeRetryMax}
}

// start runs pass in a goroutine until stop: at once when pending, then
// whenever kicked, and again after a wait while it fails. It does nothing
// when the goroutine runs already.
func (w *wiper) start(ctx context.Context, pass func(context.Context) error, pending bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cancel != nil {
		return
	}
	ctx, w.cancel = context.WithCancel(context.WithoutCancel(ctx))
	w.done = make(chan struct{})
	go func(done chan struct{}) {
		defer close(done)
		w.loop(ctx, pass, pending)
	}(w.done)
}

func (w *wiper) loop(ctx context.Context, pass func(context.Context) error, pending bool) {
	logger := klog.FromContext(ctx)
	wait := w.retry
	for {
		var timer *time.Timer
		var retry <-chan time.Time
		if pending {
			if err := pass(ctx); err == nil {
				wait = w.retry
			} else if ctx.Err() == nil {
				logger.Error(err, "Wiping deleted LVs failed; their space stays allocated until they are wiped", "retryIn", wait)
				timer = time.NewTimer(wait)
				retry = timer.C
				wait = min(2*wait, w.retryMax)
			}
		}
		select {
		case <-ctx.Done():
		case <-w.kick:
		case <-retry:
		}
		if timer != nil {
			timer.Stop()
		}
		if ctx.Err() != nil {
			return
		}
		pending = true
	}
}

// wake asks the goroutine for a pass.
func (w *wiper) wake() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// stop ends the goroutine, killing the command it runs, and waits for it.
func (w *wiper) stop() {
	w.mu.Lock()
	cancel, done := w.cancel, w.done
	w.cancel, w.done = nil, nil
	w.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// name returns a new wipe name: wipePrefix and a number that grows, the
// time in nanoseconds or more, so it is unique across restarts too. The
// deleted LV's key is not in it: an LV name is at most 127 bytes, and a
// long key with the suffix would not fit; its name tag stays.
func (w *wiper) name() string {
	for {
		last := w.last.Load()
		n := max(time.Now().UnixNano(), last+1)
		if w.last.CompareAndSwap(last, n) {
			return wipePrefix + strconv.FormatInt(n, 36)
		}
	}
}

// discard deletes LV name: it is renamed for the wiper, which zeroes it
// and removes it later. A volume is deactivated first: lvm2 refuses that
// while its device is open (mounted, a pod's Block device, the source of
// a copy), which is then ErrInUse, as lvremove's refusal was. lvrename
// would not notice, and the wiper would zero a device in use. (A snapshot
// is active with its origin and never published; it is not deactivated.)
func (l *LVM) discard(ctx context.Context, name string) error {
	if strings.HasPrefix(name, volumePrefix) {
		if _, err := l.run.Run(ctx, "lvchange", "--activate", "n", l.vg+"/"+name); err != nil {
			if strings.Contains(err.Error(), " in use") {
				return fmt.Errorf("%w: %w", ErrInUse, err)
			}
			return err
		}
	}
	if _, err := l.run.Run(ctx, "lvrename", l.vg+"/"+name, l.vg+"/"+l.wiper.name()); err != nil {
		return err
	}
	l.wiper.wake()
	return nil
}

// PendingWipes implements Wiping: the LVs deleted and not yet zeroed and
// removed.
func (l *LVM) PendingWipes(ctx context.Context) (int, error) {
	raws, err := lvm.ListLVs(ctx, l.run, l.vg)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, raw := range raws {
		if strings.HasPrefix(raw.Name, wipePrefix) {
			n++
		}
	}
	return n, nil
}

// wipeAll splits off, zeroes and removes every LV renamed for wiping. An
// origin waits until its snapshots are split off: lvremove would remove
// them with it, unwiped.
func (l *LVM) wipeAll(ctx context.Context) error {
	raws, err := lvm.ListLVs(ctx, l.run, l.vg)
	if err != nil {
		return err
	}
	snapshots := map[string]int{}
	for _, raw := range raws {
		if raw.Origin != "" {
			snapshots[raw.Origin]++
		}
	}
	lvs, err := decodeLVs(raws)
	if err != nil {
		return err
	}
	var errs []error
	for i, v := range lvs {
		if !strings.HasPrefix(v.name, wipePrefix) || v.origin == "" {
			continue
		}
		if _, err := l.run.Run(ctx, "lvconvert", "--yes", "--splitsnapshot", l.vg+"/"+v.name); err != nil {
			errs = append(errs, err)
			continue
		}
		snapshots[v.origin]--
		lvs[i].origin = ""
	}
	for _, v := range lvs {
		if !strings.HasPrefix(v.name, wipePrefix) || v.origin != "" {
			continue
		}
		if snapshots[v.name] > 0 {
			errs = append(errs, fmt.Errorf("%s/%s waits until its snapshots are gone", l.vg, v.name))
			continue
		}
		if err := l.wipe(ctx, v.name); err != nil {
			errs = append(errs, err)
			continue
		}
		klog.FromContext(ctx).V(2).Info("Wiped and removed a deleted LV", "lv", v.name, "name", v.csiName)
	}
	return errors.Join(errs...)
}

// wipe zeroes LV name and removes it. blkdiscard --zeroout writes zeroes
// (BLKZEROOUT); a plain discard need not zero. sync on the device (fsync)
// flushes the disk's write cache before the extents are freed: zeroes
// lost to a power cut would leave them holding the data for the next LV.
func (l *LVM) wipe(ctx context.Context, name string) error {
	for _, cmd := range [][]string{
		{"lvchange", "--activate", "y", l.vg + "/" + name},
		{"blkdiscard", "--zeroout", l.lvPath(name)},
		{"sync", l.lvPath(name)},
		{"lvremove", "--yes", l.vg + "/" + name},
	} {
		if _, err := l.run.Run(ctx, cmd[0], cmd[1:]...); err != nil {
			return err
		}
	}
	return nil
}
