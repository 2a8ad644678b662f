package controlplane

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	v1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/scale"
	"k8s.io/controller-manager/pkg/informerfactory"
	"k8s.io/klog/v2"
	kubeapiservertesting "k8s.io/kubernetes/cmd/kube-apiserver/app/testing"
	"k8s.io/kubernetes/pkg/controller/clusterroleaggregation"
	"k8s.io/kubernetes/pkg/controller/disruption"
	"k8s.io/kubernetes/pkg/controller/garbagecollector"
	"k8s.io/kubernetes/pkg/controller/namespace"
	"k8s.io/kubernetes/pkg/controller/statefulset"
	"k8s.io/kubernetes/pkg/controller/volume/persistentvolume"
	"k8s.io/kubernetes/pkg/controller/volume/pvcprotection"
	"k8s.io/kubernetes/pkg/controller/volume/pvprotection"
	"sigs.k8s.io/yaml"
)

// ControlPlane is etcd, a real kube-apiserver and the controllers that PVC
// binding, StatefulSets, owner references and PodDisruptionBudgets need,
// all in this process.
type ControlPlane struct {
	// Config is an administrator's client configuration.
	Config *rest.Config
	Client kubernetes.Interface

	etcd     *etcd
	tb       *processTB
	teardown func()
	cancel   context.CancelFunc
	done     chan struct{}
}

// Start runs a control plane with its state under dir. Stop ends it; on
// error, what was started is already stopped.
func Start(ctx context.Context, dir string) (cp *ControlPlane, err error) {
	cp = &ControlPlane{tb: newProcessTB("apiserver"), done: make(chan struct{})}
	defer func() {
		if err != nil {
			cp.Stop()
		}
	}()
	if cp.etcd, err = startEtcd(filepath.Join(dir, "etcd")); err != nil {
		return cp, err
	}
	storage := storagebackend.NewDefaultConfig("/registry", nil)
	storage.Transport.ServerList = []string{cp.etcd.ClientURL}
	flags := []string{
		// No endpoint reconciler: 127.0.0.1 is not a valid Service endpoint.
		"--endpoint-reconciler-type=none",
		// No controller creates default service accounts here, and new nodes
		// would wait for a not-ready taint that no node lifecycle controller removes.
		"--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
		// As every real cluster: the node plugin's container is privileged.
		"--allow-privileged=true",
		// Components run as their manifests' ServiceAccounts (rbac.go).
		"--authorization-mode=RBAC",
	}
	server, err := startAPIServer(cp.tb, flags, storage)
	if err != nil {
		return cp, err
	}
	cp.teardown = server.TearDownFn
	cp.Config = rest.CopyConfig(server.ClientConfig)
	cp.Config.QPS, cp.Config.Burst = 500, 1000
	if cp.Client, err = kubernetes.NewForConfig(cp.Config); err != nil {
		return cp, err
	}
	ctx, cp.cancel = context.WithCancel(ctx)
	if err := cp.startControllers(ctx); err != nil {
		return cp, err
	}
	return cp, nil
}

// startAPIServer turns the test helper's panics (processTB.Fatalf) into errors.
func startAPIServer(tb *processTB, flags []string, storage *storagebackend.Config) (server kubeapiservertesting.TestServer, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("starting kube-apiserver: %v", r)
		}
	}()
	server, err = kubeapiservertesting.StartTestServer(tb, nil, flags, storage)
	if err != nil {
		return server, fmt.Errorf("starting kube-apiserver: %w", err)
	}
	return server, nil
}

