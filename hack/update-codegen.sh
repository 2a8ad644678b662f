#!/usr/bin/env bash
# Regenerates everything derived from the DiskNode API types:
#   deepcopy functions, the typed clientset, listers and informers, and the CRD YAML.
# The generators come from hack/tools (pinned versions), built into bin/ by `make tools`.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bin="$root/bin"
module=github.com/diskfit/diskfit
apis=apis
client=apis/client
header=hack/boilerplate.go.txt
pkgs=("$module/$apis/diskfit/v1alpha1")

rm -f "$apis"/diskfit/v1alpha1/zz_generated.deepcopy.go
"$bin/deepcopy-gen" --go-header-file "$header" --output-file zz_generated.deepcopy.go "${pkgs[@]}"

rm -rf "$client"
"$bin/client-gen" --go-header-file "$header" \
  --clientset-name versioned \
  --input-base "$root/$apis" --input diskfit/v1alpha1 \
  --output-dir "$client/clientset" --output-pkg "$module/$client/clientset"
"$bin/lister-gen" --go-header-file "$header" \
  --output-dir "$client/listers" --output-pkg "$module/$client/listers" "${pkgs[@]}"
"$bin/informer-gen" --go-header-file "$header" \
  --output-dir "$client/informers" --output-pkg "$module/$client/informers" \
  --versioned-clientset-package "$module/$client/clientset/versioned" \
  --listers-package "$module/$client/listers" "${pkgs[@]}"

"$bin/controller-gen" crd:crdVersions=v1 paths="./$apis/diskfit/..." output:crd:dir=manifests/base/crd
