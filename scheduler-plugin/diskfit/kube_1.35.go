//go:build kube1.35

package diskfit

// The kube-scheduler framework API of Kubernetes 1.35, where it differs
// from later minors' (kube.go has those).

import (
	"context"

	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"
)

// The framework's range of node scores (renamed MinScore and MaxScore in
// 1.36).
const (
	minScore = fwk.MinNodeScore
	maxScore = fwk.MaxNodeScore
)

// PreBindPreFlight is VolumeBinding's: DiskFit's decision already travels
// in the PVCs VolumeBinding writes. (1.36 added a result to it.)
func (pl *DiskFit) PreBindPreFlight(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodeName string) *fwk.Status {
	return pl.vb.PreBindPreFlight(ctx, cs, pod, nodeName)
}
