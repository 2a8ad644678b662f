package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/scheduler-plugin/webhook"
)

const (
	mi = int64(1) << 20
	gi = int64(1) << 30
	// defaultScheduler is the name of the default profile.
	defaultScheduler = v1.DefaultSchedulerName
)

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// newNamespace creates a namespace for one test. Cleanup deletes its pods
// and claims and waits until their volumes are gone, so the next test starts
// with the disks as they were.
func newNamespace(t *testing.T) string {
	t.Helper()
	ctx := ctxFor(t, 5*time.Minute)
	ns, err := kube.CoreV1().Namespaces().Create(ctx, &v1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	name := ns.Name
	t.Cleanup(func() {
		ctx := context.Background()
		_ = kube.AppsV1().StatefulSets(name).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
		_ = kube.CoreV1().Pods(name).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}, metav1.ListOptions{})
		_ = kube.CoreV1().PersistentVolumeClaims(name).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
		claimsDeleted := time.Now()
		err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
			pvs, err := kube.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, err
			}
			for _, pv := range pvs.Items {
				if pv.Spec.ClaimRef != nil && pv.Spec.ClaimRef.Namespace == name {
					return false, nil
				}
			}
			if inFlight, err := volumesWithoutPVOf(ctx, name, claimsDeleted); err != nil || inFlight {
				return false, err
			}
			pods, err := kube.CoreV1().Pods(name).List(ctx, metav1.ListOptions{})
			return err == nil && len(pods.Items) == 0, err
		})
		if err != nil {
			t.Errorf("cleaning up namespace %s: volumes or pods left: %v", name, err)
		}
		_ = kube.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{})
	})
	return name
}

// volumesWithoutPVOf reports whether a disk may still hold a volume made
// for a claim of namespace ns that has no PV yet: a provisioning in flight
// when the claims were deleted (at since) saves its PV later, which is then
// released and deleted, so the space changes under the next test. It
// waits for a status observed after since from every DiskNode whose
// driver still refreshes it (one observed in the minute before since; the
// drivers refresh theirs every 30 s at most).
func volumesWithoutPVOf(ctx context.Context, ns string, since time.Time) (bool, error) {
	dns, err := diskfitAPI.DiskfitV1alpha1().DiskNodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return false, err
	}
	for _, dn := range dns.Items {
		observed := dn.Status.ObservedTime.Time
		if observed.Before(since.Add(-time.Minute)) {
			continue
		}
		if !observed.After(since) {
			return true, nil
		}
		for _, d := range dn.Status.Disks {
			for _, v := range d.WithoutPV {
				if strings.HasPrefix(v.Claim, ns+"/") {
					return true, nil
				}
			}
		}
	}
	return false, nil
}

// newStorageClass creates a WaitForFirstConsumer diskfit StorageClass,
// restricted to deviceClass when it is not empty.
func newStorageClass(t *testing.T, deviceClass string) string {
	t.Helper()
	ctx := ctxFor(t, time.Minute)
	sc := &storagev1.StorageClass{
		ObjectMeta:           metav1.ObjectMeta{GenerateName: "diskfit-"},
		Provisioner:          diskfit.DriverName,
		VolumeBindingMode:    ptr.To(storagev1.VolumeBindingWaitForFirstConsumer),
		ReclaimPolicy:        ptr.To(v1.PersistentVolumeReclaimDelete),
		AllowVolumeExpansion: ptr.To(true),
	}
	if deviceClass != "" {
		sc.Parameters = map[string]string{diskfit.DeviceClassParameter: deviceClass}
	}
	created, err := kube.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = kube.StorageV1().StorageClasses().Delete(context.Background(), created.Name, metav1.DeleteOptions{})
	})
	return created.Name
}

func newPVC(t *testing.T, ns, name, class string, size int64) *v1.PersistentVolumeClaim {
	t.Helper()
	pvc, err := kube.CoreV1().PersistentVolumeClaims(ns).Create(ctxFor(t, time.Minute), claim(name, class, size), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pvc
}

func claim(name, class string, size int64) *v1.PersistentVolumeClaim {
	return &v1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1.PersistentVolumeClaimSpec{
			AccessModes:      []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			StorageClassName: ptr.To(class),
			Resources: v1.VolumeResourceRequirements{Requests: v1.ResourceList{
				v1.ResourceStorage: *resource.NewQuantity(size, resource.BinarySI),
			}},
		},
	}
}

