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
		{"pending, its UID cut in the name", claim(uid, "node-a", ""), "nvme0:pvc-0b5c3f2e1111", true, false},
		{"made again, a cut UID", claim("7d00aa00-1111-2222-3333-444455556666", "node-a", ""), "pvc-0b5c3f2e1111", false, false},
		{"bound to another PV", claim(uid, "node-a", "pv-static"), "pvc-" + uid, false, false},
		{"gone", nil, "pvc-" + uid, false, false},
	} {
		waits, checkPV := ClaimWaitsFor(tt.claim, tt.volume, "node-a")
		if waits != tt.waits || checkPV != tt.checkPV {
			t.Errorf("%s: waits %v, check the PV %v; want %v, %v", tt.name, waits, checkPV, tt.waits, tt.checkPV)
		}
	}
}

func TestNamedFor(t *testing.T) {
	for _, tt := range []struct {
		name, uid string
		want      bool
	}{
		{"snapshot-0b5e-41aa", "0b5e-41aa", true},
		{"snap-7c11d2", "7c11d2ab-0000", true},
		{"snapshot-0b5e-41aa", "9f00-1234", false},
		{"snapshot-0b5e-41aa", "", false},
		{"snapshot-", "0b5e", false},
		{"snapshot-x0b5e-41aa", "0b5e-41aa", false},
	} {
		if got := NamedFor(tt.name, tt.uid); got != tt.want {
			t.Errorf("NamedFor(%q, %q) = %v, want %v", tt.name, tt.uid, got, tt.want)
		}
	}
}
