#!/usr/bin/env bash
# Renders every kustomization under manifests/ (the base, each overlay, the
# examples) with the kustomize that kubectl embeds and fails on the first
# error, so a broken reference, patch or generator is caught before a
# cluster sees it; then renders the Helm chart manifests/helm/diskfit with
# Helm's Go packages and compares it, object by object, with the overlays
# it stands for (go test ./test/chart). Needs kubectl and Go; no cluster.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

if ! command -v kubectl >/dev/null; then
	echo "verify-manifests: kubectl not found" >&2
	exit 1
fi

status=0
count=0
while IFS= read -r k; do
	dir=$(dirname "$k")
	# A Component renders only inside an overlay; test/chart renders each
	# one in the overlay it is for.
	if grep -q '^kind: Component$' "$k"; then
		continue
	fi
	count=$((count + 1))
	if ! out=$(kubectl kustomize "$dir" 2>&1); then
		echo "verify-manifests: $dir does not render:" >&2
		echo "$out" >&2
		status=1
		continue
	fi
	if [[ -z $out ]]; then
		echo "verify-manifests: $dir renders nothing" >&2
		status=1
	fi
done < <(find manifests -name kustomization.yaml | sort)

if [[ $count -eq 0 ]]; then
	echo "verify-manifests: no kustomization.yaml under manifests/" >&2
	exit 1
fi
if ! out=$(go test -count=1 ./test/chart 2>&1); then
	echo "verify-manifests: the Helm chart manifests/helm/diskfit does not match the kustomizations:" >&2
	echo "$out" >&2
	status=1
fi
[[ $status -eq 0 ]] && echo "verify-manifests: $count kustomizations render; the Helm chart matches them"
exit $status
