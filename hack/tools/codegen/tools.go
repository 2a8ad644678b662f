//go:build tools

// Package codegen pins the Kubernetes code generators apart from the other
// tools: at the oldest Kubernetes minor diskfit-scheduler is built for, so
// the generated DiskNode clientset, listers and informers compile against
// the client-go of every supported minor (docs/kubernetes-versions.md).
// Newer generators emit code that only newer client-go has the types for.
package codegen

import (
	_ "k8s.io/code-generator/cmd/client-gen"
	_ "k8s.io/code-generator/cmd/conversion-gen"
	_ "k8s.io/code-generator/cmd/deepcopy-gen"
	_ "k8s.io/code-generator/cmd/defaulter-gen"
	_ "k8s.io/code-generator/cmd/informer-gen"
	_ "k8s.io/code-generator/cmd/lister-gen"
)
