// Package ledger keeps the scheduler's view of free space on every disk of
// every node:
//
//	pending    = Σ unbound PVCs of a diskfit StorageClass annotated with
//	             this node and disk
//	           + Σ in-memory reservations not yet visible as such
//	free(disk) = max(0, min( DiskNode reported free,
//	                         capacity − Σ PVs on the disk − pending ))
//
// This is DESIGN.md's formula, with one change: a PV counts at the size its
// claim's volume has (status.capacity), plus the rest of its capacity,
// which external-resizer wrote before the node grew the volume, unless the
// disk could never grant that growth (diskState.free). It relies on what
// the node plugin publishes as capacity: free space plus the space of the
// disk's volumes (see docs/design.md). So capacity − Σ PVs − pending is the free space less the
// claims the report cannot show yet, even from a report that predates the
// latest volumes, and space taken by anything else lowers capacity itself.
// Taking pending off the reported free as well would count a volume twice
// between the report that shows it and the PV that binds it, and leave pods
// refused for space that is there, with no event to retry them.
//
// An annotated PVC counts only when its StorageClass is known to be
// provisioned by the diskfit driver (SetStorageClass): anyone who may
// create a PVC can write the annotations, on a claim no diskfit provisioner
// will serve. Sums of bytes never wrap (total, packing.SatAdd).
//
// Everything but the reservations is fed from API objects (DiskNodes, PVs,
// PVCs, StorageClasses), so a restarted scheduler rebuilds the same ledger
// from its informers, in whatever order they deliver. Each claim is counted
// once, by its most authoritative source: its PV if one exists, else its
// annotated PVC, else a reservation. Per-disk totals are kept up to date
// incrementally, so reading a node's disks costs a map lookup and a copy.
//
// The package uses API types but no scheduler framework, so simulations
// can drive it directly.
package ledger

import (
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	storagehelpers "k8s.io/component-helpers/storage/volume"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
	"github.com/diskfit/diskfit/scheduler-plugin/packing"
)

// usage is one claim's space on one disk.
type usage struct {
	loc   diskfit.Location
	bytes int64
	// growth is the part of a PV's capacity beyond the size its claim's
	// volume has (the claim's status.capacity): an expansion that
	// external-resizer wrote into the PV and the node has not done yet.
	// It is booked unless the disk could never grant it (diskState.free).
	growth int64
}

// source is where a claim's usage is known from, most authoritative first.
type source int

const (
	sourcePV source = iota
	sourcePVC
	sourceReservation
	numSources
)

// claimEntry holds what every source says about one claim and what the
// per-disk totals currently include for it.
type claimEntry struct {
	has        [numSources]bool
	usage      [numSources]usage
	applied    bool
	current    usage
	currentSrc source
	// pod owning the reservation, if any.
	pod types.UID
	// reservedFree is the free space of the reserved disk just before the
	// reservation took its share.
	reservedFree int64
}

func (e *claimEntry) effective() (usage, source, bool) {
	for s := sourcePV; s < numSources; s++ {
		if e.has[s] {
			return e.usage[s], s, true
		}
	}
	return usage{}, 0, false
}

type diskState struct {
	name         string
	deviceClass  string
	capacity     int64
	reportedFree int64
	healthy      bool
	// unschedulable is set when the DiskNode's spec takes the disk out
	// of service for new volumes.
	unschedulable bool
	// known is false for a disk that volumes point at but the node's
	// DiskNode does not list; it is never offered for placement.
	known bool
	// used is everything the ledger counts on the disk; pending is the
	// part the node plugin cannot have reported yet (annotated PVCs and
	// reservations, not PVs).
	used    total
	pending total
	// growths are the expansions waiting for the node (usage.growth), by
	// claim key.
	growths []growth
}

type growth struct {
	key   string
	bytes int64
}

// setGrowth records (bytes > 0) or forgets the pending expansion of a
// claim's volume on the disk.
func (d *diskState) setGrowth(key string, bytes int64) {
	d.growths = slices.DeleteFunc(d.growths, func(g growth) bool { return g.key == key })
	if bytes > 0 {
		d.growths = append(d.growths, growth{key, bytes})
	}
}

