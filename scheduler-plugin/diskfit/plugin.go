// Package diskfit is the DiskFit kube-scheduler plugin. It embeds the in-tree
// VolumeBinding plugin, behaves exactly like it for every volume that is not
// diskfit's, and for diskfit's unbound PVCs additionally packs all of a
// pod's claims onto the disks of each node, reserves the chosen disks, and
// has VolumeBinding's own PVC update carry the chosen disk as an annotation.
//
// A profile that uses it disables VolumeBinding and enables DiskFit at all
// of VolumeBinding's extension points.
package diskfit

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/dynamic"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	schedconfigv1 "k8s.io/kube-scheduler/config/v1"
	fwk "k8s.io/kube-scheduler/framework"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
	kubeschedv1 "k8s.io/kubernetes/pkg/scheduler/apis/config/v1"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/volumebinding"

	"github.com/diskfit/diskfit/apis/client/clientset/versioned"
	"github.com/diskfit/diskfit/apis/client/informers/externalversions"
	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
	"github.com/diskfit/diskfit/scheduler-plugin/apis/config"
	configv1 "github.com/diskfit/diskfit/scheduler-plugin/apis/config/v1"
	"github.com/diskfit/diskfit/scheduler-plugin/apis/config/validation"
	"github.com/diskfit/diskfit/scheduler-plugin/ledger"
	"github.com/diskfit/diskfit/scheduler-plugin/packing"
)

// Name is the plugin's name in registries and configuration files.
const Name = diskfit.PluginName

// DiskNodeResource is the scheduler's event resource string for DiskNodes
// (<plural>.<version>.<group>), watched through its dynamic informers.
const DiskNodeResource fwk.EventResource = "disknodes.v1alpha1." + diskfit.GroupName

// DiskFit is the plugin. It is created by New.
type DiskFit struct {
	vb         *volumebinding.VolumeBinding
	ledger     *ledger.Ledger
	pvcLister  corelisters.PersistentVolumeClaimLister
	pvcIndexer cache.Indexer
	pvLister   corelisters.PersistentVolumeLister
	scLister   storagelisters.StorageClassLister
	// snapshots reads VolumeSnapshots and their contents (source.go).
	snapshots dynamic.Interface
	opts      packing.Options
	weigh     packing.Weigher
	maxAge    time.Duration
	now       func() time.Time
	// noClaims is the shared, never modified state of pods without
	// diskfit claims.
	noClaims *stateData
	last     atomic.Pointer[lastCycle]
	// activator requeues pods waiting for space that Unreserve frees.
	activator   fwk.PodActivator
	waiting     waitingPods
	conversions diskNodeConversions
	// handlersSynced report whether the ledger's event handlers have seen
	// their informers' initial lists.
	handlersSynced []cache.InformerSynced
}

var (
	_ fwk.PreFilterPlugin   = &DiskFit{}
	_ fwk.FilterPlugin      = &DiskFit{}
	_ fwk.PreScorePlugin    = &DiskFit{}
	_ fwk.ScorePlugin       = &DiskFit{}
	_ fwk.ReservePlugin     = &DiskFit{}
	_ fwk.PreBindPlugin     = &DiskFit{}
	_ fwk.EnqueueExtensions = &DiskFit{}
	_ fwk.SignPlugin        = &DiskFit{}
)

// Name returns the plugin's name.
func (pl *DiskFit) Name() string { return Name }

// Ledger returns the plugin's capacity ledger, for tests and debugging.
func (pl *DiskFit) Ledger() *ledger.Ledger { return pl.ledger }

// Options are the dependencies New takes from its environment; tests and
// simulations set them.
type Options struct {
	// Features are the scheduler feature gates; nil reads the process's.
	Features *feature.Features
	// DiskNodeClient lists and watches DiskNodes; nil builds one from the
	// handle's KubeConfig.
	DiskNodeClient versioned.Interface
	// Now is the clock for DiskNode staleness; nil is time.Now.
	Now func() time.Time
	// SnapshotClient reads VolumeSnapshots; nil builds one from the
	// handle's KubeConfig.
	SnapshotClient dynamic.Interface
}

// New builds a DiskFit plugin; it is the factory to register under Name
// (app.WithPlugin(Name, New)).
func New(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
	return NewWithOptions(ctx, obj, h, Options{})
}

