package diskfit

import (
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// maxWaitingPods bounds the memory for pods waiting for space; beyond it
// the oldest knowledge is dropped and those pods rely on the queue's
// periodic flush instead.
const maxWaitingPods = 10000

// waitingPods are pods that DiskFit rejected for lack of disk space. Space
// freed by Unreserve produces no API event that queueing hints could see,
// so Unreserve activates them itself.
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
