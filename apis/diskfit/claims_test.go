package diskfit

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func TestClaimWaitsFor(t *testing.T) {
	const uid = "0b5c3f2e-1111-2222-3333-444455556666"
	// claim is the claim app/data of UID id, selected for node selected
	// (none when empty) and bound to the PV bound (none when empty).
	claim := func(id, selected, bound string) *v1.PersistentVolumeClaim {
		c := &v1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "data", Namespace: "app", UID: types.UID(id)}}
		if selected != "" {
			c.Annotations = map[string]string{SelectedNodeAnnotation: selected}
		}
		c.Spec.VolumeName = bound
		return c
	}
	for _, tt := range []struct {
		name           string
		claim          *v1.PersistentVolumeClaim
		volume         string
		waits, checkPV bool
	}{
		{"pending here", claim(uid, "node-a", ""), "pvc-" + uid, true, false},
		{"pending here, by handle", claim(uid, "node-a", ""), "nvme0:pvc-" + uid, true, false},
		{"pending, not scheduled", claim(uid, "", ""), "pvc-" + uid, true, false},
		{"scheduled elsewhere", claim(uid, "node-b", ""), "pvc-" + uid, false, false},
		{"made again", claim("another-uid", "node-a", ""), "pvc-" + uid, false, false},
		{"bound under the volume's name", claim(uid, "node-a", "pvc-"+uid), "nvme0:pvc-" + uid, true, true},
		{"bound to another PV", claim(uid, "node-a", "pv-static"), "pvc-" + uid, false, false},
		{"gone", nil, "pvc-" + uid, false, false},
	} {
		waits, checkPV := ClaimWaitsFor(tt.claim, tt.volume, "node-a")
		if waits != tt.waits || checkPV != tt.checkPV {
			t.Errorf("%s: waits %v, check the PV %v; want %v, %v", tt.name, waits, checkPV, tt.waits, tt.checkPV)
		}
	}
}
