package driver

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
)

// pvDisks is an OrphanFinder whose PVs of this node sit on the given disks.
type pvDisks map[string]int

// noOtherPVs is the part of an OrphanFinder that DeleteVolume and
// DeleteSnapshot ask: no other PV or VolumeSnapshotContent keeps any
// volume or snapshot.
type noOtherPVs struct{}

func (noOtherPVs) PVsOf(context.Context, string) ([]*corev1.PersistentVolume, error) { return nil, nil }
func (noOtherPVs) Retain(context.Context, *corev1.PersistentVolume) error            { return nil }
func (noOtherPVs) ContentsOf(context.Context, string) ([]*unstructured.Unstructured, error) {
	return nil, nil
}
func (noOtherPVs) RetainContent(context.Context, *unstructured.Unstructured) error { return nil }

func (pvDisks) PVsOf(ctx context.Context, id string) ([]*corev1.PersistentVolume, error) {
	return noOtherPVs{}.PVsOf(ctx, id)
}
func (pvDisks) Retain(context.Context, *corev1.PersistentVolume) error { return nil }
func (pvDisks) ContentsOf(ctx context.Context, id string) ([]*unstructured.Unstructured, error) {
	return noOtherPVs{}.ContentsOf(ctx, id)
}
func (pvDisks) RetainContent(context.Context, *unstructured.Unstructured) error { return nil }

func (pvDisks) VolumesWithoutPV(_ context.Context, _ []string, _ bool) ([]string, error) {
	return nil, nil
}
func (pvDisks) SnapshotsWithoutContent(_ context.Context, _ []string) ([]string, error) {
	return nil, nil
}
func (p pvDisks) DisksOfPVs(string) map[string]int { return p }

func (pvDisks) ClaimWaits(context.Context, string, string, string, string) (bool, error) {
	return false, nil
}
func (pvDisks) SnapshotWaits(context.Context, string, string) (bool, error) { return false, nil }

// A disk that this node's PVs are on but that the driver does not serve
// (discovery found its mount gone after a reboot, or the node config lost
// it) is listed unhealthy in the DiskNode, so that its failure shows and
// the claims on it are handled as on any failed disk, rather than the disk
// silently vanishing.
func TestDiskOfPVsNotServedIsListedUnhealthy(t *testing.T) {
	e := newEnv(t, twoDisks(), nil)
	e.d.cfg.Orphans = pvDisks{"small": 1, "gone": 2}
	st := e.d.Observe(e.ctx)
	var gone, small bool
	for _, d := range st.Disks {
		switch d.Name {
		case "gone":
			gone = true
			if d.Healthy || !strings.Contains(d.Message, "2 PersistentVolumes") || d.CapacityBytes != 0 {
				t.Errorf("disk gone: %+v, want it unhealthy, saying 2 PVs are on it", d)
			}
			// The config names its disks and discovers none: an admin's
			// change, which releases no claim (unlike a disk discovery
			// did not find mounted, which may have died).
			if d.Reason != v1alpha1.DiskNotConfigured {
				t.Errorf("disk gone, not in a config that discovers nothing: reason %q, want %s", d.Reason, v1alpha1.DiskNotConfigured)
			}
		case "small":
			small = true
			if !d.Healthy {
				t.Errorf("served disk small: %+v", d)
			}
		}
	}
	if !gone || !small || len(st.Disks) != 3 {
		t.Errorf("disks %+v, want small, big and gone", st.Disks)
	}
	if st.HealthyDisks != 2 || st.DiskCount != 3 {
		t.Errorf("summary %d healthy of %d, want 2 of 3", st.HealthyDisks, st.DiskCount)
	}

	// With discovery, a disk not served may have died before it could be
	// mounted: unhealthy with no reason, a failure like any other.
	e.d.discovers.Store(true)
	if d := e.d.Observe(e.ctx).Disk("gone"); d == nil || d.Healthy || d.Reason != "" || !strings.Contains(d.Message, "discovery found it not mounted") {
		t.Errorf("disk gone under discovery: %+v, want it unhealthy with no reason", d)
	}

	// A disk discovery found mounted but skipped (its device class file
	// malformed, an admin's edit) is no failure either: its data is there.
	// Before, it read as not mounted, and its opted-in claims were
	// released after the grace time.
	e.d.skipped.Store(&map[string]string{"gone": "device class file /mnt/disks/gone/.diskfit-device-class must hold one word"})
	if d := e.d.Observe(e.ctx).Disk("gone"); d == nil || d.Healthy || d.Reason != v1alpha1.DiskNotConfigured || !strings.Contains(d.Message, "one word") {
		t.Errorf("disk discovery skipped: %+v, want it unhealthy, %s, saying why", d, v1alpha1.DiskNotConfigured)
	}
}
