//go:build tools

// Package tools pins the versions of controller-gen, the linters, the CSI
// sidecars, csi-sanity, buildx (for make images) and kind (for the kind
// end-to-end run) that the Makefile builds into bin/.
package tools

import (
	_ "github.com/docker/buildx/cmd/buildx"
	_ "github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity"
	_ "github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner"
	_ "github.com/kubernetes-csi/external-resizer/v2/cmd/csi-resizer"
	_ "github.com/kubernetes-csi/external-snapshotter/v8/cmd/csi-snapshotter"
	_ "github.com/kubernetes-csi/external-snapshotter/v8/cmd/snapshot-controller"
	_ "golang.org/x/vuln/cmd/govulncheck"
	_ "honnef.co/go/tools/cmd/staticcheck"
	_ "sigs.k8s.io/controller-tools/cmd/controller-gen"
	_ "sigs.k8s.io/kind"
)
