package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/diskfit/diskfit/apis/client/clientset/versioned"
	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/test/cluster"
)

// Load waves: the rules the run is checked against.
const (
	// overfillEvery makes waves 1, 1+overfillEvery, ... ask for at least
	// overfillFactor times what the empty disks hold, so that reschedules
	// after ResourceExhausted and pods left Pending are part of the run.
	// Wave 1 is one of them so that those paths have run before the
	// memory baseline is taken.
	overfillEvery  = 5
	overfillFactor = 1.2
	// maxRSSGrowth is how much a component's RSS may grow from after wave 1
	// (the baseline: caches and informers fill during the first wave) to
	// after the last wave.
	maxRSSGrowth = 0.5
	// settleFor is how long every pod must stay Running or Pending with a
	// per-disk reason before a wave counts as settled: a claim refused with
	// ResourceExhausted frees its booking, which can make a Pending pod
	// schedulable again.
	settleFor    = 10 * time.Second
	settleWithin = 10 * time.Minute
	// cleanupWithin bounds how long a wave's volumes take to be deleted.
	cleanupWithin = 5 * time.Minute
)

// components are the processes whose memory the run follows, by the name of
// their binary (the kubelets run in the localcluster binary).
var components = []string{"diskfit-scheduler", "diskfit-csi", "csi-provisioner", "csi-snapshotter", "csi-resizer", "snapshot-controller", cluster.KubeletCommand}

// loadConfig is the shape of a load run.
type loadConfig struct {
	waves, perWave int
	size           string
}

func addLoadFlags(fs *flag.FlagSet) *loadConfig {
	cfg := &loadConfig{}
	fs.IntVar(&cfg.waves, "waves", 20, "load: number of waves")
	fs.IntVar(&cfg.perWave, "per-wave", 50, "load: claims (and pods) per wave")
	fs.StringVar(&cfg.size, "size", "300Mi", "load: size of each claim in the waves that fit")
	return cfg
}

// diskKey names one disk of one node.
type diskKey struct{ node, disk string }

func (k diskKey) String() string { return k.node + "/" + k.disk }

// waveResult is what one wave measured.
type waveResult struct {
	wave, pvcs, bound, pending, unsettled int
	size                                  int64
	toBound                               []time.Duration
	exhausted                             int
	overbook                              int64 // most bytes any disk held beyond its capacity
	overbooked                            []string
	fullest                               float64 // highest fill of a disk at the wave's peak, 0..1
	orphanFiles, orphanLoops              []string
	rss                                   map[string]int64 // bytes, by component
	pids                                  map[string]int
	elapsed                               time.Duration
}

// loadRun drives the waves against one cluster.
type loadRun struct {
	demoRun
	c        *cluster.Cluster
	capacity map[diskKey]int64 // capacityBytes of each disk, from its DiskNode
	pvs      *pvTracker
}

// load starts the local cluster and runs waves of claims and pods through
// it, checking after each wave that no disk was overbooked and that no
// volume file, loop device or memory was left behind.
func load(ctx context.Context, opts cluster.Options, cfg loadConfig) error {
	size, err := resource.ParseQuantity(cfg.size)
	if err != nil {
		return fmt.Errorf("--size %q: %w", cfg.size, err)
	}
	if cfg.waves < 1 || cfg.perWave < 1 || size.Value() <= 0 {
		return errors.New("--waves, --per-wave and --size must be positive")
	}
	step("Starting a local cluster with %d nodes", len(opts.Nodes))
	c, err := cluster.Start(ctx, opts)
	if err != nil {
		return err
	}
	defer c.Stop()
	l := &loadRun{demoRun: demoRun{kube: c.Client, disks: versioned.NewForConfigOrDie(c.Config)}, c: c}
	if err := l.createClass(ctx); err != nil {
		return err
	}
	if l.capacity, err = l.capacities(ctx); err != nil {
		return err
	}
	if l.pvs, err = startPVTracker(ctx, l); err != nil {
		return err
	}

	sizes := l.waveSizes(cfg, size.Value())
	var results []waveResult
	for i, sz := range sizes {
		wave := i + 1
		step("Wave %d/%d: %d claims of %s with one pod each", wave, len(sizes), cfg.perWave, resource.NewQuantity(sz, resource.BinarySI))
		res, err := l.runWave(ctx, wave, cfg.perWave, sz)
		if err != nil {
			return fmt.Errorf("wave %d: %w", wave, err)
		}
		fmt.Printf("    bound %d, pending %d, unsettled %d, time to Bound p50 %s p99 %s, ResourceExhausted %d, overbooked disks %d, orphan files %d, orphan loops %d (%s)\n",
			res.bound, res.pending, res.unsettled, percentile(res.toBound, 50), percentile(res.toBound, 99), res.exhausted,
			len(res.overbooked), len(res.orphanFiles), len(res.orphanLoops), res.elapsed.Round(time.Second))
		results = append(results, res)
	}
	printWaves(results)
	printMemory(results)
	return summarize(results)
}