// free is the disk's free space as the ledger counts it: the DiskNode's
// report, or its capacity less what the ledger counts, whichever is
// smaller. A pending expansion counts unless the disk could not grant it
// even with no claim pending: its capacity less the PVs on it (at their
// claims' sizes) is the most the node's NodeExpandVolume can ever find
// free for it, and the kubelet retries it whenever it may, in no order the
// ledger knows. So every expansion the node may grant is booked, and one
// it never can (a typo, a tenant's 8Ei), which the node keeps refusing
// (ResourceExhausted), books nothing: booked, it would keep every other
// claim off a disk that may be nearly empty for as long as its claim asks.
// A volume the node has grown already still fits this bound, as its
// growth is part of the capacity the node reports.
func (d *diskState) free() int64 {
	used := d.used.value()
	grantable := packing.SatSub(d.capacity, packing.SatSub(used, d.pending.value()))
	for _, g := range d.growths {
		if g.bytes <= grantable {
			used = packing.SatAdd(used, g.bytes)
		}
	}
	return max(min(packing.SatSub(d.capacity, used), d.reportedFree), 0)
}

func (d *diskState) holdsUsage() bool {
	return !d.used.zero() || !d.pending.zero() || len(d.growths) > 0
}

// total is an exact running sum of byte counts. Claims are added and taken
// away again in any order, and each may be as large as MaxInt64 (an 8Ei
// request): an int64 sum would wrap into a negative "used" that makes a
// full disk look empty, and a merely saturating one would not come back to
// the right value when a claim is taken away after it saturated (two 8Ei
// claims, one deleted, would leave the disk looking empty). 128 bits hold
// any sum of fewer than 2^63 int64 terms, so subtracting what was added is
// always exact; readers get the sum clamped to int64 (value).
type total struct {
	hi int64
	lo uint64
}

func (t *total) add(v int64) {
	lo, carry := bits.Add64(t.lo, uint64(v), 0)
	t.lo = lo
	// v>>63 sign-extends v to 128 bits.
	t.hi += int64(carry) + v>>63
}

// value is the sum clamped to the int64 range.
func (t total) value() int64 {
	switch {
	case t.hi == 0 && t.lo <= math.MaxInt64, t.hi == -1 && t.lo > math.MaxInt64:
		return int64(t.lo)
	case t.hi < 0:
		return math.MinInt64
	default:
		return math.MaxInt64
	}
}

func (t total) zero() bool { return t == total{} }

type nodeState struct {
	hasDiskNode     bool
	observed        time.Time
	resourceVersion string
	disks           []diskState
}

func (n *nodeState) disk(name string) *diskState {
	for i := range n.disks {
		if n.disks[i].name == name {
			return &n.disks[i]
		}
	}
	return nil
}

// NodeInfo describes a node's DiskNode as the ledger last saw it.
type NodeInfo struct {
	// HasDiskNode is false when no DiskNode exists for the node.
	HasDiskNode bool
	// Observed is the DiskNode's status.observedTime.
	Observed time.Time
}

// Ledger is safe for concurrent use. The zero value is not usable; call New.
type Ledger struct {
	mu     sync.RWMutex
	nodes  map[string]*nodeState
	claims map[string]*claimEntry
	// pvClaim maps a PV name to the claim key it was counted under, so a
	// PV that loses its claimRef or is deleted releases the right entry.
	pvClaim map[string]string
	// reservations maps a pod to the claim keys it reserved.
	reservations map[types.UID][]string
	// classes are the StorageClasses provisioned by the diskfit driver.
	classes map[string]struct{}
	// placed holds every unbound PVC annotated with a node and a disk,
	// whether or not its class makes it count, and byClass the keys of
	// those naming each class, so that a StorageClass event re-evaluates
	// exactly the claims that name it.
	placed  map[string]placedClaim
	byClass map[string]map[string]struct{}
	// has holds, by claim key, the size a bound claim's volume has (its
	// status.capacity), which tells a PV's pending expansion (usage.growth).
	has map[string]int64
}

// placedClaim is an unbound PVC annotated with a node and a disk.
type placedClaim struct {
	class string
	u     usage
}

// New returns an empty ledger.
func New() *Ledger {
	return &Ledger{
		nodes:        map[string]*nodeState{},
		claims:       map[string]*claimEntry{},
		pvClaim:      map[string]string{},
		reservations: map[types.UID][]string{},
		classes:      map[string]struct{}{},
		placed:       map[string]placedClaim{},
		byClass:      map[string]map[string]struct{}{},
		has:          map[string]int64{},
	}
}

func (l *Ledger) node(name string) *nodeState {
	n := l.nodes[name]
	if n == nil {
		n = &nodeState{}
		l.nodes[name] = n
	}
	return n
}

