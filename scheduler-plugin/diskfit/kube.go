//go:build !kube1.35

package diskfit

// The kube-scheduler framework API as of Kubernetes 1.36 and 1.37. Where
// it differs from 1.35's, both forms live in this file and kube_1.35.go,
// and nowhere else: diskfit-scheduler builds from the same source for each
// supported minor (hack/kube-minor.sh; docs/kubernetes-versions.md).

import (
	"context"

	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"
)

// The framework's range of node scores.
const (
	minScore = fwk.MinScore
	maxScore = fwk.MaxScore
)

// PreBindPreFlight is VolumeBinding's: DiskFit's decision already travels
// in the PVCs VolumeBinding writes.
func (pl *DiskFit) PreBindPreFlight(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodeName string) (*fwk.PreBindPreFlightResult, *fwk.Status) {
	return pl.vb.PreBindPreFlight(ctx, cs, pod, nodeName)
}