// capacities reads every disk's capacityBytes from the DiskNodes.
func (l *loadRun) capacities(ctx context.Context) (map[diskKey]int64, error) {
	list, err := l.disks.DiskfitV1alpha1().DiskNodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	caps := map[diskKey]int64{}
	for _, dn := range list.Items {
		for _, d := range dn.Status.Disks {
			caps[diskKey{dn.Name, d.Name}] = d.CapacityBytes
		}
	}
	return caps, nil
}

// fits is how many claims of size the empty disks hold.
func (l *loadRun) fits(size int64) int {
	n := 0
	for _, capacity := range l.capacity {
		n += int(capacity / diskfit.VolumeBytes(size, false))
	}
	return n
}

// waveSizes gives each wave's claim size. The count per wave stays fixed
// (waves x per-wave claims in all); an overfill wave takes the smallest
// claim size, in MiB steps, at which per-wave claims are at least
// overfillFactor times what fits.
func (l *loadRun) waveSizes(cfg loadConfig, size int64) []int64 {
	overfill := size
	for float64(l.fits(overfill))*overfillFactor > float64(cfg.perWave) {
		overfill += 1 << 20
	}
	fmt.Printf("    the empty disks hold %d claims of %s, %d of %s (every %dth wave from the first)\n",
		l.fits(size), resource.NewQuantity(size, resource.BinarySI), l.fits(overfill), resource.NewQuantity(overfill, resource.BinarySI), overfillEvery)
	sizes := make([]int64, cfg.waves)
	for i := range sizes {
		sizes[i] = size
		if i%overfillEvery == 0 {
			sizes[i] = overfill
		}
	}
	return sizes
}

func (l *loadRun) runWave(ctx context.Context, wave, count int, size int64) (waveResult, error) {
	res := waveResult{wave: wave, pvcs: count, size: size}
	start := time.Now()
	ns := fmt.Sprintf("load-%d", wave)
	if _, err := l.kube.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return res, err
	}
	l.pvs.reset()
	bound := newBindClock()
	factory := informers.NewSharedInformerFactoryWithOptions(l.kube, 0, informers.WithNamespace(ns))
	pvcInformer := factory.Core().V1().PersistentVolumeClaims().Informer()
	if _, err := pvcInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    bound.observe,
		UpdateFunc: func(_, obj any) { bound.observe(obj) },
	}); err != nil {
		return res, err
	}
	pods := factory.Core().V1().Pods().Lister()
	claims := factory.Core().V1().PersistentVolumeClaims().Lister()
	informerCtx, stopInformers := context.WithCancel(ctx)
	defer stopInformers()
	factory.Start(informerCtx.Done())
	factory.WaitForCacheSync(informerCtx.Done())

	for i := range count {
		name := fmt.Sprintf("c%03d", i)
		bound.created(name)
		if _, err := l.kube.CoreV1().PersistentVolumeClaims(ns).Create(ctx, loadClaim(name, size), metav1.CreateOptions{}); err != nil {
			return res, err
		}
		if _, err := l.kube.CoreV1().Pods(ns).Create(ctx, loadPod(name), metav1.CreateOptions{}); err != nil {
			return res, err
		}
	}

	settledSince := time.Time{}
	err := wait.PollUntilContextTimeout(ctx, time.Second, settleWithin, true, func(context.Context) (bool, error) {
		list, err := pods.Pods(ns).List(labels.Everything())
		if err != nil {
			return false, err
		}
		res.pending, res.unsettled = 0, 0
		for _, pod := range list {
			switch {
			case pod.Status.Phase == v1.PodRunning:
			case pendingForDisks(pod) && !provisioning(claims, pod):
				res.pending++
			default:
				res.unsettled++
			}
		}
		res.unsettled += count - len(list)
		if res.unsettled > 0 {
			settledSince = time.Time{}
			return false, nil
		}
		if settledSince.IsZero() {
			settledSince = time.Now()
		}
		return time.Since(settledSince) >= settleFor, nil
	})
	if err != nil && ctx.Err() != nil {
		return res, err
	}
	res.toBound = bound.durations()
	res.bound = len(res.toBound)
	if res.exhausted, err = l.countExhausted(ctx, ns); err != nil {
		return res, err
	}

	// A graceful delete, as kubectl's: the kubelet unmounts the volume
	// before the pod is gone, and only then is the claim released. (With
	// a grace period of 0, the pods' own, the API server would remove the
	// pods at once.)
	if err := l.kube.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](1)}, metav1.ListOptions{}); err != nil {
		return res, err
	}
	if err := l.kube.CoreV1().PersistentVolumeClaims(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		return res, err
	}
	if err := l.pvs.waitGone(ctx, ns); err != nil {
		return res, err
	}
	if err := l.kube.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
		return res, err
	}
	res.overbook, res.overbooked, res.fullest = l.pvs.peak()
	res.orphanFiles = l.orphanFiles()
	if res.orphanLoops, err = l.orphanLoops(); err != nil {
		return res, err
	}
	if res.rss, res.pids, err = componentMemory(l.c.Dir); err != nil {
		return res, err
	}
	res.elapsed = time.Since(start)
	return res, nil
}

