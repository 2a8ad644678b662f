package diskfit

import (
	"context"

	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/diskfit/diskfit/scheduler-plugin/fit"
)

// PreScore decides whether Score runs: for pods with diskfit claims, or
// when the embedded VolumeBinding wants to score; for a pod with both, the
// two scores are averaged only when VolumeBinding has claims of its own.
func (pl *DiskFit) PreScore(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodes []fwk.NodeInfo) *fwk.Status {
	vbStatus := pl.vb.PreScore(ctx, cs, pod, nodes)
	s, err := pl.getState(cs)
	if err != nil || len(s.claims) == 0 {
		// No diskfit claims: VolumeBinding decides alone.
		return vbStatus
	}
	switch {
	case vbStatus.IsSuccess():
		// VolumeBinding's capacity score of a diskfit claim is always the
		// lowest (it sees no capacity for it): averaging it in would only
		// halve the disk score's weight against other score plugins.
		s.vbScores = s.othersUnbound
	case vbStatus.IsSkip():
		s.vbScores = false
	default:
		return vbStatus
	}
	return nil
}

// Score rates a node by how its disks would be filled by the pod's claims,
// placed as Reserve would place them; with VolumeBinding also scoring, the
// two scores are averaged.
func (pl *DiskFit) Score(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodeInfo fwk.NodeInfo) (int64, *fwk.Status) {
	s, err := pl.getState(cs)
	if err != nil || len(s.claims) == 0 {
		return pl.vb.Score(ctx, cs, pod, nodeInfo)
	}
	score := pl.scoreDisks(s, nodeInfo.Node().Name)
	if s.vbScores {
		vbScore, status := pl.vb.Score(ctx, cs, pod, nodeInfo)
		if !status.IsSuccess() {
			return 0, status
		}
		score = (score + vbScore) / 2
	}
	return score, nil
}

// scoreDisks is the disk part of Score, from minScore to maxScore (fit's
// range is the framework's): the score Filter computed for the node in
// this cycle (filter.go), so a node's disks are looked up and packed once
// per cycle. Space taken since then changes nothing here; Reserve packs
// again and rejects a node that no longer fits. A node Filter did not pass
// in this cycle is evaluated now.
func (pl *DiskFit) scoreDisks(s *stateData, node string) int64 {
	if score, ok := s.diskScores.Load(node); ok {
		return score.(int64)
	}
	var buf fit.Buffers
	return minScore + pl.fit.Score(pl.fit.Evaluate(node, s.claims, &buf), s.claims)
}

// ScoreExtensions returns nil: scores are already in the framework's range.
func (pl *DiskFit) ScoreExtensions() fwk.ScoreExtensions { return nil }
