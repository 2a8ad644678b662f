package lvm

import (
	"errors"
	"slices"
	"testing"
	"time"
)

func TestParseReports(t *testing.T) {
	lvs, err := ParseLVs(`{"report":[{"lv":[` +
		`{"lv_name":"v-b","lv_size":"4194304","lv_tags":"diskfit.name=YQ,diskfit.state=ready","lv_time":"2026-11-29 23:40:01 +0000","lv_attr":"owi-a-s---"},` +
		`{"lv_name":"swap","lv_size":"1","lv_tags":"","lv_time":"yesterday","lv_attr":"-wi-ao----"},` +
		`{"lv_name":"s-c","lv_size":"4194304","lv_tags":"","lv_time":"","origin":"v-b"}]}]}`)
	want := []LV{
		{Name: "s-c", SizeBytes: 4 << 20, Origin: "v-b"},
		{Name: "swap", SizeBytes: 1, Open: true},
		{Name: "v-b", SizeBytes: 4 << 20, Tags: []string{"diskfit.name=YQ", "diskfit.state=ready"}, Time: time.Date(2026, 11, 29, 23, 40, 1, 0, time.UTC)},
	}
	if err != nil || !slices.EqualFunc(lvs, want, func(a, b LV) bool {
		return a.Name == b.Name && a.SizeBytes == b.SizeBytes && slices.Equal(a.Tags, b.Tags) && a.Time.Equal(b.Time) && a.Origin == b.Origin && a.Open == b.Open
	}) {
		t.Errorf("ParseLVs = %+v, %v, want %+v sorted by name", lvs, err, want)
	}
	for name, out := range map[string]string{
		"bad size": `{"report":[{"lv":[{"lv_name":"v-a","lv_size":"4M","lv_tags":"diskfit.name=YQ"}]}]}`,
		"not JSON": `  LV   VG`,
	} {
		if lvs, err := ParseLVs(out); err == nil {
			t.Errorf("ParseLVs of %s = %+v, want an error", name, lvs)
		}
	}
	if lvs, err := ParseLVs(`{"report":[{"lv":[]}]}`); err != nil || len(lvs) != 0 {
		t.Errorf("ParseLVs of an empty group = %+v, %v", lvs, err)
	}

	if vg, ok, err := ParseVGs(`{"report":[{"vg":[{"vg_name":"other","vg_size":"1","vg_free":"1"}]}]}`, "vg0"); ok || err != nil {
		t.Errorf("ParseVGs of another group = %+v, %v, %v", vg, ok, err)
	}
	if vg, ok, err := ParseVGs(`{"report":[{"vg":[{"vg_name":"vg0","vg_size":"100","vg_free":"40"}]}]}`, "vg0"); !ok || err != nil || vg != (VG{SizeBytes: 100, FreeBytes: 40}) {
		t.Errorf("ParseVGs = %+v, %v, %v", vg, ok, err)
	}
	if _, _, err := ParseVGs(`{"report":[{"vg":[{"vg_name":"vg0","vg_size":"1g","vg_free":"40"}]}]}`, "vg0"); err == nil {
		t.Error("ParseVGs of a size with a unit: no error")
	}
}

func TestInsufficientSpace(t *testing.T) {
	if !InsufficientSpace(errors.New(`lvcreate: exit status 5: Volume group "vg0" has insufficient free space (1 extents): 25 required.`)) ||
		!InsufficientSpace(errors.New("Insufficient free space: 100 extents needed, but only 1 available")) {
		t.Error("lvcreate's and lvextend's messages are not insufficient space")
	}
	if InsufficientSpace(nil) || InsufficientSpace(errors.New("Volume group not found")) {
		t.Error("other errors are insufficient space")
	}
}