func loadClaim(name string, size int64) *v1.PersistentVolumeClaim {
	return &v1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1.PersistentVolumeClaimSpec{
			AccessModes:      []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			StorageClassName: ptr.To(demoClass),
			Resources: v1.VolumeResourceRequirements{Requests: v1.ResourceList{
				v1.ResourceStorage: *resource.NewQuantity(size, resource.BinarySI),
			}},
		},
	}
}

// loadPod is a pod using one claim, as the demo's StatefulSet pods are.
func loadPod(claim string) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: claim},
		Spec: v1.PodSpec{
			SchedulerName:                 diskfit.SchedulerName,
			TerminationGracePeriodSeconds: ptr.To[int64](0),
			Containers: []v1.Container{{
				Name: "app", Image: "registry.k8s.io/pause:3.10",
				VolumeMounts: []v1.VolumeMount{{Name: "data", MountPath: "/data"}},
			}},
			Volumes: []v1.Volume{{Name: "data", VolumeSource: v1.VolumeSource{
				PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: claim},
			}}},
		},
	}
}

// pendingForDisks reports whether the scheduler has given up on the pod for
// lack of disk space, naming the disks.
func pendingForDisks(pod *v1.Pod) bool {
	if pod.Status.Phase != v1.PodPending {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse {
			return strings.Contains(c.Message, "largest free disk") || strings.Contains(c.Message, "do not fit")
		}
	}
	return false
}

// provisioning reports whether the pod's claim has a node selected: the
// pod is still being placed, whatever an earlier attempt said.
func provisioning(claims corelisters.PersistentVolumeClaimLister, pod *v1.Pod) bool {
	pvc, err := claims.PersistentVolumeClaims(pod.Namespace).Get(pod.Name)
	return err == nil && pvc.Annotations[diskfit.SelectedNodeAnnotation] != ""
}

func (l *loadRun) countExhausted(ctx context.Context, ns string) (int, error) {
	events, err := l.kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range events.Items {
		if e.Reason == "ProvisioningFailed" && strings.Contains(e.Message, "ResourceExhausted") {
			n += int(max(e.Count, 1))
		}
	}
	return n, nil
}

// bindClock times claims from creation to Bound. The creation time is taken
// on the client just before the create request: metadata.creationTimestamp
// has one-second resolution (the API server runs in this process, so the
// clocks are the same).
type bindClock struct {
	mu      sync.Mutex
	start   map[string]time.Time
	toBound map[string]time.Duration
}

func newBindClock() *bindClock {
	return &bindClock{start: map[string]time.Time{}, toBound: map[string]time.Duration{}}
}

