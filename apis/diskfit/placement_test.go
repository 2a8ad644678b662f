package diskfit

import (
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestValidateDiskName(t *testing.T) {
	tests := []struct {
		name    string
		disk    string
		wantErr string
	}{
		{name: "simple", disk: "nvme0"},
		{name: "dots dashes underscores", disk: "ssd-1.a_b"},
		{name: "single character", disk: "a"},
		{name: "longest allowed", disk: strings.Repeat("a", MaxDiskNameLength)},
		{name: "empty", disk: "", wantErr: "empty"},
		{name: "too long", disk: strings.Repeat("a", MaxDiskNameLength+1), wantErr: "longer than"},
		{name: "upper case", disk: "NVMe0", wantErr: "lower-case"},
		{name: "slash", disk: "a/b", wantErr: "lower-case"},
		{name: "dot dot", disk: "..", wantErr: "lower-case"},
		// Its volume IDs would contain ".." and be refused (found by FuzzIDRoundTrip).
		{name: "dot dot inside", disk: "a..b", wantErr: `must not contain ".."`},
		{name: "single dots", disk: "a.b.c"},
		{name: "leading dash", disk: "-a", wantErr: "lower-case"},
		{name: "trailing dot", disk: "a.", wantErr: "lower-case"},
		{name: "NUL", disk: "a\x00b", wantErr: "lower-case"},
		{name: "space", disk: "a b", wantErr: "lower-case"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := ValidateDiskName(tt.disk)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("ValidateDiskName(%q) = %v, want nil", tt.disk, err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("ValidateDiskName(%q) = %v, want error containing %q", tt.disk, err, tt.wantErr)
			}
		})
	}
}

func TestPVCLocation(t *testing.T) {
	claim := func(node, disk, volume string) *v1.PersistentVolumeClaim {
		pvc := &v1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{}}, Spec: v1.PersistentVolumeClaimSpec{VolumeName: volume}}
		if node != "" {
			pvc.Annotations[SelectedNodeAnnotation] = node
		}
		if disk != "" {
			pvc.Annotations[SelectedDiskAnnotation] = disk
		}
		return pvc
	}
	tests := []struct {
		name string
		pvc  *v1.PersistentVolumeClaim
		// selected is what SelectedLocation says, placed what
		// PVCLocation says.
		selected, placed bool
	}{
		{name: "placed", pvc: claim("node-a", "nvme0", ""), selected: true, placed: true},
		{name: "no annotations", pvc: claim("", "", "")},
		{name: "node only", pvc: claim("node-a", "", "")},
		// A reschedule removed selected-node: the disk no longer counts.
		{name: "stale disk", pvc: claim("", "nvme0", "")},
		// Names no disk: the scheduler places the claim again, the driver
		// refuses it.
		{name: "malformed disk", pvc: claim("node-a", "../etc", ""), selected: true},
		{name: "dot dot disk", pvc: claim("node-a", "a..b", ""), selected: true},
		// A bound claim's volume is where its PV says.
		{name: "bound", pvc: claim("node-a", "nvme0", "pv-1"), selected: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := Location{Node: tt.pvc.Annotations[SelectedNodeAnnotation], Disk: tt.pvc.Annotations[SelectedDiskAnnotation]}
			loc, ok := SelectedLocation(tt.pvc)
			if ok != tt.selected || (ok && loc != want) || (!ok && loc != Location{}) {
				t.Fatalf("SelectedLocation = %+v, %v; want %+v, %v", loc, ok, want, tt.selected)
			}
			loc, ok = PVCLocation(tt.pvc)
			if ok != tt.placed || (ok && loc != want) || (!ok && loc != Location{}) {
				t.Fatalf("PVCLocation = %+v, %v; want %+v, %v", loc, ok, want, tt.placed)
			}
		})
	}
}

func withHandle(pv *v1.PersistentVolume, handle string) *v1.PersistentVolume {
	pv.Spec.CSI.VolumeHandle = handle
	pv.Spec.CSI.VolumeAttributes = nil
	return pv
}

