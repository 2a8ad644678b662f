package config

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// dirs makes the named directories below a fresh temp dir and returns it.
func dirs(t *testing.T, names ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, n := range names {
		if err := os.MkdirAll(filepath.Join(dir, n), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func diskNames(c *NodeConfig) string {
	var names []string
	for _, d := range c.Disks {
		names = append(names, d.Name)
	}
	return strings.Join(names, ",")
}

func TestResolveSections(t *testing.T) {
	dir := dirs(t, "top", "gpu", "big", "edge")
	file := `
maxVolumes: 10
disks:
- name: top
  path: ` + dir + `/top
nodes:
- nodeNames: [edge-1, edge-2]
  disks:
  - name: edge
    path: ` + dir + `/edge
- nodeSelector:
    matchLabels: {diskfit.io/layout: gpu}
  maxVolumes: 5
  disks:
  - name: gpu
    path: ` + dir + `/gpu
- nodeSelector:
    matchExpressions:
    - {key: disk-size, operator: In, values: [big, huge]}
  disks:
  - name: big
    path: ` + dir + `/big
- nodeNames: [both]
  nodeSelector:
    matchLabels: {zone: a}
  disks:
  - name: edge
    path: ` + dir + `/edge
`
	f, err := Decode([]byte(file))
	if err != nil {
		t.Fatal(err)
	}
	if !f.NeedsLabels() {
		t.Error("a file with nodeSelector sections does not say it needs the node's labels")
	}
	tests := []struct {
		name      string
		node      string
		labels    map[string]string
		wantDisks string
		wantMax   int64
	}{
		{name: "node name", node: "edge-2", labels: map[string]string{"diskfit.io/layout": "gpu"}, wantDisks: "edge", wantMax: 10},
		{name: "match labels", node: "n1", labels: map[string]string{"diskfit.io/layout": "gpu"}, wantDisks: "gpu", wantMax: 5},
		{name: "match expressions", node: "n2", labels: map[string]string{"disk-size": "huge"}, wantDisks: "big", wantMax: 10},
		{name: "first matching section wins", node: "n3", labels: map[string]string{"diskfit.io/layout": "gpu", "disk-size": "big"}, wantDisks: "gpu", wantMax: 5},
		{name: "names and selector must both match", node: "both", labels: map[string]string{"zone": "b"}, wantDisks: "top", wantMax: 10},
		{name: "names and selector both match", node: "both", labels: map[string]string{"zone": "a"}, wantDisks: "edge", wantMax: 10},
		{name: "no section matches: top level", node: "n4", labels: map[string]string{"disk-size": "small"}, wantDisks: "top", wantMax: 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := f.Resolve(tt.node, tt.labels)
			if err != nil {
				t.Fatal(err)
			}
			if got := diskNames(c); got != tt.wantDisks || c.MaxVolumes != tt.wantMax {
				t.Errorf("got disks %s, maxVolumes %d; want %s, %d", got, c.MaxVolumes, tt.wantDisks, tt.wantMax)
			}
		})
	}
}

func TestResolveNoSectionNoDefault(t *testing.T) {
	dir := dirs(t, "gpu")
	f, err := Decode([]byte("nodes:\n- nodeSelector: {matchLabels: {gpu: \"true\"}}\n  disks:\n  - name: gpu\n    path: " + dir + "/gpu\n"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.Resolve("plain-node", map[string]string{"gpu": "false"})
	if !errors.Is(err, ErrNoSection) || !strings.Contains(err.Error(), "plain-node") {
		t.Fatalf("got %v, want ErrNoSection naming the node", err)
	}
}

func TestDecodeErrors(t *testing.T) {
	dir := dirs(t, "a")
	tests := []struct{ name, yaml, wantErr string }{
		{name: "unknown section key", yaml: "nodes:\n- nodeNames: [a]\n  disk: []\n", wantErr: `unknown field "disk"`},
		{name: "unknown selector key", yaml: "nodes:\n- nodeSelector: {matchLabel: {a: b}}\n  disks: [{name: a, path: " + dir + "/a}]\n", wantErr: `unknown field "matchLabel"`},
		{name: "unknown discover key", yaml: "discover: {path: " + dir + ", class: x}\n", wantErr: `unknown field "class"`},
		{name: "section without selector", yaml: "nodes:\n- disks: [{name: a, path: " + dir + "/a}]\n", wantErr: "nodes[0]: needs nodeNames or nodeSelector"},
		{name: "section without disks", yaml: "nodes:\n- nodeNames: [a]\n", wantErr: "nodes[0]: needs disks or discover"},
		{name: "bad operator", yaml: "nodes:\n- nodeSelector: {matchExpressions: [{key: a, operator: Near, values: [b]}]}\n  disks: [{name: a, path: " + dir + "/a}]\n", wantErr: "nodes[0].nodeSelector"},
		{name: "bad disk name in another node's section", yaml: "disks: [{name: a, path: " + dir + "/a}]\nnodes:\n- nodeNames: [x]\n  disks: [{name: Bad_Name, path: /x}]\n", wantErr: "nodes[0].disks[0]"},
		{name: "relative discover path", yaml: "discover: {path: mnt/disks}\n", wantErr: "discover: path \"mnt/disks\" is not absolute"},
		{name: "discover lvm", yaml: "discover: {path: /mnt/disks, backend: lvm}\n", wantErr: "discover: only the file backend"},
		{name: "device class file with a slash", yaml: "discover: {path: /mnt/disks, deviceClassFile: a/b}\n", wantErr: "deviceClassFile"},
		{name: "negative discover reserve", yaml: "discover: {path: /mnt/disks, reserved: -1Gi}\n", wantErr: "reserved must not be negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Decode([]byte(tt.yaml))
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("got %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestSourceReadsLabelsOnlyWhenNeeded(t *testing.T) {
	dir := dirs(t, "a", "b")
	p := filepath.Join(dir, "node.yaml")
	write := func(s string) {
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	calls := 0
	labels := map[string]string{"layout": "b"}
	src := &Source{Path: p, NodeName: "n", Labels: func(context.Context) (map[string]string, error) { calls++; return labels, nil }}
	write("disks: [{name: a, path: " + dir + "/a}]\n")
	if c, err := src.Load(context.Background()); err != nil || diskNames(c) != "a" || calls != 0 {
		t.Fatalf("plain file: %v, %v, %d label reads", c, err, calls)
	}
	write("disks: [{name: a, path: " + dir + "/a}]\nnodes:\n- nodeSelector: {matchLabels: {layout: b}}\n  disks: [{name: b, path: " + dir + "/b}]\n")
	for range 3 {
		if c, err := src.Load(context.Background()); err != nil || diskNames(c) != "b" {
			t.Fatalf("sections: %v, %v", c, err)
		}
	}
	if calls != 1 {
		t.Errorf("labels read %d times for one file content, want 1", calls)
	}
}
