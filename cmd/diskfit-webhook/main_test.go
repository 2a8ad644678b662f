package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRunRejectsBadStart(t *testing.T) {
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	valid := options{kubeconfig: kubeconfig, namespace: "diskfit-system", serviceName: "diskfit-webhook", secretName: "s", webhookConfigName: "w", port: 9443}
	tests := []struct {
		name    string
		modify  func(*options)
		wantErr string
	}{
		{name: "port out of range", modify: func(o *options) { o.port = 70000 }, wantErr: "--port"},
		{name: "missing kubeconfig", modify: func(o *options) { o.kubeconfig = filepath.Join(t.TempDir(), "none") }, wantErr: "client config"},
		{name: "no namespace", modify: func(o *options) { o.namespace = "" }, wantErr: "namespace"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := valid
			tt.modify(&o)
			err := run(context.Background(), o)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("run: %v, want an error mentioning %q", err, tt.wantErr)
			}
		})
	}
}
