package diskfit

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/diskfit/diskfit/apis/diskfit"
)

func TestLedgerFollowsInformers(t *testing.T) {
	env := newTestEnv(t, nil, []runtime.Object{node("n1")}, diskNode("n1", freeDisk("d0", 10*gi)))
	loc := diskfit.Location{Node: "n1", Disk: "d0"}
	pvc := makePVC("a", diskfitClass, 3*gi).placed("n1", "d0").PersistentVolumeClaim
	if _, err := env.client.CoreV1().PersistentVolumeClaims("ns").Create(env.ctx, pvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "annotated PVC in the ledger", func() bool { return env.pl.ledger.Used(loc) == 3*gi })

	// external-provisioner asks for a reschedule by removing selected-node.
	pvc = pvc.DeepCopy()
	delete(pvc.Annotations, diskfit.SelectedNodeAnnotation)
	if _, err := env.client.CoreV1().PersistentVolumeClaims("ns").Update(env.ctx, pvc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "released PVC out of the ledger", func() bool { return env.pl.ledger.Used(loc) == 0 })

	dn := diskNode("n1", freeDisk("d0", 10*gi), freeDisk("d1", 5*gi))
	if _, err := env.dfClient.DiskfitV1alpha1().DiskNodes().Update(env.ctx, dn, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "new disk in the ledger", func() bool {
		disks, _ := env.pl.ledger.Disks("n1", nil)
		return len(disks) == 2
	})
}