// podSpec returns a pod of -pod-image using the named claims, scheduled by
// scheduler. A pod that asks for the default scheduler by name opts out of
// diskfit-webhook, which is deployed on kind and would otherwise give it
// diskfit-scheduler.
func podSpec(name, scheduler string, claims ...string) *v1.Pod {
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": name}},
		Spec: v1.PodSpec{
			SchedulerName:                 scheduler,
			TerminationGracePeriodSeconds: ptr.To[int64](0),
			Containers: []v1.Container{{
				Name: "app", Image: *podImage,
			}},
		},
	}
	if scheduler == defaultScheduler {
		pod.Labels[webhook.OptOutKey] = webhook.OptOutValue
	}
	for i, c := range claims {
		vol := "data" + strconv.Itoa(i)
		pod.Spec.Volumes = append(pod.Spec.Volumes, v1.Volume{Name: vol, VolumeSource: v1.VolumeSource{
			PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: c},
		}})
		pod.Spec.Containers[0].VolumeMounts = append(pod.Spec.Containers[0].VolumeMounts, v1.VolumeMount{Name: vol, MountPath: "/data" + strconv.Itoa(i)})
	}
	return pod
}

func createPod(t *testing.T, ns string, pod *v1.Pod) *v1.Pod {
	t.Helper()
	created, err := kube.CoreV1().Pods(ns).Create(ctxFor(t, time.Minute), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return created
}

// waitPodScheduled waits until the pod has a node and returns it.
func waitPodScheduled(t *testing.T, ns, name string, timeout time.Duration) *v1.Pod {
	t.Helper()
	var pod *v1.Pod
	err := wait.PollUntilContextTimeout(ctxFor(t, timeout+time.Second), 250*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		var err error
		pod, err = kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		return err == nil && pod.Spec.NodeName != "", err
	})
	if err != nil {
		t.Fatalf("pod %s/%s not scheduled: %v; events:\n%s", ns, name, err, events(t, ns, name))
	}
	return pod
}

// waitPodRunning waits until the kubelet reports the pod Running: its
// volumes were staged and published by the driver on its node.
func waitPodRunning(t *testing.T, ns, name string, timeout time.Duration) *v1.Pod {
	t.Helper()
	var pod *v1.Pod
	err := wait.PollUntilContextTimeout(ctxFor(t, timeout+time.Second), 250*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		var err error
		pod, err = kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			// A StatefulSet is (re)creating it.
			return false, nil
		}
		return err == nil && pod.Status.Phase == v1.PodRunning, err
	})
	if err != nil {
		t.Fatalf("pod %s/%s not running: %v; events:\n%s", ns, name, err, events(t, ns, name))
	}
	return pod
}

// events returns the events of an object, one per line.
func events(t *testing.T, ns, name string) string {
	list, err := kube.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{
		FieldSelector: "involvedObject.name=" + name,
	})
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, e := range list.Items {
		fmt.Fprintf(&b, "  %s %s: %s\n", e.Type, e.Reason, e.Message)
	}
	return b.String()
}