func (cp *ControlPlane) startControllers(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	client := cp.Client
	factory := informers.NewSharedInformerFactory(client, 0)

	pv, err := persistentvolume.NewController(klog.NewContext(ctx, logger.WithName("pv-controller")), persistentvolume.ControllerParameters{
		KubeClient:                client,
		SyncPeriod:                5 * time.Second,
		VolumeInformer:            factory.Core().V1().PersistentVolumes(),
		ClaimInformer:             factory.Core().V1().PersistentVolumeClaims(),
		ClassInformer:             factory.Storage().V1().StorageClasses(),
		PodInformer:               factory.Core().V1().Pods(),
		NodeInformer:              factory.Core().V1().Nodes(),
		EnableDynamicProvisioning: true,
	})
	if err != nil {
		return fmt.Errorf("persistent volume controller: %w", err)
	}
	sts := statefulset.NewStatefulSetController(klog.NewContext(ctx, logger.WithName("statefulset-controller")),
		factory.Core().V1().Pods(), factory.Apps().V1().StatefulSets(),
		factory.Core().V1().PersistentVolumeClaims(), factory.Apps().V1().ControllerRevisions(), client)

	// The protection controllers remove the finalizers that keep a claim
	// in use by a pod, and a bound PV, from being deleted.
	pvcProtection, err := pvcprotection.NewPVCProtectionController(logger, factory.Core().V1().PersistentVolumeClaims(), factory.Core().V1().Pods(), client)
	if err != nil {
		return fmt.Errorf("PVC protection controller: %w", err)
	}
	pvProtection, err := withError(pvprotection.NewPVProtectionController(logger, factory.Core().V1().PersistentVolumes(), client))
	if err != nil {
		return fmt.Errorf("PV protection controller: %w", err)
	}

	// Fills the aggregated ClusterRoles (admin, edit, view) that tests
	// bind namespace users to.
	aggregation := clusterroleaggregation.NewClusterRoleAggregation(factory.Rbac().V1().ClusterRoles(), client.RbacV1())

	metadataClient, err := metadata.NewForConfig(cp.Config)
	if err != nil {
		return err
	}
	// Tests delete their namespaces; the namespace controller empties them.
	namespaces := namespace.NewNamespaceController(klog.NewContext(ctx, logger.WithName("namespace-controller")),
		client, metadataClient, client.Discovery().ServerPreferredNamespacedResources,
		factory.Core().V1().Namespaces(), 5*time.Minute, v1.FinalizerKubernetes)
	metadataInformers := metadatainformer.NewSharedInformerFactory(metadataClient, 0)
	restMapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(client.Discovery()))
	restMapper.Reset()
	// Computes PodDisruptionBudgets' status, which the API server's
	// evictions (diskfit drain) decide by.
	scales, err := scale.NewForConfig(cp.Config, restMapper, dynamic.LegacyAPIPathResolverFunc, scale.NewDiscoveryScaleKindResolver(client.Discovery()))
	if err != nil {
		return fmt.Errorf("scale client: %w", err)
	}
	disruptions := disruption.NewDisruptionController(klog.NewContext(ctx, logger.WithName("disruption-controller")),
		factory.Core().V1().Pods(), factory.Policy().V1().PodDisruptionBudgets(),
		factory.Core().V1().ReplicationControllers(), factory.Apps().V1().ReplicaSets(),
		factory.Apps().V1().Deployments(), factory.Apps().V1().StatefulSets(),
		client, restMapper, scales, client.Discovery())
	started := make(chan struct{})
	gc, err := garbagecollector.NewGarbageCollector(klog.NewContext(ctx, logger.WithName("garbage-collector")),
		client, metadataClient, restMapper, garbagecollector.DefaultIgnoredResources(),
		informerfactory.NewInformerFactory(factory, metadataInformers), started)
	if err != nil {
		return fmt.Errorf("garbage collector: %w", err)
	}

	factory.Start(ctx.Done())
	metadataInformers.Start(ctx.Done())
	close(started)
	go func() {
		defer close(cp.done)
		go pv.Run(ctx)
		go sts.Run(ctx, 5)
		go disruptions.Run(ctx, 2)
		go pvcProtection.Run(ctx, 2)
		go pvProtection.Run(ctx, 2)
		go namespaces.Run(ctx, 2)
		go aggregation.Run(ctx, 1)
		const resync = 5 * time.Second
		go wait.Until(restMapper.Reset, resync, ctx.Done())
		go gc.Run(ctx, 5, resync)
		go gc.Sync(ctx, client.Discovery(), resync)
		<-ctx.Done()
	}()
	return nil
}

// withError takes a constructor's results whether it returns an error or
// not: Kubernetes 1.37 added one to some controllers' constructors, and
// this package builds for every supported minor (docs/kubernetes-versions.md).
func withError[T any](v T, errs ...error) (T, error) {
	return v, errors.Join(errs...)
}

// InstallCRDs creates every CRD found in dir (unless it exists) and waits
// until each is served.
func InstallCRDs(ctx context.Context, config *rest.Config, dir string) error {
	client, err := apiextensionsclient.NewForConfig(config)
	if err != nil {
		return err
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return err
	}
	sort.Strings(files)
	if len(files) == 0 {
		return fmt.Errorf("no CRDs in %s", dir)
	}
	for _, file := range files {
		raw, err := os.ReadFile(file)
		if err != nil {
			return err
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.UnmarshalStrict(raw, &crd); err != nil {
			return fmt.Errorf("parsing %s: %w", file, err)
		}
		if _, err := client.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, &crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating CRD %s: %w", crd.Name, err)
		}
		err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			got, err := client.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			for _, c := range got.Status.Conditions {
				if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			return fmt.Errorf("waiting for CRD %s: %w", crd.Name, err)
		}
	}
	return nil
}

// Stop ends the controllers, the API server and etcd.
func (cp *ControlPlane) Stop() {
	if cp.cancel != nil {
		cp.cancel()
		<-cp.done
	}
	if cp.teardown != nil {
		cp.teardown()
	}
	cp.tb.close()
	if cp.etcd != nil {
		cp.etcd.stop()
	}
}
