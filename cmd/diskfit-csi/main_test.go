package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/diskfit/diskfit/csi-driver/fault"
)

func TestRunRejectsBadStart(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "node.yaml")
	if err := os.WriteFile(cfg, []byte("disks:\n- name: d\n  path: "+dir+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		opts    options
		killAt  string
		wantErr string
	}{
		{name: "missing config", opts: options{configPath: filepath.Join(dir, "nope.yaml"), kubeconfig: kubeconfig}, wantErr: "reading node config"},
		{name: "bad config", opts: options{configPath: kubeconfig, kubeconfig: kubeconfig}, wantErr: "unknown field"},
		{name: "outside a cluster without kubeconfig", opts: options{configPath: cfg}, wantErr: "pass --kubeconfig"},
		{name: "no node ID", opts: options{configPath: cfg, kubeconfig: kubeconfig, endpoint: "unix://" + dir + "/csi.sock", kubeletDir: dir, resync: 1}, wantErr: "node ID is required"},
		{name: "unknown fault step", opts: options{configPath: cfg}, killAt: "CreateVolume/nowhere", wantErr: "names no step"},
		{name: "negative orphan grace period", opts: options{configPath: cfg, kubeconfig: kubeconfig, endpoint: "unix://" + dir + "/csi.sock", nodeID: "n", kubeletDir: dir, resync: 1, orphanGrace: -1}, wantErr: "orphan grace period must not be negative"},
		{name: "negative disk status timeout", opts: options{configPath: cfg, kubeconfig: kubeconfig, endpoint: "unix://" + dir + "/csi.sock", nodeID: "n", kubeletDir: dir, resync: 1, diskTimeout: -1}, wantErr: "disk status timeout must not be negative"},
		{name: "relative kubelet dir", opts: options{configPath: cfg, kubeconfig: kubeconfig, endpoint: "unix://" + dir + "/csi.sock", nodeID: "n", kubeletDir: "var/lib/kubelet", lockDir: dir, resync: 1}, wantErr: "kubelet directory \"var/lib/kubelet\" is not absolute"},
		{name: "relative lock dir", opts: options{configPath: cfg, kubeconfig: kubeconfig, endpoint: "unix://" + dir + "/csi.sock", nodeID: "n", kubeletDir: dir, lockDir: "run/lock/diskfit", resync: 1}, wantErr: "lock directory \"run/lock/diskfit\" is not absolute"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(fault.EnvVar, tt.killAt)
			if tt.opts.kubeconfig == "" && os.Getenv("KUBERNETES_SERVICE_HOST") != "" {
				t.Skip("runs inside a cluster, where the in-cluster config exists")
			}
			err := run(context.Background(), tt.opts)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("got %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}