// addUsage adds a claim's usage to its disk's totals, or with remove set
// takes it away, creating an unknown disk entry when the DiskNode does not
// (yet) list the disk, so the usage is not lost when it does.
func (l *Ledger) addUsage(key string, u usage, src source, remove bool) {
	n := l.node(u.loc.Node)
	d := n.disk(u.loc.Disk)
	if d == nil {
		n.disks = append(n.disks, diskState{name: u.loc.Disk})
		d = &n.disks[len(n.disks)-1]
	}
	delta, growth := u.bytes, u.growth
	if remove {
		delta, growth = -u.bytes, 0
	}
	d.used.add(delta)
	if src != sourcePV {
		d.pending.add(delta)
	}
	d.setGrowth(key, growth)
}

// settle brings the per-disk totals in line with the entry's effective
// usage and drops the entry when nothing refers to it any more.
func (l *Ledger) settle(key string, e *claimEntry) {
	eff, src, ok := e.effective()
	if e.applied && (!ok || eff != e.current || src != e.currentSrc) {
		l.addUsage(key, e.current, e.currentSrc, true)
		e.applied = false
	}
	if ok && !e.applied {
		l.addUsage(key, eff, src, false)
		e.current = eff
		e.currentSrc = src
		e.applied = true
	}
	if !ok {
		delete(l.claims, key)
	}
}

func (l *Ledger) entry(key string) *claimEntry {
	e := l.claims[key]
	if e == nil {
		e = &claimEntry{}
		l.claims[key] = e
	}
	return e
}

// setSource records (or, with ok false, clears) what one source says about
// a claim. A PV or annotated PVC makes a reservation for the same claim
// redundant, so it is released: the space is now visible to everyone.
func (l *Ledger) setSource(key string, s source, u usage, ok bool) {
	e := l.claims[key]
	if e == nil && !ok {
		return
	}
	if e == nil {
		e = l.entry(key)
	}
	e.has[s] = ok
	e.usage[s] = u
	if ok && s != sourceReservation && e.has[sourceReservation] {
		l.dropReservation(key, e)
	}
	l.settle(key, e)
}

func (l *Ledger) dropReservation(key string, e *claimEntry) {
	e.has[sourceReservation] = false
	keys := l.reservations[e.pod]
	for i, k := range keys {
		if k == key {
			keys = append(keys[:i], keys[i+1:]...)
			break
		}
	}
	if len(keys) == 0 {
		delete(l.reservations, e.pod)
	} else {
		l.reservations[e.pod] = keys
	}
	e.pod = ""
}

// SetDiskNode records a DiskNode's disks. An update that is not newer than
// what the ledger already has (by resourceVersion) is ignored, because the
// same object arrives both from the plugin's informer and from scheduler
// events, in either order.
func (l *Ledger) SetDiskNode(dn *v1alpha1.DiskNode) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.node(dn.Name)
	if n.hasDiskNode && !newerVersion(dn.ResourceVersion, n.resourceVersion) {
		return
	}
	disks := make([]diskState, 0, len(dn.Status.Disks)+1)
	for _, ds := range dn.Status.Disks {
		d := diskState{
			name:         ds.Name,
			deviceClass:  ds.DeviceClass,
			capacity:     ds.CapacityBytes,
			reportedFree: ds.FreeBytes,
			healthy:      ds.Healthy,
			known:        true,
		}
		d.unschedulable, _ = dn.Spec.DiskUnschedulable(ds.Name)
		if old := n.disk(ds.Name); old != nil {
			d.used, d.pending, d.growths = old.used, old.pending, old.growths
		}
		disks = append(disks, d)
	}
	// Keep usage of disks the DiskNode no longer lists.
	for _, old := range n.disks {
		if old.holdsUsage() && dn.Status.Disk(old.name) == nil {
			old.known = false
			disks = append(disks, old)
		}
	}
	n.disks = disks
	n.hasDiskNode = true
	n.observed = dn.Status.ObservedTime.Time
	n.resourceVersion = dn.ResourceVersion
}

// DeleteDiskNode forgets a node's disks; usage recorded against them is kept
// in case the DiskNode comes back.
func (l *Ledger) DeleteDiskNode(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.nodes[name]
	if n == nil {
		return
	}
	n.hasDiskNode = false
	n.observed = time.Time{}
	n.resourceVersion = ""
	kept := n.disks[:0]
	for _, d := range n.disks {
		if d.holdsUsage() {
			d.known = false
			kept = append(kept, d)
		}
	}
	n.disks = kept
}

