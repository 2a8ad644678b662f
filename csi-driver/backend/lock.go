package backend

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// serveLock makes one backend at a time, in any process on the node, serve
// a disk. Start rolls back every creation that did not finish, which is
// only right when no other process is in the middle of one: a second
// driver on the node (a force-deleted driver pod whose container still
// runs while its replacement starts, two installations side by side)
// would remove the data of a volume that the first then reports created.
// So each backend takes the lock before it rolls anything back and holds
// it until Close.
//
// The lock is an exclusive flock(2) on a file both processes see as the
// same file (the file backend's state directory on the disk, the LVM
// backend's file in the node's lock directory). The kernel drops it when
// its holder dies, so a crashed or killed driver never leaves a disk
// locked, and it conflicts between two open files of one process too, as
// between two backends of one test.
type serveLock struct {
	mu sync.Mutex
	// f is the locked file while the lock is held, nil otherwise.
	f *os.File
}

// take locks path, opened with flag (O_NOFOLLOW added), without waiting:
// a lock another process holds fails naming the disk, what
// (ErrServedByAnotherProcess; the caller checks that the disk answers
// before it returns that). Taking it again while holding it does nothing.
func (l *serveLock) take(path string, flag int, what string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f != nil {
		return nil
	}
	f, err := os.OpenFile(path, flag|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("opening %s to lock it: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return &heldError{what: what, path: path}
		}
		return fmt.Errorf("locking %s: %w", path, err)
	}
	l.f = f
	return nil
}

// ErrServedByAnotherProcess: another process on the node serves the disk
// (serveLock), and a Start that found it so checked that the disk still
// answers reads: it is no failure of the disk, and it is served once that
// process is gone. A disk that does not answer fails Start with that
// error instead, since the process holding it may be one hung on the dead
// disk.
var ErrServedByAnotherProcess = errors.New("another process serves the disk")

// heldError is the ErrServedByAnotherProcess of take.
type heldError struct{ what, path string }

func (e *heldError) Error() string {
	return fmt.Sprintf("another process serves %s (it holds the lock on %s): is a second diskfit driver running on this node, such as a driver pod still terminating or a second installation? The disk is served once that one is gone", e.what, e.path)
}

// Is makes a heldError ErrServedByAnotherProcess.
func (e *heldError) Is(target error) bool { return target == ErrServedByAnotherProcess }

// release lets go of the lock, if held.
func (l *serveLock) release() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}