// NewWithOptions builds a DiskFit plugin with explicit dependencies. It
// starts its own DiskNode informer and waits for it to sync; the PV and PVC
// informers it uses come from the handle's shared factory, which the
// scheduler starts after all plugins are built.
func NewWithOptions(ctx context.Context, obj runtime.Object, h fwk.Handle, o Options) (*DiskFit, error) {
	logger := klog.FromContext(ctx)
	args, err := decodeArgs(obj)
	if err != nil {
		return nil, err
	}
	if err := validation.ValidateDiskFitArgs(field.NewPath("args"), args); err != nil {
		return nil, fmt.Errorf("invalid DiskFit args: %w", err)
	}
	fts := feature.Features{}
	if o.Features != nil {
		fts = *o.Features
	} else {
		fts = feature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate)
	}
	vbArgs, err := volumeBindingArgs(args, fts)
	if err != nil {
		return nil, err
	}
	vbPlugin, err := volumebinding.New(ctx, vbArgs, h, fts)
	if err != nil {
		return nil, fmt.Errorf("building embedded VolumeBinding: %w", err)
	}
	vb, ok := vbPlugin.(*volumebinding.VolumeBinding)
	if !ok {
		return nil, fmt.Errorf("embedded VolumeBinding has unexpected type %T", vbPlugin)
	}

	pl := &DiskFit{
		vb:         vb,
		ledger:     ledger.New(),
		pvcLister:  h.SharedInformerFactory().Core().V1().PersistentVolumeClaims().Lister(),
		pvcIndexer: h.SharedInformerFactory().Core().V1().PersistentVolumeClaims().Informer().GetIndexer(),
		pvLister:   h.SharedInformerFactory().Core().V1().PersistentVolumes().Lister(),
		snapshots:  o.SnapshotClient,
		noClaims:   &stateData{},
		activator:  h,
		scLister:   h.SharedInformerFactory().Storage().V1().StorageClasses().Lister(),
		opts:       PackingOptions(args),
		maxAge:     args.MaxDiskNodeAge.Duration,
		now:        o.Now,
	}
	if pl.now == nil {
		pl.now = time.Now
	}
	if len(args.ScoringStrategy.DeviceClassWeights) > 0 {
		weights := map[string]int64{}
		for _, w := range args.ScoringStrategy.DeviceClassWeights {
			weights[w.DeviceClass] = w.Weight
		}
		pl.weigh = func(class string) int64 {
			if w, ok := weights[class]; ok {
				return w
			}
			return configv1.DefaultDeviceClassWeight
		}
	}
	binder, err := newVolumeBinder(ctx, h, fts, time.Duration(vbArgs.BindTimeoutSeconds)*time.Second)
	if err != nil {
		return nil, err
	}
	// The decorator must be in place before the first Reserve; plugins are
	// built before scheduling starts.
	vb.Binder = &diskBinder{SchedulerVolumeBinder: binder, ledger: pl.ledger, recorder: h.EventRecorder()}
	registerMetrics()

	if err := pl.watchVolumes(h); err != nil {
		return nil, err
	}
	client := o.DiskNodeClient
	if client == nil {
		if h.KubeConfig() == nil {
			return nil, errors.New("DiskFit needs a kubeconfig to watch DiskNodes")
		}
		client, err = versioned.NewForConfig(h.KubeConfig())
		if err != nil {
			return nil, fmt.Errorf("building DiskNode client: %w", err)
		}
	}
	if pl.snapshots == nil && h.KubeConfig() != nil {
		if pl.snapshots, err = dynamic.NewForConfig(h.KubeConfig()); err != nil {
			return nil, fmt.Errorf("building VolumeSnapshot client: %w", err)
		}
	}
	if err := pl.watchDiskNodes(ctx, client); err != nil {
		return nil, err
	}
	logger.V(2).Info("DiskFit plugin ready", "strategy", pl.opts.Strategy, "maxDiskNodeAge", pl.maxAge, "maxExactClaims", args.MaxExactClaims)
	return pl, nil
}

// newVolumeBinder builds the Binder that the embedded VolumeBinding uses in
// place of its own: the same as VolumeBinding builds, except that it does
// not check diskfit claims against CSIStorageCapacity (capacity.go). The
// binder VolumeBinding built in New stays unused.
func newVolumeBinder(ctx context.Context, h fwk.Handle, fts feature.Features, bindTimeout time.Duration) (volumebinding.SchedulerVolumeBinder, error) {
	f := h.SharedInformerFactory()
	binder, err := volumebinding.NewVolumeBinder(klog.FromContext(ctx), h.ClientSet(), fts,
		f.Core().V1().Pods(), f.Core().V1().Nodes(), f.Storage().V1().CSINodes(),
		f.Core().V1().PersistentVolumeClaims(), f.Core().V1().PersistentVolumes(), f.Storage().V1().StorageClasses(),
		volumebinding.CapacityCheck{
			CSIDriverInformer:          diskfitCapacityBlind{f.Storage().V1().CSIDrivers()},
			CSIStorageCapacityInformer: f.Storage().V1().CSIStorageCapacities(),
		},
		bindTimeout)
	if err != nil {
		return nil, fmt.Errorf("building volume binder: %w", err)
	}
	return binder, nil
}