func (b *bindClock) created(name string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.start[name] = time.Now()
}

func (b *bindClock) observe(obj any) {
	pvc, ok := obj.(*v1.PersistentVolumeClaim)
	if !ok || pvc.Status.Phase != v1.ClaimBound {
		return
	}
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, seen := b.toBound[pvc.Name]; !seen {
		if start, ok := b.start[pvc.Name]; ok {
			b.toBound[pvc.Name] = now.Sub(start)
		}
	}
}

func (b *bindClock) durations() []time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]time.Duration, 0, len(b.toBound))
	for _, d := range b.toBound {
		out = append(out, d)
	}
	return out
}

// pvTracker follows diskfit PVs and records, per disk, the most bytes of
// volumes the disk held at once since the last reset.
type pvTracker struct {
	l      *loadRun
	lister cache.Indexer

	mu       sync.Mutex
	peakUsed map[diskKey]int64
}

func startPVTracker(ctx context.Context, l *loadRun) (*pvTracker, error) {
	t := &pvTracker{l: l, peakUsed: map[diskKey]int64{}}
	factory := informers.NewSharedInformerFactory(l.kube, 0)
	informer := factory.Core().V1().PersistentVolumes().Informer()
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { t.update() },
		UpdateFunc: func(_, _ any) { t.update() },
	}); err != nil {
		return nil, err
	}
	t.lister = informer.GetIndexer()
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
		return nil, ctx.Err()
	}
	return t, nil
}

// volumeDisk returns the node and disk of a diskfit PV (diskfit.PVLocation)
// and its size.
func volumeDisk(pv *v1.PersistentVolume) (diskKey, int64, bool) {
	loc, ok := diskfit.PVLocation(pv)
	if !ok {
		return diskKey{}, 0, false
	}
	capacity := pv.Spec.Capacity[v1.ResourceStorage]
	return diskKey{node: loc.Node, disk: loc.Disk}, capacity.Value(), true
}

func (t *pvTracker) update() {
	used := map[diskKey]int64{}
	for _, obj := range t.lister.List() {
		if key, size, ok := volumeDisk(obj.(*v1.PersistentVolume)); ok {
			used[key] += size
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for key, n := range used {
		t.peakUsed[key] = max(t.peakUsed[key], n)
	}
}

func (t *pvTracker) reset() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.peakUsed = map[diskKey]int64{}
}

// peak returns the most bytes a disk held beyond its capacity, the disks
// that did, and the highest fill of any disk.
func (t *pvTracker) peak() (overbook int64, overbooked []string, fullest float64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for key, used := range t.peakUsed {
		capacity, known := t.l.capacity[key]
		if !known {
			overbooked = append(overbooked, key.String()+" (no such disk)")
			continue
		}
		if used > capacity {
			overbook = max(overbook, used-capacity)
			overbooked = append(overbooked, fmt.Sprintf("%s: %s of volumes on %s", key, resource.NewQuantity(used, resource.BinarySI), resource.NewQuantity(capacity, resource.BinarySI)))
		}
		if capacity > 0 {
			fullest = max(fullest, float64(used)/float64(capacity))
		}
	}
	sort.Strings(overbooked)
	return overbook, overbooked, fullest
}

// waitGone waits until no PV is bound to a claim of namespace ns.
func (t *pvTracker) waitGone(ctx context.Context, ns string) error {
	var left []string
	err := wait.PollUntilContextTimeout(ctx, time.Second, cleanupWithin, true, func(context.Context) (bool, error) {
		left = left[:0]
		for _, obj := range t.lister.List() {
			pv := obj.(*v1.PersistentVolume)
			if pv.Spec.ClaimRef != nil && pv.Spec.ClaimRef.Namespace == ns {
				left = append(left, fmt.Sprintf("%s (%s, claim %s)", pv.Name, pv.Status.Phase, pv.Spec.ClaimRef.Name))
			}
		}
		return len(left) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("volumes of %s not deleted after %s: %s: %w", ns, cleanupWithin, strings.Join(left, ", "), err)
	}
	return nil
}

// orphanFiles lists what is left in the disks' volume and snapshot
// directories (the file backend's layout, docs/csi-driver.md).
func (l *loadRun) orphanFiles() []string {
	var found []string
	for key := range l.capacity {
		for _, sub := range []string{"volumes", "snapshots"} {
			dir := filepath.Join(l.c.Nodes[key.node].DiskPath(key.disk), "diskfit", sub)
			entries, err := os.ReadDir(dir)
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				found = append(found, fmt.Sprintf("%s: %v", dir, err))
			}
			for _, e := range entries {
				found = append(found, filepath.Join(dir, e.Name()))
			}
		}
	}
	sort.Strings(found)
	return found
}

// orphanLoops lists loop devices backed by a file under a disk's diskfit
// directory.
func (l *loadRun) orphanLoops() ([]string, error) {
	var found []string
	for key := range l.capacity {
		dir := filepath.Join(l.c.Nodes[key.node].DiskPath(key.disk), "diskfit")
		loops, err := cluster.LoopsBackedUnder(dir)
		if err != nil {
			return nil, err
		}
		for _, loop := range loops {
			found = append(found, loop+" on "+key.node+"/"+key.disk)
		}
	}
	sort.Strings(found)
	return found, nil
}

// componentMemory reads VmRSS of the run's component processes: those whose
// command line names a path in the run's directory. A component of a node
// is named binary/node.
func componentMemory(runDir string) (map[string]int64, map[string]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, nil, err
	}
	rss, pids := map[string]int64{}, map[string]int{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.Contains(string(raw), runDir+"/") {
			continue
		}
		args := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
		name := filepath.Base(args[0])
		if len(args) > 1 && args[1] == cluster.KubeletCommand {
			name = cluster.KubeletCommand
		}
		if !slices.Contains(components, name) {
			continue // a short-lived helper such as mount or losetup
		}
		if node := nodeOf(args, runDir); node != "" && name != "csi-resizer" {
			name += "/" + node
		}
		status, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue // it just ended
		}
		for _, line := range strings.Split(string(status), "\n") {
			if kb, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(kb), "kB")), 10, 64)
				if err != nil {
					return nil, nil, fmt.Errorf("VmRSS of %s: %w", name, err)
				}
				rss[name], pids[name] = n<<10, pid
			}
		}
	}
	return rss, pids, nil
}

