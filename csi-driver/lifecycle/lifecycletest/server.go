package lifecycletest

import (
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/scheme"
	clienttesting "k8s.io/client-go/testing"
)

// Client is what the functions here change: a fake clientset's reactions
// and the objects they serve (k8sfake.Clientset, Server).
type Client interface {
	PrependReactor(verb, resource string, reaction clienttesting.ReactionFunc)
	Tracker() clienttesting.ObjectTracker
}

// Server is a fake API server without the managed fields that
// k8sfake.NewClientset keeps, whose every write costs a millisecond: for
// tests that run thousands of them. Clients reach it through Invokes.
type Server struct {
	clienttesting.Fake
	tracker clienttesting.ObjectTracker
}

// NewServer returns a Server holding objs.
func NewServer(objs ...runtime.Object) *Server {
	s := &Server{tracker: clienttesting.NewObjectTracker(scheme.Scheme, scheme.Codecs.UniversalDecoder())}
	for _, obj := range objs {
		if err := s.tracker.Add(obj); err != nil {
			panic(err)
		}
	}
	s.AddReactor("*", "*", clienttesting.ObjectReaction(s.tracker))
	return s
}

// Tracker returns the objects s serves.
func (s *Server) Tracker() clienttesting.ObjectTracker { return s.tracker }
