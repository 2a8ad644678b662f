package e2e

import (
	"path/filepath"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/diskfit/diskfit/apis/diskfit"
)

// A claim annotated with a node and a disk, of a class that does not
// exist and as large as the disk, books nothing: a diskfit pod whose claim
// only that node can hold is still placed there and bound. Every disk of
// the class on the node is "filled" this way, so the pod could not fit if
// any forged claim counted. The admission policy lets only
// diskfit-scheduler write the disk annotation (TestOnlyTheSchedulerChoosesTheDisk),
// so the annotations are written with its identity here: they stand for
// claims annotated before the policy was installed, or by a tool that
// bypasses it.
func TestForgedClaimsBookNothing(t *testing.T) {
	needLocal(t)
	const deviceClass = "nvme"
	schedulerCfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(localDir, "kubeconfig-diskfit-system-diskfit-scheduler"))
	if err != nil {
		t.Fatal(err)
	}
	asScheduler, err := kubernetes.NewForConfig(schedulerCfg)
	if err != nil {
		t.Fatal(err)
	}
	list, err := diskfitAPI.DiskfitV1alpha1().DiskNodes().List(ctxFor(t, time.Minute), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ns := newNamespace(t)
	node := ""
	for _, dn := range list.Items {
		for _, d := range dn.Status.Disks {
			if !d.Usable(deviceClass) || (node != "" && dn.Name != node) {
				continue
			}
			node = dn.Name
			forged, err := kube.CoreV1().PersistentVolumeClaims(ns).Create(ctxFor(t, time.Minute),
				claim("forged-"+d.Name, "no-such-class", d.CapacityBytes), metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			forged.Annotations = map[string]string{diskfit.SelectedNodeAnnotation: node, diskfit.SelectedDiskAnnotation: d.Name}
			if _, err := asScheduler.CoreV1().PersistentVolumeClaims(ns).Update(ctxFor(t, time.Minute), forged, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if node == "" {
		t.Skipf("no node has disks of device class %q", deviceClass)
	}
	class := newStorageClass(t, deviceClass)
	newPVC(t, ns, "data", class, 300*mi)
	createPod(t, ns, podSpec("app", diskfit.SchedulerName, "data"))
	waitPVCsBound(t, ns, []string{"data"}, 2*time.Minute)
	if pod := waitPodRunning(t, ns, "app", 2*time.Minute); pod.Spec.NodeName != node {
		t.Errorf("pod on %s, want %s (the only node with %s disks)", pod.Spec.NodeName, node, deviceClass)
	}
	checkSchedulerKeptItsPromise(t, ns)
}
