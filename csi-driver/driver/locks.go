package driver

import (
	"context"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// keyLocks serialises operations per key (a volume or snapshot key) while
// letting operations on different keys run in parallel. Entries are
// reference-counted and dropped when unused, so the map does not grow with
// every volume ever seen.
//
// The keys are "volume/"+key and "snapshot/"+key. A call takes at most
// two of them, in one of these orders:
//
//   - CreateVolume of a clone holds the new volume's lock, then its
//     source volume's until the copy is made, so that no stage (which
//     gives the source to a pod), expansion or deletion of the source
//     runs meanwhile.
//   - CreateVolume of a restore holds the new volume's lock, then its
//     source snapshot's until the copy is made, so that no deletion of
//     the snapshot runs meanwhile.
//   - CreateSnapshot holds its source volume's lock, then the
//     snapshot's, while it makes the snapshot, so that no expansion or
//     deletion of the source runs meanwhile.
//
// Nothing that holds a snapshot lock takes another lock, and nothing
// takes a lock after a copy's source's. No calls wait for each other's
// volume locks in a cycle: a CreateVolume answers for a volume that is
// ready before it looks at any source, so it holds its own lock only
// while its volume is not ready, and nothing makes that volume ready
// meanwhile; it waits for its source's lock only after it has seen the
// source ready (contentSource), which is after it took its own lock. A
// clone waiting for a volume's lock that another clone holds as its new
// volume's therefore saw that volume ready before the other took that
// lock, and took its own lock earlier still. Around a cycle of such
// waits each call would have taken its lock before the next one took
// its, which is impossible. (A volume is never its own source.)
type keyLocks struct {
	mu    sync.Mutex
	locks map[string]*keyLock
}

// keyLock is held while its channel holds a token.
type keyLock struct {
	held chan struct{}
	refs int
}

func newKeyLocks() *keyLocks {
	return &keyLocks{locks: map[string]*keyLock{}}
}

// lock locks key and returns the function that unlocks it. It stops
// waiting when ctx ends, answering Aborted (CSI's "an operation is pending
// for the volume"), so that a call whose caller gave up does nothing
// later: a kubelet or sidecar whose call timed out retries, and may since
// have asked for something else.
func (k *keyLocks) lock(ctx context.Context, key string) (unlock func(), err error) {
	k.mu.Lock()
	l, ok := k.locks[key]
	if !ok {
		l = &keyLock{held: make(chan struct{}, 1)}
		k.locks[key] = l
	}
	l.refs++
	k.mu.Unlock()

	release := func() {
		k.mu.Lock()
		l.refs--
		if l.refs == 0 {
			delete(k.locks, key)
		}
		k.mu.Unlock()
	}
	select {
	case l.held <- struct{}{}:
		return func() {
			<-l.held
			release()
		}, nil
	case <-ctx.Done():
		release()
		return nil, status.Errorf(codes.Aborted, "another operation on %s is still running; gave up waiting for it: %v", key, ctx.Err())
	}
}