// waitForUnschedulable waits until the pod's PodScheduled condition says
// why it cannot be scheduled with every one of the given fragments, and
// returns that message. The condition has the latest attempt's reasons;
// FailedScheduling events do not: the events library folds a pod's later
// failures into the first one's series, whose message stays that of the
// first (which may be "persistentvolumeclaim not found" when the scheduler
// saw the pod before its claims).
func waitForUnschedulable(t *testing.T, ns, name string, fragments ...string) string {
	t.Helper()
	var msg string
	err := wait.PollUntilContextTimeout(ctxFor(t, 2*time.Minute), 500*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		pod, err := kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range pod.Status.Conditions {
			if c.Type != v1.PodScheduled || c.Status != v1.ConditionFalse {
				continue
			}
			msg = c.Message
			for _, f := range fragments {
				if !strings.Contains(c.Message, f) {
					return false, nil
				}
			}
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("pod %s/%s is not unschedulable with %q: %v; last reason: %s", ns, name, fragments, err, msg)
	}
	return msg
}

// waitForEvent waits for an event of the named object whose reason is reason
// and whose message contains every one of the given fragments.
func waitForEvent(t *testing.T, ns, name, reason string, fragments ...string) string {
	t.Helper()
	var found string
	err := wait.PollUntilContextTimeout(ctxFor(t, 2*time.Minute), 500*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		list, err := kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			return false, err
		}
	next:
		for _, e := range list.Items {
			if e.Reason != reason {
				continue
			}
			for _, f := range fragments {
				if !strings.Contains(e.Message, f) {
					continue next
				}
			}
			found = e.Message
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no %s event on %s/%s containing %q: %v; events:\n%s", reason, ns, name, fragments, err, events(t, ns, name))
	}
	return found
}

func waitPVCsBound(t *testing.T, ns string, names []string, timeout time.Duration) map[string]*v1.PersistentVolumeClaim {
	t.Helper()
	got := map[string]*v1.PersistentVolumeClaim{}
	err := wait.PollUntilContextTimeout(ctxFor(t, timeout+time.Second), 250*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		for _, name := range names {
			pvc, err := kube.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				// A StatefulSet creates its claims with its pods.
				return false, nil
			}
			if err != nil {
				return false, err
			}
			if pvc.Status.Phase != v1.ClaimBound {
				return false, nil
			}
			got[name] = pvc
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("claims %v not bound: %v", names, err)
	}
	return got
}

// placement is where a PV lives: its node and disk.
type placement struct{ node, disk string }

// pvPlacement reads node and disk from a diskfit PV.
func pvPlacement(pv *v1.PersistentVolume) (placement, error) {
	if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != diskfit.DriverName {
		return placement{}, fmt.Errorf("PV %s is not a diskfit volume", pv.Name)
	}
	p := placement{disk: pv.Spec.CSI.VolumeAttributes[diskfit.VolumeContextDiskKey]}
	if a := pv.Spec.NodeAffinity; a != nil && a.Required != nil {
		for _, term := range a.Required.NodeSelectorTerms {
			for _, expr := range term.MatchExpressions {
				if expr.Key == diskfit.TopologyKey && len(expr.Values) == 1 {
					p.node = expr.Values[0]
				}
			}
		}
	}
	if p.node == "" || p.disk == "" {
		return p, fmt.Errorf("PV %s has no node or disk: %+v", pv.Name, p)
	}
	return p, nil
}

// pvBytesPerDisk returns the bytes of diskfit PVs on each disk. It is no
// check of the scheduler: a disk's capacityBytes is the driver's free space
// plus its volumes, so the PVs fit it whatever the scheduler did. What the
// scheduler promises is checkSchedulerKeptItsPromise.
func pvBytesPerDisk(t *testing.T) map[placement]int64 {
	t.Helper()
	pvs, err := kube.CoreV1().PersistentVolumes().List(ctxFor(t, time.Minute), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	used := map[placement]int64{}
	for i := range pvs.Items {
		pv := &pvs.Items[i]
		if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != diskfit.DriverName {
			continue
		}
		p, err := pvPlacement(pv)
		if err != nil {
			t.Error(err)
			continue
		}
		used[p] += pv.Spec.Capacity.Storage().Value()
	}
	return used
}

// checkSchedulerKeptItsPromise asserts what diskfit-scheduler promises for
// the claims of ns it placed: the driver refused none of them (no
// ProvisioningFailed event says ResourceExhausted: the scheduler never
// sent a claim to a disk without room for it), and, on the local cluster,
// once the pods have settled it holds no reservation in memory
// (diskfit_reservations_held on its /metrics drops to 0).
func checkSchedulerKeptItsPromise(t *testing.T, ns string) {
	t.Helper()
	if n := resourceExhausted(t, ns); n != 0 {
		t.Errorf("the driver refused %d claims of %s with ResourceExhausted: the scheduler sent them to disks without room", n, ns)
	}
	checkNoReservationHeld(t)
}

// checkNoReservationHeld asserts, on the local cluster, that
// diskfit-scheduler holds no reservation once the pods have settled: every
// one was released or became visible on its claim.
func checkNoReservationHeld(t *testing.T) {
	t.Helper()
	if localDir == "" {
		return
	}
	var held float64
	var readErr error
	err := wait.PollUntilContextTimeout(ctxFor(t, time.Minute), time.Second, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		held, readErr = schedulerMetric(ctx, "diskfit_reservations_held")
		return readErr == nil && held == 0, nil
	})
	switch {
	case readErr != nil:
		t.Errorf("reading diskfit-scheduler's reservations: %v", readErr)
	case err != nil:
		t.Errorf("diskfit-scheduler still holds %v reservations after the pods settled", held)
	}
}

// resourceExhausted counts the ProvisioningFailed events of ns that say
// ResourceExhausted.
func resourceExhausted(t *testing.T, ns string) int {
	t.Helper()
	evs, err := kube.CoreV1().Events(ns).List(ctxFor(t, time.Minute), metav1.ListOptions{FieldSelector: "reason=ProvisioningFailed"})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range evs.Items {
		if strings.Contains(e.Message, "ResourceExhausted") {
			n += int(max(e.Count, 1))
		}
	}
	return n
}

// schedulerMetric reads one unlabelled sample from the local cluster's
// diskfit-scheduler /metrics, as the suite's admin (the scheduler
// authenticates the client certificate and asks the API server whether it
// may read /metrics).
func schedulerMetric(ctx context.Context, name string) (float64, error) {
	port, err := os.ReadFile(filepath.Join(localDir, "scheduler-port"))
	if err != nil {
		return 0, err
	}
	// The suite's own credentials; the scheduler serves with a certificate
	// it made itself, which the API server's CA did not sign.
	cfg := rest.CopyConfig(restConfig)
	cfg.TLSClientConfig.CAData, cfg.TLSClientConfig.CAFile, cfg.TLSClientConfig.Insecure = nil, "", true
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return 0, err
	}
	client.Timeout = 10 * time.Second
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://127.0.0.1:"+strings.TrimSpace(string(port))+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET /metrics: %s: %s", resp.Status, body)
	}
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, fmt.Errorf("no %s in diskfit-scheduler's /metrics", name)
}

