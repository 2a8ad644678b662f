#!/usr/bin/env bash
# Builds, without any container registry, the images of the CSI sidecars and
# of snapshot-controller that manifests/overlays/kind runs, under their
# public names (registry.k8s.io/sig-storage/<name>:<version>), as kind names
# the control plane's images it builds: each is the static binary of the
# version pinned in hack/tools/go.mod in an image of its own, with the
# entrypoint upstream's image has (/<name>). A manifest that asks for
# another version than the pin fails here, not later as ImagePullBackOff.
# node-driver-registrar and livenessprobe are not among them: no Go module
# serves their source, and the overlay runs stand-ins (hack/Dockerfile).
#
# Prints the images, one per line; an image the engine already has is not
# built again. Needs docker, go and kubectl.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
log_prefix=build-sidecar-images
# Defines log, need, have, scratch and import_dir, and sets root and cache.
# shellcheck source=hack/build-base-images.sh
source "$here/../build-base-images.sh"

declare -A packages=(
	[csi-provisioner]=github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner
	[csi-resizer]=github.com/kubernetes-csi/external-resizer/v2/cmd/csi-resizer
	[csi-snapshotter]=github.com/kubernetes-csi/external-snapshotter/v8/cmd/csi-snapshotter
	[snapshot-controller]=github.com/kubernetes-csi/external-snapshotter/v8/cmd/snapshot-controller
)

main() {
	need docker go kubectl tar
	mkdir -p "$cache"
	local ref name tag pkg module version dir
	while read -r ref; do
		name=${ref##*/}
		tag=${name#*:}
		name=${name%%:*}
		pkg=${packages[$name]:-}
		[[ -n $pkg ]] || { log "$ref: no Go package is known for $name"; exit 1; }
		module=${pkg%/cmd/*}
		version=$(cd "$root/hack/tools" && go list -m -f '{{.Version}}' "$module")
		[[ $version == "$tag" ]] || { log "$ref: hack/tools/go.mod pins $module $version"; exit 1; }
		if ! have "$ref"; then
			scratch "$name"
			dir=$REPLY
			log "building $name $version"
			(cd "$root/hack/tools" && CGO_ENABLED=0 nice -n 10 go build -trimpath -ldflags "-s -w" -o "$dir/$name" "$pkg")
			import_dir "$ref" "$dir" "ENTRYPOINT [\"/$name\"]"
		fi
		echo "$ref"
	done < <(kubectl kustomize "$root/manifests/overlays/kind" |
		sed -n 's/^ *image: \(registry\.k8s\.io\/sig-storage\/[^ ]*\)$/\1/p' | sort -u)
}

main "$@"
