package schedperf

import (
	"bufio"
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	apiservertesting "k8s.io/kubernetes/cmd/kube-apiserver/app/testing"
	"k8s.io/kubernetes/test/integration/framework"
	"k8s.io/kubernetes/test/utils/ktesting"
	"k8s.io/utils/ptr"

	"github.com/diskfit/diskfit/apis/client/clientset/versioned"
	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/test/cluster"
	"github.com/diskfit/diskfit/test/cluster/controlplane"
)

var (
	memory = flag.Bool("memory", false, "run TestSchedulerMemory: heap and RSS of diskfit-scheduler with each profile on a large cluster")
	// The defaults are the measured configuration; smaller values make a
	// quick check of the test itself.
	memoryNodes     = flag.Int("memory-nodes", 5000, "TestSchedulerMemory: nodes, each with a DiskNode")
	memoryDisks     = flag.Int("memory-disks", 8, "TestSchedulerMemory: disks per node")
	memoryVolumes   = flag.Int("memory-volumes", 20000, "TestSchedulerMemory: bound diskfit PVs, each with its PVC")
	schedulerBinary = flag.String("scheduler-binary", "../../../bin/diskfit-scheduler", "TestSchedulerMemory: the diskfit-scheduler binary (make build)")
)

// memoryProfiles are the scheduler configurations measured, each in its own
// process: the same binary, with DiskFit in the profile or not.
var memoryProfiles = []struct{ name, config string }{
	{profileDefault, "config/default-scheduler.yaml"},
	{profileDiskFit, "config/diskfit-scheduler.yaml"},
}

// schedulerMemory is what one scheduler process used once its informers and
// DiskFit's ledger had every object.
type schedulerMemory struct {
	heapInuse, rss, rssPeak int64
	ready                   time.Duration
}

// TestSchedulerMemory creates a cluster of -memory-nodes nodes with
// -memory-disks disks each and -memory-volumes bound diskfit PVs with their
// PVCs, then runs diskfit-scheduler on it once per profile, alone, and
// prints a table of each process's heap in use after a forced GC and its
// resident set size. It only runs with -memory.
func TestSchedulerMemory(t *testing.T) {
	if !*memory {
		t.Skip("run with -memory")
	}
	bin, err := filepath.Abs(*schedulerBinary)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("diskfit-scheduler binary: %v (build it with make build, or pass -scheduler-binary)", err)
	}
	tCtx := ktesting.Init(t)
	framework.StartEtcd(klog.FromContext(tCtx), t, true)
	server, err := apiservertesting.StartTestServer(tCtx, apiservertesting.NewDefaultTestServerOptions(),
		framework.DefaultTestServerFlags(), framework.SharedEtcd())
	if err != nil {
		t.Fatalf("starting kube-apiserver: %v", err)
	}
	t.Cleanup(server.TearDownFn)
	config := rest.CopyConfig(server.ClientConfig)
	config.QPS, config.Burst = 5000, 5000
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := writeKubeconfig(config, kubeconfig); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	if err := createMemoryCluster(tCtx, config, *memoryNodes, *memoryDisks, *memoryVolumes); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("created %d nodes with %d disks each and %d bound PVs and PVCs in %s\n",
		*memoryNodes, *memoryDisks, *memoryVolumes, time.Since(start).Round(time.Second))

	results := map[string]schedulerMemory{}
	for _, p := range memoryProfiles {
		m, err := measureScheduler(tCtx, bin, p.config, kubeconfig)
		if err != nil {
			t.Fatalf("%s profile: %v", p.name, err)
		}
		results[p.name] = m
	}
	fmt.Print(memoryTable(*memoryNodes, *memoryDisks, *memoryVolumes, results))
}

// memoryTable renders one row per profile and DiskFit's difference.
func memoryTable(nodes, disks, volumes int, r map[string]schedulerMemory) string {
	var b strings.Builder
	fmt.Fprintf(&b, "diskfit-scheduler memory, %d nodes x %d disks, %d bound diskfit PVs and PVCs\n", nodes, disks, volumes)
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "profile\theap in use after GC, MiB\tRSS, MiB\tpeak RSS, MiB\tready after, s\t")
	mib := func(v int64) string { return fmt.Sprintf("%.1f", float64(v)/(1<<20)) }
	for _, p := range memoryProfiles {
		m := r[p.name]
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%.1f\t\n", p.name, mib(m.heapInuse), mib(m.rss), mib(m.rssPeak), m.ready.Seconds())
	}
	d, f := r[profileDefault], r[profileDiskFit]
	fmt.Fprintf(w, "DiskFit - default\t%s\t%s\t%s\t\t\n", mib(f.heapInuse-d.heapInuse), mib(f.rss-d.rss), mib(f.rssPeak-d.rssPeak))
	_ = w.Flush()
	return b.String()
}