// nodeOf finds the node whose directory (runDir/nodes/<node>/...) an
// argument names.
func nodeOf(args []string, runDir string) string {
	prefix := filepath.Join(runDir, "nodes") + "/"
	for _, a := range args {
		if i := strings.Index(a, prefix); i >= 0 {
			rest := a[i+len(prefix):]
			if j := strings.IndexByte(rest, '/'); j > 0 {
				return rest[:j]
			}
		}
	}
	return ""
}

// percentile returns the p-th percentile (nearest rank) of ds.
func percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	sorted := slices.Sorted(slices.Values(ds))
	rank := (p*len(sorted) + 99) / 100
	return sorted[max(rank, 1)-1].Round(10 * time.Millisecond)
}

func mib(n int64) string { return strconv.FormatInt(n>>20, 10) }

func printWaves(results []waveResult) {
	step("Waves")
	w := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "WAVE\tCLAIM\tPVCS\tBOUND\tPENDING\tUNSETTLED\tP50 TO BOUND\tP99 TO BOUND\tRESOURCEEXHAUSTED\tFULLEST DISK\tMAX OVERBOOK MiB\tORPHAN FILES\tORPHAN LOOPS\tWAVE TIME\t")
	for _, r := range results {
		fmt.Fprintf(w, "%d\t%s\t%d\t%d\t%d\t%d\t%s\t%s\t%d\t%.0f%%\t%s\t%d\t%d\t%s\t\n", r.wave, resource.NewQuantity(r.size, resource.BinarySI),
			r.pvcs, r.bound, r.pending, r.unsettled, percentile(r.toBound, 50), percentile(r.toBound, 99), r.exhausted,
			100*r.fullest, mib(r.overbook), len(r.orphanFiles), len(r.orphanLoops), r.elapsed.Round(time.Second))
	}
	w.Flush()
}

