#!/usr/bin/env bash
# Runs diskfit's end-to-end suite (test/e2e) against a kind cluster, on a
# machine with Docker and kind. The same tests run on the local cluster in
# `make test`; here the ones that reach a node's disks or kubelet directory
# from the host skip with that reason, the rest run unchanged.
#
#   hack/kind-e2e.sh            create cluster "diskfit-e2e", test, delete it
#   KEEP=1 hack/kind-e2e.sh     leave the cluster running
#
# Needs: docker, kind, kubectl, go. Nothing here runs without a Docker engine.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
cluster=${CLUSTER:-diskfit-e2e}
kubeconfig=$(mktemp)
trap 'rm -f "$kubeconfig"; [[ ${KEEP:-} == 1 ]] || kind delete cluster --name "$cluster"' EXIT

for tool in docker kind kubectl go; do
	command -v "$tool" >/dev/null || { echo "kind-e2e: $tool not found" >&2; exit 1; }
done

echo "== building images"
# The images manifests/overlays/kind runs; OFFLINE=1 builds their base
# images here too (hack/build-images.sh).
images=(diskfit-csi diskfit-scheduler diskfit-controller diskfit-kind-registrar)
IMAGES="${images[*]}" TAG=dev hack/build-images.sh

echo "== creating kind cluster $cluster (3 nodes)"
cat <<EOC | kind create cluster --name "$cluster" --kubeconfig "$kubeconfig" --config -
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
  - role: control-plane
  - role: worker
  - role: worker
  - role: worker
EOC
export KUBECONFIG=$kubeconfig
refs=("${images[@]/#/ghcr.io/diskfit/}")
kind load docker-image --name "$cluster" "${refs[@]/%/:dev}"

echo "== disks, then diskfit"
manifests/overlays/kind/make-disks.sh "$cluster"
kubectl apply --server-side -k manifests/overlays/kind
kubectl -n diskfit-system rollout status daemonset/diskfit-csi-node --timeout=5m
kubectl -n diskfit-system rollout status deployment/diskfit-scheduler --timeout=5m
kubectl -n diskfit-system rollout status deployment/diskfit-controller --timeout=5m

echo "== e2e"
go test -count=1 -timeout 45m ./test/e2e -kubeconfig "$kubeconfig" -v