// writeKubeconfig writes config as a kubeconfig file for diskfit-scheduler.
func writeKubeconfig(config *rest.Config, path string) error {
	const name = "schedperf"
	kc := clientcmdapi.NewConfig()
	kc.Clusters[name] = &clientcmdapi.Cluster{Server: config.Host, CertificateAuthorityData: config.CAData, TLSServerName: config.ServerName}
	kc.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: config.BearerToken, ClientCertificateData: config.CertData, ClientKeyData: config.KeyData}
	kc.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name}
	kc.CurrentContext = name
	return clientcmd.WriteToFile(*kc, path)
}

// createMemoryCluster creates the objects a scheduler holds in memory:
// nodes with the driver's topology label, their DiskNodes, and bound
// diskfit PVs with their PVCs spread over the nodes' disks.
func createMemoryCluster(ctx context.Context, config *rest.Config, nodes, disks, volumes int) error {
	kube, err := kubernetes.NewForConfig(config)
	if err != nil {
		return err
	}
	crdConfig := rest.CopyConfig(config)
	crdConfig.ContentType = runtime.ContentTypeJSON
	dn, err := versioned.NewForConfig(crdConfig)
	if err != nil {
		return err
	}
	if err := controlplane.InstallCRDs(ctx, config, crdDir); err != nil {
		return err
	}
	wffc := storagev1.VolumeBindingWaitForFirstConsumer
	class := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "diskfit"}, Provisioner: diskfit.DriverName, VolumeBindingMode: &wffc}
	if _, err := kube.StorageV1().StorageClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil {
		return err
	}
	ns := &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "memory"}}
	if _, err := kube.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		return err
	}
	if err := parallel(ctx, nodes, func(i int) error {
		return createNode(ctx, kube, dn, fmt.Sprintf("node-%d", i), disks)
	}); err != nil {
		return err
	}
	// A fixed seed: every run places the same volumes on the same disks.
	rng := rand.New(rand.NewPCG(1, 2))
	placement := make([][2]int, volumes)
	for i := range placement {
		placement[i] = [2]int{rng.IntN(nodes), rng.IntN(disks)}
	}
	return parallel(ctx, volumes, func(i int) error {
		return createBoundVolume(ctx, kube, i, fmt.Sprintf("node-%d", placement[i][0]), fmt.Sprintf("disk-%d", placement[i][1]))
	})
}

// parallel runs fn for 0..n-1 on workers goroutines and returns the first
// error.
func parallel(ctx context.Context, n int, fn func(int) error) error {
	var (
		mu       sync.Mutex
		firstErr error
	)
	workqueue.ParallelizeUntil(ctx, workers, n, func(i int) {
		if err := fn(i); err != nil {
			mu.Lock()
			if firstErr == nil {
				firstErr = err
			}
			mu.Unlock()
		}
	})
	return firstErr
}

func createNode(ctx context.Context, kube kubernetes.Interface, dn versioned.Interface, name string, disks int) error {
	if err := controlplane.CreateReadyNode(ctx, kube, name); err != nil {
		return err
	}
	return createDiskNode(ctx, dn, name, disks)
}

// createBoundVolume creates claim i and its PV on node and disk, bound to
// each other, as external-provisioner and the PV controller leave them.
func createBoundVolume(ctx context.Context, kube kubernetes.Interface, i int, node, disk string) error {
	pvc := &v1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("claim-%d", i), Annotations: map[string]string{
			diskfit.SelectedNodeAnnotation: node,
			diskfit.SelectedDiskAnnotation: disk,
		}},
		Spec: v1.PersistentVolumeClaimSpec{
			AccessModes:      []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			StorageClassName: ptr.To("diskfit"),
			Resources:        v1.VolumeResourceRequirements{Requests: v1.ResourceList{v1.ResourceStorage: resource.MustParse("10Gi")}},
		},
	}
	created, err := kube.CoreV1().PersistentVolumeClaims("memory").Create(ctx, pvc, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating PVC %s: %w", pvc.Name, err)
	}
	pvc = created
	p := &provisioner{client: kube}
	pv, err := p.createVolume(ctx, pvc)
	if err != nil {
		return err
	}
	return p.bindClaim(ctx, pvc, pv)
}