func TestPVLocation(t *testing.T) {
	volume := func(driver, disk string, exprs ...v1.NodeSelectorRequirement) *v1.PersistentVolume {
		pv := &v1.PersistentVolume{Spec: v1.PersistentVolumeSpec{PersistentVolumeSource: v1.PersistentVolumeSource{
			CSI: &v1.CSIPersistentVolumeSource{Driver: driver, VolumeAttributes: map[string]string{VolumeContextDiskKey: disk}},
		}}}
		if len(exprs) > 0 {
			pv.Spec.NodeAffinity = &v1.VolumeNodeAffinity{Required: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{MatchExpressions: exprs}}}}
		}
		return pv
	}
	on := func(key string, op v1.NodeSelectorOperator, values ...string) v1.NodeSelectorRequirement {
		return v1.NodeSelectorRequirement{Key: key, Operator: op, Values: values}
	}
	tests := []struct {
		name string
		pv   *v1.PersistentVolume
		want Location
		ok   bool
		// notOurs: IsDiskFitPV is false as well.
		notOurs bool
	}{
		{name: "diskfit", pv: volume(DriverName, "nvme0", on(TopologyKey, v1.NodeSelectorOpIn, "node-a")), want: Location{Node: "node-a", Disk: "nvme0"}, ok: true},
		{name: "other keys first", pv: volume(DriverName, "nvme0", on("zone", v1.NodeSelectorOpIn, "z1"), on(TopologyKey, v1.NodeSelectorOpIn, "node-a")), want: Location{Node: "node-a", Disk: "nvme0"}, ok: true},
		{name: "another driver", pv: volume("other.csi", "nvme0", on(TopologyKey, v1.NodeSelectorOpIn, "node-a")), notOurs: true},
		{name: "not CSI", pv: &v1.PersistentVolume{}, notOurs: true},
		{name: "no node affinity", pv: volume(DriverName, "nvme0")},
		{name: "two nodes", pv: volume(DriverName, "nvme0", on(TopologyKey, v1.NodeSelectorOpIn, "node-a", "node-b"))},
		{name: "not In", pv: volume(DriverName, "nvme0", on(TopologyKey, v1.NodeSelectorOpNotIn, "node-a"))},
		{name: "no disk", pv: volume(DriverName, "", on(TopologyKey, v1.NodeSelectorOpIn, "node-a"))},
		{name: "malformed disk", pv: volume(DriverName, "a/b", on(TopologyKey, v1.NodeSelectorOpIn, "node-a"))},
		// A PV made by hand from the handle, size and node diskfit status
		// shows: the driver serves it from the handle, which names the disk.
		{name: "disk in the handle only", pv: withHandle(volume(DriverName, "", on(TopologyKey, v1.NodeSelectorOpIn, "node-a")), "nvme0:pvc-1"), want: Location{Node: "node-a", Disk: "nvme0"}, ok: true},
		{name: "handle without a disk", pv: withHandle(volume(DriverName, "", on(TopologyKey, v1.NodeSelectorOpIn, "node-a")), "pvc-1")},
	}
	for _, tt := range tests {
		if loc, ok := PVLocation(tt.pv); ok != tt.ok || loc != tt.want {
			t.Errorf("%s: PVLocation = %+v, %v; want %+v, %v", tt.name, loc, ok, tt.want, tt.ok)
		}
		if got := IsDiskFitPV(tt.pv); got == tt.notOurs {
			t.Errorf("%s: IsDiskFitPV = %v, want %v", tt.name, got, !tt.notOurs)
		}
	}
}

func TestPVRefersTo(t *testing.T) {
	const handle = "nvme0:pvc-1"
	pv := func(terms ...[]string) *v1.PersistentVolume {
		p := &v1.PersistentVolume{Spec: v1.PersistentVolumeSpec{PersistentVolumeSource: v1.PersistentVolumeSource{
			CSI: &v1.CSIPersistentVolumeSource{Driver: DriverName, VolumeHandle: handle}}}}
		if terms == nil {
			return p
		}
		sel := &v1.NodeSelector{}
		for _, nodes := range terms {
			sel.NodeSelectorTerms = append(sel.NodeSelectorTerms, v1.NodeSelectorTerm{MatchExpressions: []v1.NodeSelectorRequirement{
				{Key: TopologyKey, Operator: v1.NodeSelectorOpIn, Values: nodes}}})
		}
		p.Spec.NodeAffinity = &v1.VolumeNodeAffinity{Required: sel}
		return p
	}
	tests := []struct {
		name string
		pv   *v1.PersistentVolume
		want bool
	}{
		{"on this node", pv([]string{"node-a"}), true},
		{"on another node", pv([]string{"node-b"}), false},
		{"no node affinity", pv(), true},
		{"another node's term, then this node's", pv([]string{"node-b"}, []string{"node-a"}), true},
		{"several nodes, this one among them", pv([]string{"node-b", "node-a"}), true},
	}
	for _, tt := range tests {
		if got := PVRefersTo(tt.pv, "node-a", handle); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
	if PVRefersTo(pv([]string{"node-a"}), "node-a", "nvme1:pvc-1") {
		t.Error("a PV of another handle refers to the volume")
	}
}
