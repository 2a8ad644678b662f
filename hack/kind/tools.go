//go:build tools

// Package kind pins what hack/kind/build-node-image.sh builds from the
// Kubernetes module for the offline kind node image: the node's binaries
// (kubelet, kubeadm, kubectl), the control plane's images (kube-apiserver,
// kube-controller-manager, kube-scheduler, kube-proxy) and etcd at the
// version kubeadm asks for (etcd's server module is its main package).
// Its own module, so the node's Kubernetes builds from upstream's
// dependency versions, not from diskfit's.
package kind

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubeadm"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
