package e2e

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/diskfit/diskfit/apis/diskfit"
)

// Data written through a pod's volume survives the pod: the StatefulSet
// recreates the pod on the same node, the kubelet stages and publishes the
// same volume again, and the file is there.
func TestDataSurvivesPodRestart(t *testing.T) {
	needLocal(t)
	ns := newNamespace(t)
	class := newStorageClass(t, "")
	sts := statefulSet("keep", diskfit.SchedulerName, class, 1, 512*mi)
	if _, err := kube.AppsV1().StatefulSets(ns).Create(ctxFor(t, time.Minute), sts, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pvc := waitPVCsBound(t, ns, []string{"data0-keep-0"}, 2*time.Minute)["data0-keep-0"]
	first := waitPodRunning(t, ns, "keep-0", 2*time.Minute)
	content := []byte(fmt.Sprintf("written through pod %s at %s\n", first.UID, time.Now()))
	if err := os.WriteFile(filepath.Join(hostVolumePath(first, pvc.Spec.VolumeName), "proof"), content, 0o644); err != nil {
		t.Fatalf("writing through the published volume: %v", err)
	}

	if err := kube.CoreV1().Pods(ns).Delete(ctxFor(t, time.Minute), "keep-0", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	var second *v1.Pod
	deadline := time.Now().Add(2 * time.Minute)
	for {
		second = waitPodRunning(t, ns, "keep-0", 2*time.Minute)
		if second.UID != first.UID {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the StatefulSet did not recreate its pod")
		}
		time.Sleep(500 * time.Millisecond)
	}
	if second.Spec.NodeName != first.Spec.NodeName {
		t.Fatalf("pod moved from %s to %s although its volume is local", first.Spec.NodeName, second.Spec.NodeName)
	}
	got, err := os.ReadFile(filepath.Join(hostVolumePath(second, pvc.Spec.VolumeName), "proof"))
	if err != nil {
		t.Fatalf("reading through the republished volume: %v", err)
	}
	if !bytes.Equal(got, content) {
		t.Fatalf("read %q, wrote %q", got, content)
	}
}

// A Block claim is published to the pod as a block device.
func TestBlockVolumeIsPublishedAsDevice(t *testing.T) {
	needLocal(t)
	ns := newNamespace(t)
	class := newStorageClass(t, "")
	c := claim("raw", class, 64*mi)
	c.Spec.VolumeMode = ptr.To(v1.PersistentVolumeBlock)
	if _, err := kube.CoreV1().PersistentVolumeClaims(ns).Create(ctxFor(t, time.Minute), c, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := podSpec("raw", diskfit.SchedulerName)
	pod.Spec.Volumes = []v1.Volume{{Name: "raw", VolumeSource: v1.VolumeSource{
		PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: "raw"},
	}}}
	pod.Spec.Containers[0].VolumeDevices = []v1.VolumeDevice{{Name: "raw", DevicePath: "/dev/xvda"}}
	createPod(t, ns, pod)
	pvc := waitPVCsBound(t, ns, []string{"raw"}, 2*time.Minute)["raw"]
	running := waitPodRunning(t, ns, "raw", 2*time.Minute)
	if got := pvc.Status.Capacity.Storage().Value(); got != diskfit.VolumeBytes(64*mi, true) {
		t.Errorf("block volume capacity %d, want %d", got, diskfit.VolumeBytes(64*mi, true))
	}
	// The kubelet maps the published device into the pod's volumeDevices.
	path := filepath.Join(localDir, "nodes", running.Spec.NodeName, "kubelet", "pods", string(running.UID),
		"volumeDevices", "kubernetes.io~csi", pvc.Spec.VolumeName)
	st, err := os.Stat(path)
	if err != nil {
		t.Fatalf("published device: %v", err)
	}
	if st.Mode()&os.ModeDevice == 0 {
		t.Fatalf("%s is %v, not a block device", path, st.Mode())
	}
}
