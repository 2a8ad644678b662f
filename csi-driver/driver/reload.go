package driver

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/diskfit/diskfit/csi-driver/backend"
	"github.com/diskfit/diskfit/csi-driver/config"
)

// defaultReloadInterval is how often the node config is read again.
//
// The driver polls instead of watching the file with inotify: the kubelet
// updates a ConfigMap volume by swapping a symlink, which a watch on the
// file misses and a watch on the directory sees only as events on
// ..data; discovered disks change with the mounts, which no watch on the
// file sees at all; and a poll cannot lose an event. Reading a small file
// and /proc/self/mountinfo every few seconds costs nothing.
const defaultReloadInterval = 10 * time.Second

// Reasons of the Events a reload records on the DiskNode.
const (
	// ReasonConfigChangeRefused: the change would orphan volumes; the disk
	// is served as before.
	ReasonConfigChangeRefused = "ConfigChangeRefused"
	// ReasonInvalidConfig: the file does not parse or validate, or no
	// section selects the node; the running config is kept.
	ReasonInvalidConfig = "InvalidConfig"
	// ReasonRestartNeeded: a change that only a restart applies.
	ReasonRestartNeeded = "RestartNeeded"
)

// reloadState is what reloads remember, so that one problem is reported
// once and not at every reload. Only the reload loop uses it.
type reloadState struct {
	invalid    string
	refused    map[string]string
	maxVolumes int64
	notes      []string
}

// reloadLoop applies the node config every ReloadInterval until ctx ends.
func (d *Driver) reloadLoop(ctx context.Context) {
	every(ctx, d.cfg.ReloadInterval, d.reload)
}

// every calls fn every interval, the first time one interval from now,
// until ctx ends.
func every(ctx context.Context, interval time.Duration, fn func(context.Context)) {
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
			fn(ctx)
		}
	}
}

// reload reads the node config and applies what changed.
func (d *Driver) reload(ctx context.Context) {
	next, err := d.cfg.Source.Load(ctx)
	switch {
	case errors.Is(err, config.ErrNoSection):
		// As a config without disks: each disk goes if it may.
		d.warnInvalid(ctx, err)
		d.apply(ctx, &config.NodeConfig{MaxVolumes: d.cfg.Node.MaxVolumes}, err)
	case err != nil:
		d.warnInvalid(ctx, err)
	default:
		d.reloads.invalid = ""
		d.apply(ctx, next, nil)
	}
}

func (d *Driver) warnInvalid(ctx context.Context, err error) {
	msg := "Kept the running node config: " + err.Error()
	if msg == d.reloads.invalid {
		return
	}
	d.reloads.invalid = msg
	klog.FromContext(ctx).Error(err, "Node config not applied, keeping the running one")
	d.event(ctx, corev1.EventTypeWarning, ReasonInvalidConfig, msg)
}

