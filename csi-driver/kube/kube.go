// Package kube connects the diskfit CSI driver to the Kubernetes API: it
// reads PVCs and publishes the node's DiskNode status. These are the
// driver's only API calls, behind the driver's narrow interfaces.
package kube

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/diskfit/diskfit/apis/client/clientset/versioned"
	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
)

// PVCGetter reads PVCs with client-go.
type PVCGetter struct {
	Client kubernetes.Interface
}

// GetPVC implements driver.PVCGetter.
func (g PVCGetter) GetPVC(ctx context.Context, namespace, name string) (*corev1.PersistentVolumeClaim, error) {
	return g.Client.CoreV1().PersistentVolumeClaims(namespace).Get(ctx, name, metav1.GetOptions{})
}

// DiskNodePublisher writes the status of the DiskNode named after the node,
// creating the object (owned by the Node, so it goes with it) when missing.
type DiskNodePublisher struct {
	Kube     kubernetes.Interface
	DiskFit  versioned.Interface
	NodeName string
}

// Publish implements driver.StatusPublisher.
func (p DiskNodePublisher) Publish(ctx context.Context, status *v1alpha1.DiskNodeStatus) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		dn, err := p.DiskFit.DiskfitV1alpha1().DiskNodes().Get(ctx, p.NodeName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			dn, err = p.create(ctx)
		}
		if err != nil {
			return err
		}
		dn.Status = *status
		dn.Status.CountUnschedulable(&dn.Spec)
		if _, err := p.DiskFit.DiskfitV1alpha1().DiskNodes().UpdateStatus(ctx, dn, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("updating DiskNode %s status: %w", p.NodeName, err)
		}
		return nil
	})
}

// Spec implements driver.SpecReader with a read from the API server, so a
// disk taken out of service gets no new volume from the next request on.
func (p DiskNodePublisher) Spec(ctx context.Context) (*v1alpha1.DiskNodeSpec, error) {
	dn, err := p.DiskFit.DiskfitV1alpha1().DiskNodes().Get(ctx, p.NodeName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return &v1alpha1.DiskNodeSpec{}, nil
	}
	if err != nil {
		return nil, err
	}
	return &dn.Spec, nil
}

// create makes the node's DiskNode, for a Node that exists. It has no
// owner reference to the Node: the garbage collector would delete it with
// the Node, and an admin's cordon in its spec with it, when the Node is
// deleted and registered again; diskfit-controller deletes the DiskNodes
// of Nodes that are gone (csi-driver/lifecycle/disknodes.go).
func (p DiskNodePublisher) create(ctx context.Context) (*v1alpha1.DiskNode, error) {
	if _, err := p.Kube.CoreV1().Nodes().Get(ctx, p.NodeName, metav1.GetOptions{}); err != nil {
		return nil, fmt.Errorf("reading Node %s: a DiskNode is made for a registered node only: %w", p.NodeName, err)
	}
	dn := &v1alpha1.DiskNode{ObjectMeta: metav1.ObjectMeta{Name: p.NodeName}}
	created, err := p.DiskFit.DiskfitV1alpha1().DiskNodes().Create(ctx, dn, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return p.DiskFit.DiskfitV1alpha1().DiskNodes().Get(ctx, p.NodeName, metav1.GetOptions{})
	}
	if err != nil {
		return nil, fmt.Errorf("creating DiskNode %s: %w", p.NodeName, err)
	}
	return created, nil
}

// NodeLabels reads the labels of the node, for the node config's sections.
type NodeLabels struct {
	Client   kubernetes.Interface
	NodeName string
}

// Get returns the node's labels.
func (n NodeLabels) Get(ctx context.Context) (map[string]string, error) {
	node, err := n.Client.CoreV1().Nodes().Get(ctx, n.NodeName, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading Node %s: %w", n.NodeName, err)
	}
	return node.Labels, nil
}