// decodeArgs accepts the internal args the scheduler passes after decoding
// a configuration file, and defaults nil (no pluginConfig entry).
func decodeArgs(obj runtime.Object) (*config.DiskFitArgs, error) {
	if obj == nil {
		return DefaultArgs(), nil
	}
	switch a := obj.(type) {
	case *config.DiskFitArgs:
		return a, nil
	case *configv1.DiskFitArgs:
		v := a.DeepCopy()
		configv1.SetObjectDefaults_DiskFitArgs(v)
		out := &config.DiskFitArgs{}
		if err := configv1.Convert_v1_DiskFitArgs_To_config_DiskFitArgs(v, out, nil); err != nil {
			return nil, fmt.Errorf("converting DiskFit args: %w", err)
		}
		return out, nil
	default:
		return nil, fmt.Errorf("want args of type DiskFitArgs, got %T", obj)
	}
}

// DefaultArgs returns the internal args with every default applied.
func DefaultArgs() *config.DiskFitArgs {
	v := &configv1.DiskFitArgs{}
	configv1.SetObjectDefaults_DiskFitArgs(v)
	out := &config.DiskFitArgs{}
	// The conversion cannot fail on defaulted input.
	_ = configv1.Convert_v1_DiskFitArgs_To_config_DiskFitArgs(v, out, nil)
	return out
}

// volumeBindingArgs builds the embedded plugin's args the way the scheduler
// would for VolumeBinding itself (its defaults, e.g. the scoring shape when
// StorageCapacityScoring is on), with DiskFit's bind timeout. The defaults
// read the process's feature gates; the shape is dropped when the features
// the plugin was given disable capacity scoring, as VolumeBinding requires.
func volumeBindingArgs(args *config.DiskFitArgs, fts feature.Features) (*schedconfig.VolumeBindingArgs, error) {
	timeout := args.BindTimeoutSeconds
	versioned := &schedconfigv1.VolumeBindingArgs{BindTimeoutSeconds: &timeout}
	scheme := kubeschedv1.GetPluginArgConversionScheme()
	scheme.Default(versioned)
	out := &schedconfig.VolumeBindingArgs{}
	if err := scheme.Convert(versioned, out, nil); err != nil {
		return nil, fmt.Errorf("building VolumeBinding args: %w", err)
	}
	if !fts.EnableStorageCapacityScoring {
		out.Shape = nil
	}
	return out, nil
}

// PackingOptions translates validated args into the packing options the
// plugin uses, for simulations that run the packing without a scheduler.
func PackingOptions(args *config.DiskFitArgs) packing.Options {
	opts := packing.Options{Strategy: packing.MostAllocated, MaxExactClaims: int(args.MaxExactClaims)}
	if args.ScoringStrategy.Type == config.LeastAllocated {
		opts.Strategy = packing.LeastAllocated
	}
	if args.MaxExactClaims == 0 {
		// maxExactClaims 0 means "greedy only". packing.Options says that
		// with a negative count: its zero value stands for
		// packing.DefaultMaxExactClaims, the number the args default to.
		opts.MaxExactClaims = -1
	}
	return opts
}