// newerVersion reports whether resourceVersion a is newer than b. Versions
// that are not numbers count as newer, so an update is never lost.
func newerVersion(a, b string) bool {
	ai, err1 := strconv.ParseUint(a, 10, 64)
	bi, err2 := strconv.ParseUint(b, 10, 64)
	return err1 != nil || err2 != nil || ai > bi
}

func pvKey(pv *v1.PersistentVolume) string {
	if ref := pv.Spec.ClaimRef; ref != nil && ref.UID != "" {
		return string(ref.UID)
	}
	return "pv/" + pv.Name
}

// SetPV records a PV. PVs of other drivers are ignored.
func (l *Ledger) SetPV(pv *v1.PersistentVolume) {
	loc, ok := diskfit.PVLocation(pv)
	l.mu.Lock()
	defer l.mu.Unlock()
	key := pvKey(pv)
	if old, had := l.pvClaim[pv.Name]; had && old != key {
		l.setSource(old, sourcePV, usage{}, false)
		delete(l.pvClaim, pv.Name)
	}
	if !ok {
		if _, had := l.pvClaim[pv.Name]; had {
			l.setSource(key, sourcePV, usage{}, false)
			delete(l.pvClaim, pv.Name)
		}
		return
	}
	l.pvClaim[pv.Name] = key
	l.setSource(key, sourcePV, l.pvUsage(key, loc, quantityBytes(pv.Spec.Capacity[v1.ResourceStorage])), true)
}

// pvUsage is the usage of a PV of capacity bytes at loc, counted for
// claim key: the part beyond the size the claim's volume has is a growth.
func (l *Ledger) pvUsage(key string, loc diskfit.Location, capacity int64) usage {
	if has, ok := l.has[key]; ok && has < capacity {
		return usage{loc: loc, bytes: has, growth: capacity - has}
	}
	return usage{loc: loc, bytes: capacity}
}

// setHas records (ok) or forgets the size a bound claim's volume has, and
// splits the claim's PV anew.
func (l *Ledger) setHas(key string, has int64, ok bool) {
	if old, had := l.has[key]; had == ok && old == has {
		return
	}
	if ok {
		l.has[key] = has
	} else {
		delete(l.has, key)
	}
	if e := l.claims[key]; e != nil && e.has[sourcePV] {
		u := e.usage[sourcePV]
		l.setSource(key, sourcePV, l.pvUsage(key, u.loc, packing.SatAdd(u.bytes, u.growth)), true)
	}
}

// DeletePV forgets a PV, releasing its space.
func (l *Ledger) DeletePV(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	key, had := l.pvClaim[name]
	if !had {
		return
	}
	delete(l.pvClaim, name)
	l.setSource(key, sourcePV, usage{}, false)
}

// ClaimSize is the number of bytes a PVC's volume will take on its disk:
// the request as the driver rounds it (diskfit.VolumeBytes). A request
// beyond int64 (1e100 is a valid quantity, whose Value is 0) is MaxInt64,
// which fits on no disk.
func ClaimSize(pvc *v1.PersistentVolumeClaim) int64 {
	block := pvc.Spec.VolumeMode != nil && *pvc.Spec.VolumeMode == v1.PersistentVolumeBlock
	return diskfit.VolumeBytes(quantityBytes(pvc.Spec.Resources.Requests[v1.ResourceStorage]), block)
}

// quantityBytes is q in bytes, clamped to [0, MaxInt64]: a quantity beyond
// int64 (whose Value may be 0) is MaxInt64, which fits on no disk.
func quantityBytes(q resource.Quantity) int64 {
	if q.Cmp(maxInt64Quantity) > 0 {
		return math.MaxInt64
	}
	return max(q.Value(), 0)
}

var maxInt64Quantity = *resource.NewQuantity(math.MaxInt64, resource.BinarySI)

