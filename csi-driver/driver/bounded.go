package driver

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// A call to a disk can hang: on a dying device statfs, getdents or open
// wait in uninterruptible sleep (D state) for as long as the kernel keeps
// retrying, and an lvm command reading such a device never exits. Nothing
// cancels such a syscall, so the calls that the status refresh and the
// disk checks of the RPCs make are bounded the only way there is: each
// runs in its own goroutine and the caller stops waiting at a deadline.
// The goroutine stays behind until the call returns; so that a disk that
// stays stuck does not pile up one more goroutine (and OS thread, a
// blocked syscall holds one) at every refresh or RPC, at most one call of
// each kind per disk is in flight, and whoever comes while it is joins it
// (and is told at once that the disk still does not answer once its
// deadline passed).

// DefaultDiskStatusTimeout is Config.DiskStatusTimeout when zero.
const DefaultDiskStatusTimeout = 10 * time.Second

// errNotAnswering marks the error of a disk whose call did not return in
// time.
var errNotAnswering = errors.New("not answering")

// flight is one run of a call to a disk.
type flight[T any] struct {
	started, deadline time.Time
	done              chan struct{}
	// val is set before done is closed.
	val T
}

// oneFlight keeps at most one run of a call to a disk in flight.
type oneFlight[T any] struct {
	mu  sync.Mutex
	cur *flight[T]
}

// join returns the run in flight, or starts fn in a new one whose context
// ends timeout from now. That context keeps ctx's values but not its
// cancellation: others may join the run, and one caller going away must
// not turn their answer into an error. The deadline reaches what honours a
// context (the lvm commands are killed at it); a syscall it cannot stop.
func (o *oneFlight[T]) join(ctx context.Context, timeout time.Duration, fn func(context.Context) T) *flight[T] {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.cur != nil {
		return o.cur
	}
	now := time.Now()
	f := &flight[T]{started: now, deadline: now.Add(timeout), done: make(chan struct{})}
	o.cur = f
	go func() {
		fctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), f.deadline)
		defer cancel()
		f.val = fn(fctx)
		// Forgotten before done is closed: whoever sees it done and calls
		// again starts a fresh run rather than reading an old answer.
		o.mu.Lock()
		o.cur = nil
		o.mu.Unlock()
		close(f.done)
	}()
	return f
}

// overdue returns the run in flight if its deadline has passed, nil
// otherwise.
func (o *oneFlight[T]) overdue() *flight[T] {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.cur != nil && !time.Now().Before(o.cur.deadline) {
		return o.cur
	}
	return nil
}

// busy reports whether a run is in flight.
func (o *oneFlight[T]) busy() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.cur != nil
}

// wait returns the run's value once it returns, or an error wrapping
// errNotAnswering when its deadline passes first (at once when it had
// already passed), or ctx's error when ctx ends first. what names the call
// in the error.
func (f *flight[T]) wait(ctx context.Context, what string, timeout time.Duration) (T, error) {
	late := !time.Now().Before(f.deadline)
	timer := time.NewTimer(time.Until(f.deadline))
	defer timer.Stop()
	var zero T
	select {
	case <-f.done:
		return f.val, nil
	case <-timer.C:
	case <-ctx.Done():
		return zero, fmt.Errorf("gave up waiting for %s: %w", what, ctx.Err())
	}
	select {
	case <-f.done: // returned at the deadline
		return f.val, nil
	default:
	}
	if late {
		return zero, stillNotAnswering(f.started, what, timeout)
	}
	return zero, fmt.Errorf("%w: %s did not answer within %s; the device may be hanging", errNotAnswering, what, timeout)
}

func stillNotAnswering(since time.Time, what string, timeout time.Duration) error {
	return fmt.Errorf("still %w since %s: %s did not answer within %s; the device may be hanging",
		errNotAnswering, since.UTC().Format(time.RFC3339), what, timeout)
}

// timedOut wraps err, the error of a call whose context passed its
// deadline (an lvm command killed at it), so that it says so.
func timedOut(ctx context.Context, err error, what string, timeout time.Duration) error {
	if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("%w: %s did not answer within %s: %w", errNotAnswering, what, timeout, err)
	}
	return err
}