// apply makes the served disks what next says, except where that would
// orphan volumes. noDisks is why next has no disks, if it has none.
func (d *Driver) apply(ctx context.Context, next *config.NodeConfig, noDisks error) {
	logger := klog.FromContext(ctx)
	if !slices.Equal(next.Notes, d.reloads.notes) {
		for _, n := range next.Notes {
			logger.Info("Node config discovery", "note", n)
		}
		d.reloads.notes = next.Notes
	}
	cur := d.current()
	wanted := map[string]config.Disk{}
	for _, dc := range next.Disks {
		wanted[dc.Name] = dc
	}
	changed := false
	kept := map[string]*disk{}
	refused := map[string]string{}
	for _, dk := range cur.list {
		dc, ok := wanted[dk.name]
		diff := storeChanges(dk.conf, dc)
		if ok && len(diff) == 0 {
			changed = d.updateDisk(ctx, dk, dc) || changed
			kept[dk.name] = dk
			continue
		}
		why := "it is no longer in the node config"
		if ok {
			why = "its " + strings.Join(diff, ", ") + " changed in the node config"
		}
		if msg := dk.retire(ctx); msg != "" {
			refused[dk.name] = fmt.Sprintf("Kept serving disk %q as before although %s: %s. Nothing on the disk was touched. Move or reclaim its volumes and snapshots first (delete their PVCs and VolumeSnapshots), then the change applies by itself.", dk.name, why, msg)
			kept[dk.name] = dk
			continue
		}
		if err := dk.backend.Close(); err != nil {
			logger.Error(err, "Releasing the disk no longer served", "disk", dk.name)
		}
		logger.Info("Stopped serving disk", "disk", dk.name, "reason", why)
		changed = true
	}
	var list []*disk
	for _, dc := range next.Disks {
		if dk, ok := kept[dc.Name]; ok {
			list = append(list, dk)
			delete(kept, dc.Name)
			continue
		}
		// A disk kept although the config dropped or changed it still
		// serves its store: a new disk on the same path, filesystem or
		// volume group (a rename, an explicit entry for a discovered
		// disk) would serve the same volumes under a second name.
		if err := config.CheckAlongside(servedConfigs(kept, list), dc); err != nil {
			refused[dc.Name] = fmt.Sprintf("Did not start disk %q: %v. Another disk still serves that storage; move or reclaim its volumes first.", dc.Name, err)
			continue
		}
		dk := d.newDisk(dc)
		if err := dk.start(ctx); err != nil {
			logger.Error(err, "New disk unavailable, starting it again at every status refresh", "disk", dk.name)
		} else {
			logger.Info("Serving new disk", "disk", dk.name, "backend", dc.Backend, "deviceClass", dc.DeviceClass)
		}
		list = append(list, dk)
		changed = true
	}
	// Disks kept although the config dropped them go last.
	for _, dk := range cur.list {
		if kept[dk.name] == dk {
			list = append(list, dk)
		}
	}
	d.reportRefusals(ctx, refused)
	d.checkMaxVolumes(ctx, next.MaxVolumes)
	d.discovers.Store(next.Discovers)
	d.skipped.Store(&next.Skipped)
	if changed || (cur.noDisks == nil) != (noDisks == nil || len(list) > 0) {
		d.set.Store(newDiskSet(list, noDisks))
		logger.Info("Applied node config", "section", next.Section, "disks", len(list))
		d.triggerStatus()
	}
}

// storeChanges names what differs between where two configs keep a disk's
// volumes; a disk whose store changed is a different disk.
func storeChanges(a, b config.Disk) []string {
	var diff []string
	if a.Backend != b.Backend {
		diff = append(diff, "backend")
	}
	if a.Path != b.Path {
		diff = append(diff, "path")
	}
	if a.VolumeGroup != b.VolumeGroup || a.Device != b.Device || a.AllowInitialize != b.AllowInitialize {
		diff = append(diff, "volume group")
	}
	return diff
}

// updateDisk applies a new device class and reserve to a served disk.
func (d *Driver) updateDisk(ctx context.Context, dk *disk, dc config.Disk) bool {
	logger := klog.FromContext(ctx)
	changed := false
	if dc.DeviceClass != dk.conf.DeviceClass {
		logger.Info("Disk's device class changed", "disk", dk.name, "from", dk.conf.DeviceClass, "to", dc.DeviceClass)
		dk.deviceClass.Store(&dc.DeviceClass)
		changed = true
	}
	if dc.ReservedBytes() != dk.conf.ReservedBytes() {
		logger.Info("Disk's reserve changed", "disk", dk.name, "from", dk.conf.ReservedBytes(), "to", dc.ReservedBytes())
		dk.backend.SetReserved(dc.ReservedBytes())
		changed = true
	}
	dk.conf = dc
	return changed
}

