package e2e

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/streaming/pkg/httpstream"
	"k8s.io/utils/ptr"

	"github.com/diskfit/diskfit/apis/diskfit"
)

// The tests in this file run real containers (-shell-image) and read what
// they wrote through the kubelet's exec, so they need a cluster whose
// kubelets run containers: kind (hack/kind-e2e.sh) or a real one. The local
// cluster's kubelets run no containers; its tests reach the same volumes
// through their host paths instead (TestDataSurvivesPodRestart).
func needContainers(t *testing.T) {
	t.Helper()
	if localDir != "" {
		t.Skip("needs real containers: the local cluster's kubelets run none (TestDataSurvivesPodRestart checks its volumes through host paths)")
	}
}

// shellPod returns a pod of -shell-image that sleeps, with the claim fs
// mounted at /data and the Block claim raw at /dev/xvda (either may be "").
func shellPod(name, fs, raw string) *v1.Pod {
	pod := podSpec(name, diskfit.SchedulerName)
	c := &pod.Spec.Containers[0]
	c.Image = *shellImage
	c.Command = []string{"sleep", "infinity"}
	if fs != "" {
		pod.Spec.Volumes = append(pod.Spec.Volumes, v1.Volume{Name: "fs", VolumeSource: v1.VolumeSource{
			PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: fs},
		}})
		c.VolumeMounts = append(c.VolumeMounts, v1.VolumeMount{Name: "fs", MountPath: "/data"})
	}
	if raw != "" {
		pod.Spec.Volumes = append(pod.Spec.Volumes, v1.Volume{Name: "raw", VolumeSource: v1.VolumeSource{
			PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: raw},
		}})
		c.VolumeDevices = append(c.VolumeDevices, v1.VolumeDevice{Name: "raw", DevicePath: "/dev/xvda"})
	}
	return pod
}

