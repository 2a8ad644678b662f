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
	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/scheduler-plugin/apis/config"
	configv1 "github.com/diskfit/diskfit/scheduler-plugin/apis/config/v1"
	"github.com/diskfit/diskfit/scheduler-plugin/apis/config/validation"
	"github.com/diskfit/diskfit/scheduler-plugin/fit"
	"github.com/diskfit/diskfit/scheduler-plugin/ledger"
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
	// pvIndexer holds the PVs with pvBindableIndex (deferred.go).
	pvIndexer  cache.Indexer
	nodeLister corelisters.NodeLister
	scLister   storagelisters.StorageClassLister
	// snapshots reads VolumeSnapshots and their contents (source.go).
	snapshots dynamic.Interface
	// watchSnapshots: the cluster serves the VolumeSnapshot API, so
	// snapshot events are registered (snapshotAPIServed).
	watchSnapshots bool
	// fit decides whether a node fits the claims and scores it.
	fit *fit.Evaluator
	now func() time.Time
	// noClaims is the shared, never modified state of pods without
	// diskfit claims.
	noClaims *stateData
	last     atomic.Pointer[lastCycle]
	// activator requeues waiting pods (waiting.go).
	activator fwk.PodActivator
	// waiting are pods rejected for lack of space, waitingForDiskNode
	// those rejected for a missing or stale DiskNode.
	waiting, waitingForDiskNode waitingPods
	logger                      klog.Logger
	conversions                 diskNodeConversions
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

// NewWithOptions builds a DiskFit plugin with explicit dependencies: it
// decodes and validates the args, builds the embedded VolumeBinding and
// the Binder it uses, and starts the ledger's feeds (feed.go). The
// handle's pod activator must be a scheduling queue's, or one that does
// nothing where there is no queue (frameworkruntime.WithPodActivator).
func NewWithOptions(ctx context.Context, obj runtime.Object, h fwk.Handle, o Options) (*DiskFit, error) {
	args, err := decodeArgs(obj)
	if err != nil {
		return nil, err
	}
	if err := validation.ValidateDiskFitArgs(field.NewPath("args"), args); err != nil {
		return nil, fmt.Errorf("invalid DiskFit args: %w", err)
	}
	fts := feature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate)
	if o.Features != nil {
		fts = *o.Features
	}
	vb, binder, err := newVolumeBinding(ctx, args, h, fts)
	if err != nil {
		return nil, err
	}
	diskNodes, snapshots, err := clients(h, o)
	if err != nil {
		return nil, err
	}
	watchSnapshots, err := snapshotAPIServed(h.ClientSet())
	if err != nil {
		return nil, err
	}
	pvcs := h.SharedInformerFactory().Core().V1().PersistentVolumeClaims()
	pvs := h.SharedInformerFactory().Core().V1().PersistentVolumes()
	if err := addPVBindableIndex(pvs.Informer()); err != nil {
		return nil, fmt.Errorf("indexing PVs: %w", err)
	}
	pl := &DiskFit{
		vb:             vb,
		ledger:         ledger.New(),
		pvcLister:      pvcs.Lister(),
		pvcIndexer:     pvcs.Informer().GetIndexer(),
		pvLister:       pvs.Lister(),
		pvIndexer:      pvs.Informer().GetIndexer(),
		nodeLister:     h.SharedInformerFactory().Core().V1().Nodes().Lister(),
		scLister:       h.SharedInformerFactory().Storage().V1().StorageClasses().Lister(),
		snapshots:      snapshots,
		watchSnapshots: watchSnapshots,
		now:            o.Now,
		noClaims:       &stateData{},
		activator:      h,
		logger:         klog.FromContext(ctx),
	}
	if pl.now == nil {
		pl.now = time.Now
	}
	pl.fit = fit.New(pl.ledger, args, pl.now)
	// The decorator must be in place before the first Reserve; plugins are
	// built before scheduling starts.
	vb.Binder = &diskBinder{SchedulerVolumeBinder: binder, ledger: pl.ledger, recorder: h.EventRecorder()}
	registerMetrics()
	if err := pl.startFeeds(ctx, h, diskNodes); err != nil {
		return nil, err
	}
	if !watchSnapshots {
		pl.logger.Info("The VolumeSnapshot API is not served: a pod restoring a snapshot that is not ready yet is retried by the queue's periodic flush; restart the scheduler after installing the snapshot CRDs to requeue it on snapshot events")
	}
	pl.logger.V(2).Info("DiskFit plugin ready", "strategy", pl.fit.Options.Strategy, "maxDiskNodeAge", pl.fit.MaxAge, "maxExactClaims", args.MaxExactClaims)
	return pl, nil
}

// newVolumeBinding builds the embedded VolumeBinding, as the scheduler
// would build the in-tree plugin, and the Binder it uses instead of its own
// (newVolumeBinder).
func newVolumeBinding(ctx context.Context, args *config.DiskFitArgs, h fwk.Handle, fts feature.Features) (*volumebinding.VolumeBinding, volumebinding.SchedulerVolumeBinder, error) {
	vbArgs, err := volumeBindingArgs(args, fts)
	if err != nil {
		return nil, nil, err
	}
	vbPlugin, err := volumebinding.New(ctx, vbArgs, h, fts)
	if err != nil {
		return nil, nil, fmt.Errorf("building embedded VolumeBinding: %w", err)
	}
	vb, ok := vbPlugin.(*volumebinding.VolumeBinding)
	if !ok {
		return nil, nil, fmt.Errorf("embedded VolumeBinding has unexpected type %T", vbPlugin)
	}
	binder, err := newVolumeBinder(ctx, h, fts, time.Duration(vbArgs.BindTimeoutSeconds)*time.Second)
	if err != nil {
		return nil, nil, err
	}
	return vb, binder, nil
}

// clients returns the DiskNode and VolumeSnapshot clients of o, or built
// from the handle's KubeConfig.
func clients(h fwk.Handle, o Options) (versioned.Interface, dynamic.Interface, error) {
	diskNodes, snapshots := o.DiskNodeClient, o.SnapshotClient
	var err error
	if diskNodes == nil {
		if h.KubeConfig() == nil {
			return nil, nil, errors.New("DiskFit needs a kubeconfig to watch DiskNodes")
		}
		if diskNodes, err = versioned.NewForConfig(h.KubeConfig()); err != nil {
			return nil, nil, fmt.Errorf("building DiskNode client: %w", err)
		}
	}
	if snapshots == nil && h.KubeConfig() != nil {
		if snapshots, err = dynamic.NewForConfig(h.KubeConfig()); err != nil {
			return nil, nil, fmt.Errorf("building VolumeSnapshot client: %w", err)
		}
	}
	return diskNodes, snapshots, nil
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
		return configv1.DefaultArgs(), nil
	}
	switch a := obj.(type) {
	case *config.DiskFitArgs:
		return a, nil
	case *configv1.DiskFitArgs:
		return configv1.InternalArgs(a)
	default:
		return nil, fmt.Errorf("want args of type DiskFitArgs, got %T", obj)
	}
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
