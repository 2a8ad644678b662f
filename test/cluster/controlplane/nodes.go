package controlplane

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/diskfit/diskfit/apis/diskfit"
)

// CreateReadyNode creates a Node as a kubelet registers one: ready, with
// room for 110 pods, and labelled with its hostname and diskfit's topology
// key (as the driver's node plugin labels it). No kubelet runs for it.
func CreateReadyNode(ctx context.Context, kube kubernetes.Interface, name string) error {
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
		v1.LabelHostname: name, diskfit.TopologyKey: name,
	}}}
	created, err := kube.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating node %s: %w", name, err)
	}
	capacity := v1.ResourceList{
		v1.ResourceCPU:    resource.MustParse("4"),
		v1.ResourceMemory: resource.MustParse("32Gi"),
		v1.ResourcePods:   resource.MustParse("110"),
	}
	created.Status = v1.NodeStatus{
		Capacity:    capacity,
		Allocatable: capacity,
		Conditions:  []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue, LastHeartbeatTime: metav1.Now()}},
	}
	if _, err := kube.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("reporting status of node %s: %w", name, err)
	}
	return nil
}