// shell runs script with sh -c in the pod's first container, through the
// API server and the kubelet as kubectl exec does, and returns its stdout.
func shell(t *testing.T, ns, pod, script string) string {
	t.Helper()
	req := kube.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("exec").
		VersionedParams(&v1.PodExecOptions{Command: []string{"sh", "-c", script}, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ws, err := remotecommand.NewWebSocketExecutor(restConfig, "GET", req.URL().String())
	if err != nil {
		t.Fatal(err)
	}
	spdy, err := remotecommand.NewSPDYExecutor(restConfig, "POST", req.URL())
	if err != nil {
		t.Fatal(err)
	}
	exec, err := remotecommand.NewFallbackExecutor(ws, spdy, httpstream.IsUpgradeFailure)
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if err := exec.StreamWithContext(ctxFor(t, 2*time.Minute), remotecommand.StreamOptions{Stdout: &stdout, Stderr: &stderr}); err != nil {
		t.Fatalf("in pod %s/%s: %s: %v; stderr: %s", ns, pod, script, err, stderr.String())
	}
	return strings.TrimSpace(stdout.String())
}

// recreatePod deletes the running pod old, creates pod in its place and
// waits until it runs, on old's node: its volumes are local.
func recreatePod(t *testing.T, old, pod *v1.Pod) {
	t.Helper()
	deletePodAndWait(t, old.Namespace, old.Name)
	createPod(t, old.Namespace, pod)
	running := waitPodRunning(t, old.Namespace, pod.Name, 3*time.Minute)
	if running.Spec.NodeName != old.Spec.NodeName {
		t.Fatalf("pod moved from %s to %s although its volumes are local", old.Spec.NodeName, running.Spec.NodeName)
	}
}

// The bytes a container writes to a Filesystem volume and to a Block
// volume are there, unchanged, for the container of a new pod on the same
// node: written and synced by one container, checksummed by another,
// through the real kubelet, containerd and the driver's mounts.
func TestDataSurvivesPodRecreationInRealContainers(t *testing.T) {
	needContainers(t)
	ns := newNamespace(t)
	class := newStorageClass(t, "")
	newPVC(t, ns, "fs", class, 256*mi)
	raw := claim("raw", class, 64*mi)
	raw.Spec.VolumeMode = ptr.To(v1.PersistentVolumeBlock)
	if _, err := kube.CoreV1().PersistentVolumeClaims(ns).Create(ctxFor(t, time.Minute), raw, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	createPod(t, ns, shellPod("writer", "fs", "raw"))
	first := waitPodRunning(t, ns, "writer", 3*time.Minute)
	// 16 MiB of random bytes to each volume; the device is written with
	// direct I/O and both are synced before their checksums are taken.
	wroteFile := shell(t, ns, "writer", "head -c 16M /dev/urandom > /data/proof && sync /data/proof && sha256sum < /data/proof")
	wroteDev := shell(t, ns, "writer", "head -c 16M /dev/urandom > /tmp/blk && dd if=/tmp/blk of=/dev/xvda bs=1M oflag=direct conv=fsync status=none && sha256sum < /tmp/blk")

	recreatePod(t, first, shellPod("writer", "fs", "raw"))
	if got := shell(t, ns, "writer", "sha256sum < /data/proof"); got != wroteFile {
		t.Errorf("file read back %s, written %s", got, wroteFile)
	}
	if got := shell(t, ns, "writer", "head -c 16M /dev/xvda | sha256sum"); got != wroteDev {
		t.Errorf("device read back %s, written %s", got, wroteDev)
	}
}

// A rollout of the driver's DaemonSet while pods use their volumes: the
// pods' mounts stay usable while the driver pod is replaced (they are the
// host's mounts, shared through Bidirectional propagation, not the driver
// container's), and the new driver pod serves the volumes afterwards: a pod
// created after the rollout mounts them and reads what was written before.
func TestDriverRolloutKeepsVolumesServed(t *testing.T) {
	needContainers(t)
	ns := newNamespace(t)
	class := newStorageClass(t, "")
	newPVC(t, ns, "fs", class, 128*mi)
	createPod(t, ns, shellPod("user", "fs", ""))
	first := waitPodRunning(t, ns, "user", 3*time.Minute)
	before := shell(t, ns, "user", "head -c 4M /dev/urandom > /data/before && sync /data/before && sha256sum < /data/before")

	restartDriver(t)

	// The running pod's mount: still there and writable.
	if got := shell(t, ns, "user", "sha256sum < /data/before"); got != before {
		t.Errorf("after the rollout the running pod reads %s, wrote %s", got, before)
	}
	after := shell(t, ns, "user", "head -c 4M /dev/urandom > /data/after && sync /data/after && sha256sum < /data/after")

	// A new pod: unpublished and published again by the new driver pod.
	recreatePod(t, first, shellPod("user", "fs", ""))
	if got := shell(t, ns, "user", "sha256sum < /data/before; sha256sum < /data/after"); got != before+"\n"+after {
		t.Errorf("the new pod reads\n%s\nwant\n%s\n%s", got, before, after)
	}
}

// restartDriver rolls the driver's DaemonSet out again, as kubectl rollout
// restart does, and waits until every node runs a new, ready driver pod.
func restartDriver(t *testing.T) {
	t.Helper()
	const ns, name = "diskfit-system", "diskfit-csi-node"
	ctx := ctxFor(t, 6*time.Minute)
	patch := fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"kubectl.kubernetes.io/restartedAt":%q}}}}}`, time.Now().Format(time.RFC3339Nano))
	ds, err := kube.AppsV1().DaemonSets(ns).Patch(ctx, name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	generation := ds.Generation
	err = wait.PollUntilContextTimeout(ctx, time.Second, 5*time.Minute, false, func(ctx context.Context) (bool, error) {
		ds, err := kube.AppsV1().DaemonSets(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		s := ds.Status
		return s.ObservedGeneration >= generation && s.UpdatedNumberScheduled == s.DesiredNumberScheduled &&
			s.NumberAvailable == s.DesiredNumberScheduled && s.NumberUnavailable == 0, nil
	})
	if err != nil {
		t.Fatalf("the driver's DaemonSet did not roll out: %v", err)
	}
}

// The webhook deployed from manifests/webhook sets diskfit-scheduler on a
// new pod that uses a diskfit claim and names no scheduler, and the pod is
// placed by it. (The local cluster runs the webhook in the test process:
// TestWebhookSetsTheSchedulerOfDiskFitPods.)
func TestDeployedWebhookSetsTheScheduler(t *testing.T) {
	needContainers(t)
	_, err := kube.AppsV1().Deployments("diskfit-system").Get(ctxFor(t, time.Minute), "diskfit-webhook", metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		t.Skip("manifests/webhook is not deployed on this cluster")
	} else if err != nil {
		t.Fatal(err)
	}
	ns := newNamespace(t)
	class := newStorageClass(t, "")
	newPVC(t, ns, "data", class, 64*mi)
	waitForWebhook(t, ns, "data")
	pod := createPod(t, ns, podSpec("unnamed", "", "data"))
	if pod.Spec.SchedulerName != diskfit.SchedulerName {
		t.Fatalf("pod with a diskfit claim and no scheduler: schedulerName %q, want %q", pod.Spec.SchedulerName, diskfit.SchedulerName)
	}
	waitPodRunning(t, ns, "unnamed", 3*time.Minute)
	pvc := waitPVCsBound(t, ns, []string{"data"}, time.Minute)["data"]
	if pvc.Annotations[diskfit.SelectedDiskAnnotation] == "" {
		t.Errorf("claim bound without the disk diskfit-scheduler chose: %v", pvc.Annotations)
	}
}
