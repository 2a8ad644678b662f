package driver

import (
	"context"
	"testing"
	"time"
)

// raceFinder answers like the API server at the moment of each call, and
// lets the test run something between the confirming list and the removal.
type raceFinder struct {
	afterConfirm func()
}

func (f *raceFinder) VolumesWithoutPV(_ context.Context, ids []string, confirm bool) ([]string, error) {
	if confirm && f.afterConfirm != nil {
		// The list said "no PV"; before the sweep takes the volume's lock,
		// the provisioner's CreateVolume retry succeeds and it saves the PV.
		f.afterConfirm()
	}
	return ids, nil
}

func (f *raceFinder) SnapshotsWithoutContent(_ context.Context, ids []string) ([]string, error) {
	return nil, nil
}

// A volume whose CreateVolume (an idempotent retry of a provisioner that
// could not save its PV for a while) succeeds between the sweep's
// confirming list and the removal is kept: the provisioner is about to
// save a PV naming it.
func TestSweepKeepsWhatCreateVolumeJustReturned(t *testing.T) {
	e := newEnv(t, []testDisk{{name: "only", fsType: "xfs", size: 1 << 30}}, nil)
	req := createReq("pvc-slow", 64<<20)
	vol := e.mustCreate(t, req)
	finder := &raceFinder{}
	e.d.cfg.Orphans = finder
	e.d.cfg.OrphanGracePeriod = time.Minute
	first := time.Now()
	e.d.now = func() time.Time { return first }
	e.d.sweepOrphans(e.ctx) // found without a PV
	retried := false
	finder.afterConfirm = func() {
		if _, err := e.d.CreateVolume(e.ctx, req); err != nil {
			t.Errorf("retry: %v", err)
		}
		retried = true
	}
	e.d.now = func() time.Time { return first.Add(2 * time.Minute) }
	e.d.sweepOrphans(e.ctx)
	if !retried {
		t.Fatal("no confirm happened")
	}
	if _, _, err := e.d.getVolume(e.ctx, vol.VolumeId); err != nil {
		t.Errorf("CreateVolume just answered success for %s, and the sweep then removed it: %v", vol.VolumeId, err)
	}
}
