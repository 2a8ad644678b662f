package lifecycle

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/diskfit/diskfit/csi-driver/lifecycle/lifecycletest"
)

// interleavings runs the actors, each a piece of code that talks to one
// API server (server) through a client of its own, once in every order
// their requests can reach the server: a request is let through only
// when every other actor is waiting on its next one, or done. After each
// request, check looks at the server's objects (done after the last):
// a broken promise fails the test with the order that broke it. It
// returns how many orders ran.
func interleavings(t *testing.T, server func() *lifecycletest.Server, check func(server *lifecycletest.Server, done bool) error, actors ...func(kubernetes.Interface) error) int {
	t.Helper()
	// Each run follows the choices made so far and takes the first
	// waiting actor past them; the next run changes the last choice that
	// had another option left (a depth-first walk of every order).
	var choices []int
	runs := 0
	for {
		runs++
		options, trace, err := interleave(server(), check, choices, actors)
		if err != nil {
			t.Fatalf("order %d (%s): %v", runs, strings.Join(trace, ", "), err)
		}
		// A run is deterministic: it replays the choices given exactly.
		i := len(options) - 1
		for i >= 0 && choiceAt(choices, i)+1 >= options[i] {
			i--
		}
		if i < 0 {
			return runs
		}
		next := make([]int, i+1)
		copy(next, choices)
		next[i] = choiceAt(choices, i) + 1
		choices = next
	}
}

func choiceAt(choices []int, i int) int {
	if i < len(choices) {
		return choices[i]
	}
	return 0
}

// interleave runs the actors once, letting their requests through in the
// order choices gives (then the first actor waiting), and returns how
// many actors were waiting at each step and what each step was.
func interleave(server *lifecycletest.Server, check func(server *lifecycletest.Server, done bool) error, choices []int, actors []func(kubernetes.Interface) error) (options []int, trace []string, err error) {
	type arrival struct {
		actor  int
		action string // "" when the actor is done
		err    error
	}
	arrived := make(chan arrival)
	gates := make([]chan struct{}, len(actors))
	var wg sync.WaitGroup
	for i, act := range actors {
		gates[i] = make(chan struct{})
		client := &k8sfake.Clientset{}
		client.ReactionChain = []clienttesting.Reactor{&clienttesting.SimpleReactor{Verb: "*", Resource: "*",
			Reaction: func(a clienttesting.Action) (bool, runtime.Object, error) {
				arrived <- arrival{actor: i, action: a.GetVerb() + " " + a.GetResource().Resource + " " + a.GetSubresource()}
				<-gates[i]
				obj, err := server.Invokes(a, nil)
				return true, obj, err
			}}}
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := act(client)
			arrived <- arrival{actor: i, err: err}
		}()
	}
	waiting := map[int]string{}
	running := len(actors)
	var results []string
	for running > 0 {
		// Wait for every running actor to be at a request or done.
		for len(waiting) < running {
			a := <-arrived
			if a.action == "" {
				running--
				results = append(results, fmt.Sprintf("actor %d returned %v", a.actor, a.err))
				continue
			}
			waiting[a.actor] = a.action
		}
		if running == 0 {
			break
		}
		var ready []int
		for i := range actors {
			if _, ok := waiting[i]; ok {
				ready = append(ready, i)
			}
		}
		pick := ready[min(choiceAt(choices, len(options)), len(ready)-1)]
		options = append(options, len(ready))
		trace = append(trace, fmt.Sprintf("%d: %s", pick, waiting[pick]))
		delete(waiting, pick)
		gates[pick] <- struct{}{}
		// The request is done when its actor is at its next one or done.
		a := <-arrived
		if a.actor != pick {
			panic("an actor went on without its turn")
		}
		if a.action == "" {
			running--
			results = append(results, fmt.Sprintf("actor %d returned %v", a.actor, a.err))
		} else {
			waiting[a.actor] = a.action
		}
		if err == nil {
			// After a broken promise the run goes on to its end, unchecked.
			err = check(server, running == 0)
		}
	}
	wg.Wait()
	return options, append(trace, results...), err
}
