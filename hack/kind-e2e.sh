#!/usr/bin/env bash
# Runs diskfit's end-to-end suite (test/e2e) against a kind cluster, on a
# machine with Docker and kind. The same tests run on the local cluster in
# `make test`; here the ones that reach a node's disks or kubelet directory
# from the host skip with that reason, the rest run unchanged.
#
#   hack/kind-e2e.sh            create cluster "diskfit-e2e", test, delete it
#   KEEP=1 hack/kind-e2e.sh     leave the cluster running
#   OFFLINE=1 hack/kind-e2e.sh  no registry: the node image and every image
#                               are built here (hack/kind/build-node-image.sh)
#
# Needs: docker, kubectl, go; kind is bin/kind (make builds it from the pin).
# Nothing here runs without a Docker engine. On a host whose capability
# bounding set is short, hack/kind/host-setup.sh makes runc-capfilter the
# engine's default runtime while the cluster exists (docs/kind-offline.md).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
cluster=${CLUSTER:-diskfit-e2e}
kubeconfig=$(mktemp)
[[ -x bin/kind ]] || make --no-print-directory "$root/bin/kind"
# bin/ first: make-disks.sh calls kind too.
export PATH=$root/bin:$PATH
cleanup() {
	rm -f "$kubeconfig"
	# KEEP=1: the cluster, and the engine's default runtime it needs, stay.
	[[ ${KEEP:-} == 1 ]] || { kind delete cluster --name "$cluster" || true; hack/kind/host-setup.sh disable; }
}
trap cleanup EXIT

for tool in docker kubectl go; do
	command -v "$tool" >/dev/null || { echo "kind-e2e: $tool not found" >&2; exit 1; }
done

echo "== building images"
# The images manifests/overlays/kind runs; OFFLINE=1 builds their base
# images here too (hack/build-images.sh).
images=(diskfit-csi diskfit-scheduler diskfit-controller diskfit-webhook diskfit-kind-registrar diskfit-kind-livenessprobe)
IMAGES="${images[*]}" TAG=dev hack/build-images.sh
refs=("${images[@]/#/ghcr.io/diskfit/}")
refs=("${refs[@]/%/:dev}")

# The tests that write and read data run this image's sh, dd and sha256sum.
node_image=()
if [[ ${OFFLINE:-} == 1 ]]; then
	# The sidecars and snapshot-controller under their public names, and
	# Debian from the same debootstrap as diskfit's images.
	sidecars=$(hack/kind/build-sidecar-images.sh)
	mapfile -t sidecars <<<"$sidecars"
	refs+=("${sidecars[@]}")
	shell_image=$(hack/build-base-images.sh | sed -n 's/^DEBIAN_IMAGE=//p')
	node_image=(--image "$(hack/kind/build-node-image.sh)")
	# The nodes' /var is a volume on the host's file system, where
	# containerd's overlayfs works even when the engine's storage is
	# fuse-overlayfs (kind would pick fuse-overlayfs, not in the image).
	export KIND_EXPERIMENTAL_CONTAINERD_SNAPSHOTTER=overlayfs
else
	shell_image=debian:bookworm-slim
	docker image inspect "$shell_image" >/dev/null 2>&1 || docker pull "$shell_image"
fi
refs+=("$shell_image")
hack/kind/host-setup.sh enable

echo "== creating kind cluster $cluster (3 nodes)"
# failCgroupV1: false lets the kubelet start on a cgroup v1 host.
cat <<EOC | kind create cluster --name "$cluster" --kubeconfig "$kubeconfig" "${node_image[@]}" --config -
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
kubeadmConfigPatches:
  - |
    kind: KubeletConfiguration
    failCgroupV1: false
nodes:
  - role: control-plane
  - role: worker
  - role: worker
  - role: worker
EOC
export KUBECONFIG=$kubeconfig
kind load docker-image --name "$cluster" "${refs[@]}"
# The pods that only hold volumes run the pause image the nodes have.
pause_image=$(docker exec "$cluster-control-plane" crictl images | awk '$1 ~ /\/pause$/ { print $1 ":" $2; exit }')

echo "== disks, then diskfit"
manifests/overlays/kind/make-disks.sh "$cluster"
# The overlay's VolumeSnapshotClass is of a CRD the same apply creates: the
# first apply makes the CRDs and refuses that object, the second makes it
# once they are established.
kubectl apply --server-side -k manifests/overlays/kind || true
kubectl wait --for condition=established --timeout=2m crd --all
kubectl apply --server-side -k manifests/overlays/kind
kubectl -n diskfit-system rollout status daemonset/diskfit-csi-node --timeout=5m
kubectl -n diskfit-system rollout status deployment/diskfit-scheduler --timeout=5m
kubectl -n diskfit-system rollout status deployment/diskfit-controller --timeout=5m
kubectl -n diskfit-system rollout status deployment/diskfit-webhook --timeout=5m
kubectl -n kube-system rollout status deployment/snapshot-controller --timeout=5m

echo "== e2e"
go test -count=1 -timeout 45m ./test/e2e -kubeconfig "$kubeconfig" -v \
	-pod-image "$pause_image" -shell-image "$shell_image"