// SetPVC records a PVC: an unbound one annotated with a node and a disk
// counts against that disk when its StorageClass is one of the diskfit
// driver's (SetStorageClass). The annotations alone prove nothing: anyone
// who may create a PVC can write them, on a claim no provisioner of this
// driver will ever serve. The class is the one the provisioner reads (the
// legacy annotation volume.beta.kubernetes.io/storage-class first, then
// spec.storageClassName); a claim without one never counts.
func (l *Ledger) SetPVC(pvc *v1.PersistentVolumeClaim) {
	loc, ok := diskfit.PVCLocation(pvc)
	class := storagehelpers.GetPersistentVolumeClaimClass(pvc)
	u := usage{loc: loc, bytes: ClaimSize(pvc)}
	key := string(pvc.UID)
	has, bound := pvc.Status.Capacity[v1.ResourceStorage]
	bound = bound && pvc.Spec.VolumeName != ""
	l.mu.Lock()
	defer l.mu.Unlock()
	l.setPlaced(key, class, u, ok)
	l.setSource(key, sourcePVC, u, ok && l.isDiskFitClass(class))
	l.setHas(key, quantityBytes(has), bound)
}

// CountedPVCLocation is PVCLocation for a PVC the ledger counts: one whose
// StorageClass is, as far as the ledger knows, the diskfit driver's.
func (l *Ledger) CountedPVCLocation(pvc *v1.PersistentVolumeClaim) (diskfit.Location, bool) {
	loc, ok := diskfit.PVCLocation(pvc)
	if !ok {
		return diskfit.Location{}, false
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	if !l.isDiskFitClass(storagehelpers.GetPersistentVolumeClaimClass(pvc)) {
		return diskfit.Location{}, false
	}
	return loc, true
}

func (l *Ledger) isDiskFitClass(name string) bool {
	_, ok := l.classes[name]
	return ok
}

// setPlaced records (or, with ok false, forgets) an annotated PVC and its
// class, whether or not the class makes it count.
func (l *Ledger) setPlaced(key, class string, u usage, ok bool) {
	if old, had := l.placed[key]; had && (!ok || old.class != class) {
		keys := l.byClass[old.class]
		delete(keys, key)
		if len(keys) == 0 {
			delete(l.byClass, old.class)
		}
		delete(l.placed, key)
	}
	if !ok {
		return
	}
	l.placed[key] = placedClaim{class: class, u: u}
	keys := l.byClass[class]
	if keys == nil {
		keys = map[string]struct{}{}
		l.byClass[class] = keys
	}
	keys[key] = struct{}{}
}

// SetStorageClass records whether a StorageClass is provisioned by the
// diskfit driver, and makes the annotated PVCs that name it start or stop
// counting accordingly. It reports whether that released space.
func (l *Ledger) SetStorageClass(sc *storagev1.StorageClass) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.setClass(sc.Name, diskfit.IsDiskFitClass(sc))
}

// DeleteStorageClass forgets a StorageClass: the annotated PVCs that name
// it stop counting (no provisioner serves a claim of a class that does not
// exist). It reports whether that released space.
func (l *Ledger) DeleteStorageClass(name string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.setClass(name, false)
}

func (l *Ledger) setClass(name string, ours bool) bool {
	if l.isDiskFitClass(name) == ours {
		return false
	}
	if ours {
		l.classes[name] = struct{}{}
	} else {
		delete(l.classes, name)
	}
	for key := range l.byClass[name] {
		l.setSource(key, sourcePVC, l.placed[key].u, ours)
	}
	return !ours && len(l.byClass[name]) > 0
}

// DeletePVC forgets a PVC and any reservation for it.
func (l *Ledger) DeletePVC(pvc *v1.PersistentVolumeClaim) {
	l.mu.Lock()
	defer l.mu.Unlock()
	key := string(pvc.UID)
	l.setPlaced(key, "", usage{}, false)
	l.setHas(key, 0, false)
	e := l.claims[key]
	if e == nil {
		return
	}
	if e.has[sourceReservation] {
		l.dropReservation(key, e)
	}
	e.has[sourcePVC] = false
	l.settle(key, e)
}

// Disks appends the node's placeable disks, with Free already reduced by the
// ledger, to buf and returns it with what is known about the node. Disks
// the DiskNode does not list are left out. It does not allocate when buf
// has room.
func (l *Ledger) Disks(node string, buf []packing.Disk) ([]packing.Disk, NodeInfo) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	n := l.nodes[node]
	if n == nil {
		return buf, NodeInfo{}
	}
	return appendDisks(n, buf), NodeInfo{HasDiskNode: n.hasDiskNode, Observed: n.observed}
}