// pvcUpdateConflicts reads from the API server's metrics how many writes to
// PVC objects were refused with 409 Conflict so far. Status writes are left
// out: the PVC protection controller's status updates race with the PV
// binder's by design and retry on their own; what must never conflict is
// the write of the claim itself (annotations, volume name), where a
// conflict costs the scheduler a whole retry.
func pvcUpdateConflicts(t *testing.T) int {
	t.Helper()
	raw, err := kube.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctxFor(t, time.Minute))
	if err != nil {
		t.Fatalf("reading API server metrics: %v", err)
	}
	total := 0
	s := bufio.NewScanner(strings.NewReader(string(raw)))
	s.Buffer(make([]byte, 1<<20), 1<<20)
	for s.Scan() {
		line := s.Text()
		if !strings.HasPrefix(line, "apiserver_request_total{") ||
			!strings.Contains(line, `code="409"`) ||
			!strings.Contains(line, `resource="persistentvolumeclaims"`) ||
			!strings.Contains(line, `subresource=""`) ||
			!(strings.Contains(line, `verb="PUT"`) || strings.Contains(line, `verb="PATCH"`)) {
			continue
		}
		fields := strings.Fields(line)
		n, err := strconv.ParseFloat(fields[len(fields)-1], 64)
		if err != nil {
			t.Fatalf("parsing %q: %v", line, err)
		}
		total += int(n)
	}
	return total
}

// statefulSet returns a Parallel StatefulSet with one claim template per size.
func statefulSet(name, scheduler, class string, replicas int32, sizes ...int64) *appsv1.StatefulSet {
	pod := podSpec(name, scheduler)
	sts := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appsv1.StatefulSetSpec{
			Replicas:            ptr.To(replicas),
			PodManagementPolicy: appsv1.ParallelPodManagement,
			Selector:            &metav1.LabelSelector{MatchLabels: pod.Labels},
			Template:            v1.PodTemplateSpec{ObjectMeta: pod.ObjectMeta, Spec: pod.Spec},
		},
	}
	for i, size := range sizes {
		c := claim("data"+strconv.Itoa(i), class, size)
		sts.Spec.VolumeClaimTemplates = append(sts.Spec.VolumeClaimTemplates, *c)
		sts.Spec.Template.Spec.Containers[0].VolumeMounts = append(sts.Spec.Template.Spec.Containers[0].VolumeMounts,
			v1.VolumeMount{Name: c.Name, MountPath: "/" + c.Name})
	}
	return sts
}

// waitForCapacity waits until external-provisioner has published the
// CSIStorageCapacity of class for node, which VolumeBinding needs before it
// lets a claim of that class onto the node.
func waitForCapacity(t *testing.T, class, node string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctxFor(t, time.Minute), 500*time.Millisecond, 50*time.Second, true, func(ctx context.Context) (bool, error) {
		caps, err := kube.StorageV1().CSIStorageCapacities(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range caps.Items {
			if c.StorageClassName == class && c.NodeTopology != nil && c.NodeTopology.MatchLabels[diskfit.TopologyKey] == node {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no CSIStorageCapacity for class %s on %s: %v", class, node, err)
	}
}
