#!/usr/bin/env bash
# Builds diskfit's images from hack/Dockerfile with BuildKit (docker buildx,
# or bin/buildx built from the pin in hack/tools/go.mod where the Docker CLI
# has no buildx plugin) and loads them into the local Docker engine, then
# prints each image's build time and size.
#
#   hack/build-images.sh                  every image, on the public base images
#   OFFLINE=1 hack/build-images.sh        on base images built here (no registry)
#   IMAGES="diskfit-csi diskfit-scheduler" TAG=dev REGISTRY=ghcr.io/diskfit hack/build-images.sh
#   KUBE_MINORS=1 IMAGES=diskfit-scheduler hack/build-images.sh
#
# KUBE_MINORS=1 also builds diskfit-scheduler for each older Kubernetes
# minor (hack/kube-minor.sh list), tagged TAG-kubeMINOR, e.g. dev-kube1.35
# (docs/kubernetes-versions.md).
#
# OFFLINE=1 builds the base images with hack/build-base-images.sh (cached,
# needs root and debootstrap) and passes them as the Dockerfile's build
# arguments. diskfit-kind-registrar and diskfit-kind-livenessprobe stand in
# for the two sidecars no Go module serves, in the kind overlay only
# (test/cmd/kind-registrar, test/cmd/kind-livenessprobe): not product images.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
registry=${REGISTRY:-ghcr.io/diskfit}
tag=${TAG:-dev}
read -r -a images <<<"${IMAGES:-diskfit-scheduler diskfit-csi diskfit-webhook diskfit-controller diskfit diskfit-kind-registrar diskfit-kind-livenessprobe}"

if docker buildx version >/dev/null 2>&1; then
	buildx=(docker buildx)
elif [[ -x $root/bin/buildx ]]; then
	buildx=("$root/bin/buildx")
else
	echo "build-images: no docker buildx plugin and no bin/buildx (make images builds it)" >&2
	exit 1
fi

args=()
if [[ ${OFFLINE:-} == 1 ]]; then
	base_images=$(hack/build-base-images.sh)
	while IFS= read -r arg; do
		args+=(--build-arg "$arg")
	done <<<"$base_images"
fi

summary=()
# build IMAGE TAG [BUILD-ARGS...]
build() {
	local image=$1 tag=$2 start=$SECONDS size
	shift 2
	"${buildx[@]}" build --load -f hack/Dockerfile --target "$image" -t "$registry/$image:$tag" "${args[@]}" "$@" .
	size=$(docker image inspect -f '{{.Size}}' "$registry/$image:$tag" | numfmt --to=iec)
	summary+=("$(printf '%-48s %5ss %6s' "$registry/$image:$tag" $((SECONDS - start)) "$size")")
}
for image in "${images[@]}"; do
	build "$image" "$tag"
	if [[ $image == diskfit-scheduler && ${KUBE_MINORS:-} == 1 ]]; then
		for minor in $(hack/kube-minor.sh list); do
			build "$image" "$tag-kube$minor" --build-arg "KUBE_MINOR=$minor"
		done
	fi
done
printf '%s\n' "${summary[@]}"