func appendDisks(n *nodeState, buf []packing.Disk) []packing.Disk {
	for i := range n.disks {
		d := &n.disks[i]
		if !d.known {
			continue
		}
		free := d.free()
		buf = append(buf, packing.Disk{
			Name:          d.name,
			DeviceClass:   d.deviceClass,
			Capacity:      d.capacity,
			Free:          free,
			Healthy:       d.healthy,
			Unschedulable: d.unschedulable,
		})
	}
	return buf
}

// ErrDoesNotFit is returned by Reserve when the claims no longer fit.
type ErrDoesNotFit struct {
	// Node is the node that was tried.
	Node string
	// Reason names the disks and the shortfall.
	Reason string
}

// Error names the node and the shortfall.
func (e *ErrDoesNotFit) Error() string {
	return fmt.Sprintf("node %s: %s", e.Node, e.Reason)
}

// Reserve packs claims (sorted by packing.SortClaims) onto the node's disks
// as they are now and holds the space for pod until the claims become
// visible as annotated PVCs or PVs, or Unreserve is called. The check and
// the recording happen under one lock, so two pods can never both get the
// last space of a disk. It returns the chosen disk per claim, in claim
// order. An earlier reservation of the same pod is released first.
func (l *Ledger) Reserve(pod types.UID, node string, claims []packing.Claim, opts packing.Options) ([]string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.unreserveLocked(pod)
	if len(claims) == 0 {
		return nil, nil
	}
	var buf [packing.MaxInlineDisks]packing.Disk
	disks := buf[:0]
	if n := l.nodes[node]; n != nil {
		disks = appendDisks(n, disks)
	}
	assign := make([]int, len(claims))
	if !packing.Pack(disks, claims, opts, assign) {
		return nil, &ErrDoesNotFit{Node: node, Reason: packing.Explain(disks, claims)}
	}
	chosen := make([]string, len(claims))
	keys := make([]string, 0, len(claims))
	for i, c := range claims {
		d := &disks[assign[i]]
		chosen[i] = d.Name
		e := l.entry(c.Key)
		e.has[sourceReservation] = true
		e.usage[sourceReservation] = usage{loc: diskfit.Location{Node: node, Disk: chosen[i]}, bytes: c.Size}
		e.pod = pod
		// Claims of the pod on the same disk each see what the earlier
		// ones left.
		e.reservedFree = d.Free
		d.Free = packing.SatSub(d.Free, c.Size)
		l.settle(c.Key, e)
		keys = append(keys, c.Key)
	}
	l.reservations[pod] = keys
	return chosen, nil
}

// Unreserve releases whatever pod still holds and reports whether that
// freed any space (it does not once the claims are visible as PVCs or PVs).
// It is idempotent.
func (l *Ledger) Unreserve(pod types.UID) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.unreserveLocked(pod)
}

func (l *Ledger) unreserveLocked(pod types.UID) bool {
	freed := false
	for _, key := range l.reservations[pod] {
		if e := l.claims[key]; e != nil && e.pod == pod {
			e.has[sourceReservation] = false
			e.pod = ""
			l.settle(key, e)
			freed = true
		}
	}
	delete(l.reservations, pod)
	return freed
}

// Reservation is the disk reserved for one claim.
type Reservation struct {
	// Disk is the reserved disk's name.
	Disk string
	// FreeBefore is the disk's free space as the ledger counted it just
	// before this claim was reserved on it.
	FreeBefore int64
}

// Reservation returns what pod reserved for the claim key on node.
func (l *Ledger) Reservation(pod types.UID, node, key string) (Reservation, bool) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	e := l.claims[key]
	if e == nil || !e.has[sourceReservation] || e.pod != pod || e.usage[sourceReservation].loc.Node != node {
		return Reservation{}, false
	}
	return Reservation{Disk: e.usage[sourceReservation].loc.Disk, FreeBefore: e.reservedFree}, true
}

// ReservedDisk returns the disk reserved for the claim key by pod on node.
func (l *Ledger) ReservedDisk(pod types.UID, node, key string) (string, bool) {
	r, ok := l.Reservation(pod, node, key)
	return r.Disk, ok
}

// Reservations returns the number of pods holding reservations.
func (l *Ledger) Reservations() int {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return len(l.reservations)
}

// Used returns the bytes the ledger counts on a disk, for tests and
// debugging.
func (l *Ledger) Used(loc diskfit.Location) int64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	n := l.nodes[loc.Node]
	if n == nil {
		return 0
	}
	if d := n.disk(loc.Disk); d != nil {
		return d.used.value()
	}
	return 0
}
