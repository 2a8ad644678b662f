package kube

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/diskfit/diskfit/apis/client/clientset/versioned"
	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
)

// DiskNodeEvents records Events on the node's DiskNode (core/v1 Events in
// the default namespace, where Events of cluster-scoped objects go), so
// that `kubectl describe disknode <node>` shows them.
type DiskNodeEvents struct {
	broadcaster record.EventBroadcaster
	recorder    record.EventRecorder
	diskfit     versioned.Interface
	nodeName    string
}

// NewDiskNodeEvents starts sending Events to the API server; Shutdown
// stops it.
func NewDiskNodeEvents(ctx context.Context, kube kubernetes.Interface, diskfit versioned.Interface, nodeName string) *DiskNodeEvents {
	b := record.NewBroadcaster(record.WithContext(ctx))
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: kube.CoreV1().Events("")})
	return &DiskNodeEvents{
		broadcaster: b,
		recorder:    b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "diskfit-csi", Host: nodeName}),
		diskfit:     diskfit,
		nodeName:    nodeName,
	}
}

// Event implements driver.EventRecorder.
func (e *DiskNodeEvents) Event(ctx context.Context, eventType, reason, message string) {
	ref := &corev1.ObjectReference{
		APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: "DiskNode", Name: e.nodeName,
	}
	// The UID ties the Event to this DiskNode for kubectl describe; the
	// Event still names it without one.
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if dn, err := e.diskfit.DiskfitV1alpha1().DiskNodes().Get(ctx, e.nodeName, metav1.GetOptions{}); err == nil {
		ref.UID = dn.UID
	}
	e.recorder.Event(ref, eventType, reason, message)
}

// Shutdown stops sending Events.
func (e *DiskNodeEvents) Shutdown() { e.broadcaster.Shutdown() }