// measureScheduler runs diskfit-scheduler with the given configuration
// until it is ready and its heap no longer grows, reads its memory and
// stops it.
func measureScheduler(ctx context.Context, bin, configPath, kubeconfig string) (schedulerMemory, error) {
	dir, err := os.MkdirTemp("", "schedperf-memory-")
	if err != nil {
		return schedulerMemory{}, err
	}
	defer os.RemoveAll(dir)
	raw, err := os.ReadFile(configPath)
	if err != nil {
		return schedulerMemory{}, err
	}
	// The benchmark's profile, told where the API server is.
	cfg := strings.Replace(string(raw), "leaderElection:", fmt.Sprintf("clientConnection:\n  kubeconfig: %s\nleaderElection:", kubeconfig), 1)
	cfgPath := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return schedulerMemory{}, err
	}
	port, err := cluster.FreePort()
	if err != nil {
		return schedulerMemory{}, err
	}
	logFile, err := os.Create(filepath.Join(dir, "scheduler.log"))
	if err != nil {
		return schedulerMemory{}, err
	}
	defer logFile.Close()
	cmd := exec.CommandContext(ctx, bin,
		"--config="+cfgPath,
		"--bind-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(port),
		"--cert-dir="+dir,
		"--authentication-kubeconfig="+kubeconfig,
		"--authorization-kubeconfig="+kubeconfig,
		// Anonymous reads of readiness, metrics and a GC-forcing heap
		// profile: the measurement needs nothing else.
		"--authorization-always-allow-paths=/readyz,/metrics,/debug/pprof/heap",
	)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	started := time.Now()
	if err := cmd.Start(); err != nil {
		return schedulerMemory{}, err
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	base := "https://127.0.0.1:" + strconv.Itoa(port)
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		// The scheduler's serving certificate is self-signed.
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // loopback, test only
	}}
	var m schedulerMemory
	for {
		if err := ctx.Err(); err != nil {
			return m, err
		}
		if resp, err := client.Get(base + "/readyz"); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if cmd.ProcessState != nil {
			return m, fmt.Errorf("diskfit-scheduler exited; log in %s", logFile.Name())
		}
		time.Sleep(500 * time.Millisecond)
	}
	m.ready = time.Since(started)
	// Ready means the scheduler's own event handlers have synced; the
	// plugin's handlers may still be feeding the ledger. Sample until the
	// heap after GC stops growing.
	var last int64
	for range 30 {
		time.Sleep(2 * time.Second)
		heap, err := heapAfterGC(client, base)
		if err != nil {
			return m, err
		}
		if last > 0 && heap-last < last/100 {
			m.heapInuse = heap
			break
		}
		last = heap
	}
	if m.heapInuse == 0 {
		return m, fmt.Errorf("heap still growing after a minute: %d bytes", last)
	}
	m.rss, m.rssPeak, err = processRSS(cmd.Process.Pid)
	return m, err
}

// heapAfterGC forces a garbage collection in the scheduler (a heap profile
// with gc=1) and reads its heap in use.
func heapAfterGC(client *http.Client, base string) (int64, error) {
	resp, err := client.Get(base + "/debug/pprof/heap?gc=1")
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("heap profile: %s", resp.Status)
	}
	resp, err = client.Get(base + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	const metric = "go_memstats_heap_inuse_bytes "
	s := bufio.NewScanner(resp.Body)
	s.Buffer(make([]byte, 1<<20), 1<<20)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), metric); ok {
			f, err := strconv.ParseFloat(v, 64)
			return int64(f), err
		}
	}
	if err := s.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no %s in the scheduler's metrics (%s)", strings.TrimSpace(metric), resp.Status)
}

// processRSS reads a process's resident set size and its peak from
// /proc/<pid>/status.
func processRSS(pid int) (rss, peak int64, err error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(raw), "\n") {
		key, value, ok := strings.Cut(line, ":")
		if !ok || (key != "VmRSS" && key != "VmHWM") {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(value), " kB"), 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("parsing %s: %w", line, err)
		}
		if key == "VmRSS" {
			rss = kb << 10
		} else {
			peak = kb << 10
		}
	}
	return rss, peak, nil
}
