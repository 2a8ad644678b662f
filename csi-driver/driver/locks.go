package driver

import "sync"

// keyLocks serialises operations per key (a volume or snapshot key) while
// letting operations on different keys run in parallel. Entries are
// reference-counted and dropped when unused, so the map does not grow with
// every volume ever seen.
//
// The keys are "volume/"+key and "snapshot/"+key. A call holds at most
// one volume lock and one snapshot lock, and takes the volume's first:
// CreateSnapshot holds its source volume's lock while it makes the
// snapshot, so that no expansion or deletion of the source runs
// meanwhile. Nothing that holds a snapshot lock may then take a volume
// lock, nor anything that holds a volume lock take another volume's.
type keyLocks struct {
	mu    sync.Mutex
	locks map[string]*keyLock
}

type keyLock struct {
	mu   sync.Mutex
	refs int
}

func newKeyLocks() *keyLocks {
	return &keyLocks{locks: map[string]*keyLock{}}
}

// lock locks key and returns the function that unlocks it.
func (k *keyLocks) lock(key string) func() {
	k.mu.Lock()
	l, ok := k.locks[key]
	if !ok {
		l = &keyLock{}
		k.locks[key] = l
	}
	l.refs++
	k.mu.Unlock()

	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		k.mu.Lock()
		l.refs--
		if l.refs == 0 {
			delete(k.locks, key)
		}
		k.mu.Unlock()
	}
}