// printMemory prints one row per component: its RSS in MiB after each wave.
func printMemory(results []waveResult) {
	step("RSS after each wave (MiB)")
	w := tabwriter.NewWriter(os.Stdout, 2, 4, 1, ' ', tabwriter.AlignRight)
	fmt.Fprint(w, "COMPONENT\t")
	for _, r := range results {
		fmt.Fprintf(w, "%d\t", r.wave)
	}
	fmt.Fprintln(w)
	for _, name := range componentNames(results) {
		fmt.Fprintf(w, "%s\t", name)
		for _, r := range results {
			if n, ok := r.rss[name]; ok {
				fmt.Fprintf(w, "%s\t", mib(n))
			} else {
				fmt.Fprint(w, "-\t")
			}
		}
		fmt.Fprintln(w)
	}
	w.Flush()
}

func componentNames(results []waveResult) []string {
	var names []string
	for _, r := range results {
		for name := range r.rss {
			if !slices.Contains(names, name) {
				names = append(names, name)
			}
		}
	}
	sort.Strings(names)
	return names
}

// summarize prints the run's totals and returns an error naming every
// broken invariant: a disk overbooked, a claim the driver refused with
// ResourceExhausted, a volume file or loop device left
// after a wave, a wave that did not settle, a component that restarted or
// whose RSS grew more than maxRSSGrowth from after wave 1 to after the last
// wave.
func summarize(results []waveResult) error {
	var all []time.Duration
	var pvcs, bound, pending, exhausted int
	var failures []string
	for _, r := range results {
		all = append(all, r.toBound...)
		pvcs, bound, pending, exhausted = pvcs+r.pvcs, bound+r.bound, pending+r.pending, exhausted+r.exhausted
		for _, d := range r.overbooked {
			failures = append(failures, fmt.Sprintf("wave %d: disk overbooked: %s", r.wave, d))
		}
		for _, f := range append(r.orphanFiles, r.orphanLoops...) {
			failures = append(failures, fmt.Sprintf("wave %d: left behind: %s", r.wave, f))
		}
		if r.unsettled > 0 {
			failures = append(failures, fmt.Sprintf("wave %d: %d pods neither Running nor Pending for disk space after %s", r.wave, r.unsettled, settleWithin))
		}
		// What the scheduler promises: it never sends a claim to a disk
		// without room for it (overbooking is checked against the
		// DiskNodes' capacity, which is partly the driver's own count).
		if r.exhausted > 0 {
			failures = append(failures, fmt.Sprintf("wave %d: the driver refused %d claims with ResourceExhausted", r.wave, r.exhausted))
		}
	}
	step("Summary")
	fmt.Printf("claims %d, bound %d, left Pending %d; time to Bound p50 %s, p99 %s; ResourceExhausted reschedules %d\n",
		pvcs, bound, pending, percentile(all, 50), percentile(all, 99), exhausted)
	fmt.Printf("overbooked disks %d, orphan volume files %d, orphan loop devices %d\n",
		countAll(results, func(r waveResult) int { return len(r.overbooked) }),
		countAll(results, func(r waveResult) int { return len(r.orphanFiles) }),
		countAll(results, func(r waveResult) int { return len(r.orphanLoops) }))
	first, last := results[0], results[len(results)-1]
	fmt.Printf("RSS growth from after wave %d to after wave %d (limit +%.0f%%):\n", first.wave, last.wave, 100*maxRSSGrowth)
	for _, name := range componentNames(results) {
		before, after := first.rss[name], last.rss[name]
		growth := 0.0
		if before > 0 {
			growth = float64(after)/float64(before) - 1
		}
		fmt.Printf("    %-32s %5s -> %5s MiB  %+6.1f%%\n", name, mib(before), mib(after), 100*growth)
		if len(results) > 1 && growth > maxRSSGrowth {
			failures = append(failures, fmt.Sprintf("%s: RSS grew %.0f%% from wave %d to wave %d", name, 100*growth, first.wave, last.wave))
		}
		for _, r := range results[1:] {
			if pid, ok := r.pids[name]; !ok || pid != first.pids[name] {
				failures = append(failures, fmt.Sprintf("%s: process changed or gone by the end of wave %d", name, r.wave))
				break
			}
		}
	}
	if len(failures) > 0 {
		return fmt.Errorf("load: %d invariants broken:\n  %s", len(failures), strings.Join(failures, "\n  "))
	}
	fmt.Println("every invariant held")
	return nil
}

func countAll(results []waveResult, f func(waveResult) int) int {
	n := 0
	for _, r := range results {
		n += f(r)
	}
	return n
}