// reportRefusals warns about each refused disk once per distinct message.
func (d *Driver) reportRefusals(ctx context.Context, refused map[string]string) {
	for name, msg := range refused {
		if d.reloads.refused[name] == msg {
			continue
		}
		klog.FromContext(ctx).Info("Node config change refused", "disk", name, "reason", msg)
		d.event(ctx, corev1.EventTypeWarning, ReasonConfigChangeRefused, msg)
	}
	d.reloads.refused = refused
}

// checkMaxVolumes says, once per value, that a new maxVolumes needs a
// restart: the kubelet reads NodeGetInfo once.
func (d *Driver) checkMaxVolumes(ctx context.Context, maxVolumes int64) {
	running := d.cfg.Node.MaxVolumes
	if maxVolumes == running || maxVolumes == d.reloads.maxVolumes {
		d.reloads.maxVolumes = maxVolumes
		return
	}
	d.reloads.maxVolumes = maxVolumes
	msg := fmt.Sprintf("maxVolumes changed from %d to %d in the node config; the kubelet reads it once, so it applies when diskfit-csi restarts on this node", running, maxVolumes)
	klog.FromContext(ctx).Info("Node config change needs a restart", "reason", msg)
	d.event(ctx, corev1.EventTypeWarning, ReasonRestartNeeded, msg)
}

func (d *Driver) event(ctx context.Context, eventType, reason, message string) {
	if d.cfg.Events != nil {
		d.cfg.Events.Event(ctx, eventType, reason, message)
	}
}

// hold keeps the disk from being retired until release is called, so that
// nothing put on it can be left on a disk no longer served. It fails when
// the disk was retired.
func (dk *disk) hold() (release func(), err error) {
	dk.use.RLock()
	if dk.retired {
		dk.use.RUnlock()
		return nil, status.Errorf(codes.ResourceExhausted, "disk %s was removed from the node config", dk.name)
	}
	return dk.use.RUnlock, nil
}

// retire stops the disk taking anything new when nothing served is on it,
// and otherwise says what is on it. A disk that cannot be read is kept:
// one that could not start, or is unhealthy, may well hold volumes (a
// failed disk is exactly that), and serving it keeps it in the DiskNode,
// where its failure shows. A restart drops it.
func (dk *disk) retire(ctx context.Context) string {
	dk.use.Lock()
	defer dk.use.Unlock()
	if err := dk.unavailable(); err != nil {
		return fmt.Sprintf("it could not be started, so whether it holds volumes cannot be told (%v)", err)
	}
	if err := dk.backend.Health(ctx); err != nil {
		return fmt.Sprintf("it is unhealthy, so whether it holds volumes cannot be told (%v)", err)
	}
	vols, err := dk.backend.ListVolumes(ctx)
	if err != nil {
		return fmt.Sprintf("its volumes cannot be listed (%v)", err)
	}
	snaps, err := dk.backend.ListSnapshots(ctx)
	if err != nil {
		return fmt.Sprintf("its snapshots cannot be listed (%v)", err)
	}
	if len(vols)+len(snaps) > 0 {
		return fmt.Sprintf("it holds %s and %s that would be orphaned", count(len(vols), "volume"), count(len(snaps), "snapshot"))
	}
	// Only a driver serving the disk zeroes what was deleted from it.
	if w, ok := dk.backend.(backend.Wiping); ok {
		n, err := w.PendingWipes(ctx)
		if err != nil {
			return fmt.Sprintf("whether deleted volumes on it are still to be zeroed cannot be told (%v)", err)
		}
		if n > 0 {
			return fmt.Sprintf("it still zeroes %s of deleted volumes or snapshots before their space is free", count(n, "logical volume"))
		}
	}
	dk.retired = true
	return ""
}

func count(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// servedConfigs returns the configs of the disks that will be served:
// those kept and those already in the new list.
func servedConfigs(kept map[string]*disk, list []*disk) []config.Disk {
	var out []config.Disk
	for _, dk := range kept {
		out = append(out, dk.conf)
	}
	for _, dk := range list {
		out = append(out, dk.conf)
	}
	return out
}