// watchVolumes feeds PVs, PVCs and StorageClasses from the scheduler's
// shared informers into the ledger. The ledger needs the classes because an
// annotated PVC counts only when its class is the diskfit driver's; a class
// created, replaced or deleted later makes the claims naming it start or
// stop counting (ledger.SetStorageClass), whichever informer delivers first.
func (pl *DiskFit) watchVolumes(h fwk.Handle) error {
	pvInformer := h.SharedInformerFactory().Core().V1().PersistentVolumes().Informer()
	pvReg, err := pvInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj interface{}) { pl.onPV(obj) },
		UpdateFunc: func(_, obj interface{}) { pl.onPV(obj) },
		DeleteFunc: func(obj interface{}) {
			if pv, ok := tombstone[*v1.PersistentVolume](obj); ok {
				pl.ledger.DeletePV(pv.Name)
				if _, ours := diskfit.PVLocation(pv); ours {
					pl.spaceFreed(klog.Background(), "PV deleted")
				}
			}
		},
	})
	if err != nil {
		return fmt.Errorf("watching PVs: %w", err)
	}
	pvcInformer := h.SharedInformerFactory().Core().V1().PersistentVolumeClaims().Informer()
	pvcReg, err := pvcInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj interface{}) { pl.onPVC(obj) },
		UpdateFunc: func(_, obj interface{}) { pl.onPVC(obj) },
		DeleteFunc: func(obj interface{}) {
			if pvc, ok := tombstone[*v1.PersistentVolumeClaim](obj); ok {
				_, placed := pl.ledger.CountedPVCLocation(pvc)
				pl.ledger.DeletePVC(pvc)
				reservationsHeld.Set(float64(pl.ledger.Reservations()))
				if placed {
					pl.spaceFreed(klog.Background(), "placed PVC deleted")
				}
			}
		},
	})
	if err != nil {
		return fmt.Errorf("watching PVCs: %w", err)
	}
	scInformer := h.SharedInformerFactory().Storage().V1().StorageClasses().Informer()
	scReg, err := scInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj interface{}) { pl.onStorageClass(obj) },
		UpdateFunc: func(_, obj interface{}) { pl.onStorageClass(obj) },
		DeleteFunc: func(obj interface{}) {
			if sc, ok := tombstone[*storagev1.StorageClass](obj); ok && pl.ledger.DeleteStorageClass(sc.Name) {
				pl.spaceFreed(klog.Background(), "StorageClass of placed claims deleted")
			}
		},
	})
	if err != nil {
		return fmt.Errorf("watching StorageClasses: %w", err)
	}
	pl.handlersSynced = append(pl.handlersSynced, pvReg.HasSynced, pvcReg.HasSynced, scReg.HasSynced)
	return nil
}

func (pl *DiskFit) onStorageClass(obj interface{}) {
	if sc, ok := obj.(*storagev1.StorageClass); ok && pl.ledger.SetStorageClass(sc) {
		pl.spaceFreed(klog.Background(), "StorageClass of placed claims no longer diskfit's")
	}
}

func (pl *DiskFit) onPV(obj interface{}) {
	if pv, ok := obj.(*v1.PersistentVolume); ok {
		pl.ledger.SetPV(pv)
		reservationsHeld.Set(float64(pl.ledger.Reservations()))
	}
}

func (pl *DiskFit) onPVC(obj interface{}) {
	if pvc, ok := obj.(*v1.PersistentVolumeClaim); ok {
		pl.ledger.SetPVC(pvc)
		reservationsHeld.Set(float64(pl.ledger.Reservations()))
	}
}

// watchDiskNodes starts the plugin's own DiskNode informer and waits until
// the ledger has every node's disks, so the first Filter sees them.
func (pl *DiskFit) watchDiskNodes(ctx context.Context, client versioned.Interface) error {
	factory := externalversions.NewSharedInformerFactory(client, 0)
	informer := factory.Diskfit().V1alpha1().DiskNodes().Informer()
	reg, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj interface{}) { pl.onDiskNode(obj) },
		UpdateFunc: func(oldObj, obj interface{}) {
			pl.onDiskNode(obj)
			oldDN, ok1 := oldObj.(*v1alpha1.DiskNode)
			newDN, ok2 := obj.(*v1alpha1.DiskNode)
			if ok1 && ok2 && moreRoom(oldDN, newDN) {
				pl.spaceFreed(klog.Background(), "DiskNode reports more room")
			}
		},
		DeleteFunc: func(obj interface{}) {
			if dn, ok := tombstone[*v1alpha1.DiskNode](obj); ok {
				pl.ledger.DeleteDiskNode(dn.Name)
				ledgerRebuilds.Inc()
			}
		},
	})
	if err != nil {
		return fmt.Errorf("watching DiskNodes: %w", err)
	}
	factory.Start(ctx.Done())
	// Said before waiting: without the DiskNode CRD the wait lasts until it
	// is installed, and the reflector's list errors alone do not say who
	// is waiting.
	klog.FromContext(ctx).V(1).Info("DiskFit waiting for DiskNodes to sync; the DiskNode CRD must be installed")
	// Waiting for the handler, not just the informer, means every DiskNode
	// is in the ledger before New returns.
	if !cache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
		return errors.New("DiskNode informer did not sync")
	}
	return nil
}

func (pl *DiskFit) onDiskNode(obj interface{}) {
	if dn, ok := obj.(*v1alpha1.DiskNode); ok {
		pl.ledger.SetDiskNode(dn)
		ledgerRebuilds.Inc()
	}
}

// tombstone unwraps the final state of a deleted object.
func tombstone[T any](obj interface{}) (T, bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	t, ok := obj.(T)
	return t, ok
}
