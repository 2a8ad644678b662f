package diskfit

import (
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// maxWaitingPods bounds the memory for each list of waiting pods; beyond
// it the oldest knowledge is dropped and those pods rely on the queue's
// periodic flush instead.
const maxWaitingPods = 10000

// waitingPods are pods that DiskFit rejected, waiting for a change that
// the plugin sees itself: space that Unreserve frees produces no API event
// at all, and a pod that a queueing hint retries before the change reaches
// the ledger (feed.go) is rejected again after the event has passed.
// Filter adds to them; wake activates them.
type waitingPods struct {
	mu   sync.Mutex
	pods map[types.UID]*v1.Pod
}

func (w *waitingPods) add(pod *v1.Pod) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.pods == nil || len(w.pods) >= maxWaitingPods {
		w.pods = map[types.UID]*v1.Pod{}
	}
	w.pods[pod.UID] = pod
}

func (w *waitingPods) remove(uid types.UID) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.pods, uid)
}

// takeAll returns the waiting pods keyed as the scheduling queue's Activate
// expects and forgets them.
func (w *waitingPods) takeAll() map[string]*v1.Pod {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.pods) == 0 {
		return nil
	}
	out := make(map[string]*v1.Pod, len(w.pods))
	for _, p := range w.pods {
		out[p.Namespace+"/"+p.Name] = p
	}
	w.pods = nil
	return out
}

// wake hands the pods waiting in w to the scheduling queue.
func (pl *DiskFit) wake(w *waitingPods, why string) {
	if pods := w.takeAll(); len(pods) > 0 {
		pl.logger.V(4).Info("Activating pods DiskFit rejected", "why", why, "count", len(pods))
		pl.activator.Activate(pl.logger, pods)
	}
}
