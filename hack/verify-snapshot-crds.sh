#!/usr/bin/env bash
# Checks that manifests/snapshot/crd and the Helm chart's
# manifests/helm/diskfit/charts/snapshot/crds hold exactly the VolumeSnapshot
# CRDs of the external-snapshotter version hack/tools pins (its client
# module, client/config/crd). With --update, copies them there instead.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
version=$(cd "$root/hack/tools" && go list -m -f '{{.Version}}' github.com/kubernetes-csi/external-snapshotter/v8)
src=$(cd "$root/hack/tools" && go mod download -json "github.com/kubernetes-csi/external-snapshotter/client/v8@$version" |
	sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
if [[ -z $src ]]; then
	echo "verify-snapshot-crds: cannot download external-snapshotter/client/v8@$version" >&2
	exit 1
fi
dst="$root/manifests/snapshot/crd"
# The Helm chart's copies (its snapshot subchart's crds/).
chart="$root/manifests/helm/diskfit/charts/snapshot/crds"
status=0
for kind in volumesnapshotclasses volumesnapshotcontents volumesnapshots; do
	file="snapshot.storage.k8s.io_$kind.yaml"
	for d in "$dst" "$chart"; do
		if [[ ${1:-} == --update ]]; then
			install -m 0644 "$src/config/crd/$file" "$d/$file"
		elif ! cmp -s "$src/config/crd/$file" "$d/$file"; then
			echo "verify-snapshot-crds: $d/$file differs from external-snapshotter $version; run $0 --update" >&2
			status=1
		fi
	done
done
[[ $status -eq 0 ]] && echo "verify-snapshot-crds: CRDs match external-snapshotter $version"
exit $status
