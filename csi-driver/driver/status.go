package driver

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/diskfit/diskfit/csi-driver/apis/diskfit/v1alpha1"
)

// maxMessageLength is the DiskNode schema's limit on a disk's message.
const maxMessageLength = 1024

// diskStatus observes one disk.
func (d *Driver) diskStatus(ctx context.Context, dk *disk) v1alpha1.DiskStatus {
	st := v1alpha1.DiskStatus{Name: dk.name, Backend: dk.backend.Kind(), DeviceClass: dk.deviceClass, Healthy: true}
	fail := func(err error) v1alpha1.DiskStatus {
		st.Healthy = false
		st.Message = err.Error()
		if len(st.Message) > maxMessageLength {
			st.Message = st.Message[:maxMessageLength]
		}
		return st
	}
	if err := dk.health(ctx); err != nil {
		return fail(err)
	}
	u, err := dk.backend.Usage(ctx)
	if err != nil {
		return fail(err)
	}
	vols, err := dk.backend.ListVolumes(ctx)
	if err != nil {
		return fail(err)
	}
	st.VolumeCount = int32(len(vols))
	// Capacity is what the disk offers volumes: its free space plus what its
	// volumes take. So capacity minus the volumes is exactly the free space,
	// and the scheduler's ledger (capacity minus the PVs it knows) agrees
	// with the disk between two reports, whatever the filesystem keeps for
	// itself (ext4 journal, XFS metadata) or whatever else was written there.
	var used int64
	for _, v := range vols {
		used += v.SizeBytes
	}
	st.FreeBytes = u.FreeBytes
	st.CapacityBytes = min(u.FreeBytes+used, u.CapacityBytes)
	return st
}

// Observe returns the node's current DiskNode status.
func (d *Driver) Observe(ctx context.Context) *v1alpha1.DiskNodeStatus {
	st := &v1alpha1.DiskNodeStatus{ObservedTime: metav1.NewTime(time.Now())}
	for _, dk := range d.disks {
		st.Disks = append(st.Disks, d.diskStatus(ctx, dk))
	}
	st.Summarize()
	return st
}

// publish observes and publishes the status once.
func (d *Driver) publish(ctx context.Context) {
	if d.cfg.Status == nil {
		return
	}
	st := d.Observe(ctx)
	if err := d.cfg.Status.Publish(ctx, st); err != nil {
		klog.FromContext(ctx).Error(err, "Publishing DiskNode status failed")
		return
	}
	klog.FromContext(ctx).V(4).Info("Published DiskNode status", "healthyDisks", st.HealthyDisks, "free", st.Free.String())
}

// statusLoop publishes at start, on every kick (create, delete, expand) and
// every StatusInterval, so the scheduler's view is never older than that.
func (d *Driver) statusLoop(ctx context.Context) {
	ticker := time.NewTicker(d.cfg.StatusInterval)
	defer ticker.Stop()
	for {
		d.publish(ctx)
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		case <-d.kick:
		}
	}
}
