#!/usr/bin/env bash
# Regenerates everything derived from the API types:
#   for the DiskNode API: deepcopy functions, the typed clientset, listers and
#   informers, and the CRD YAML (also copied into the Helm chart's crds/);
#   for the DiskFit plugin arguments: deepcopy functions (internal and v1),
#   and v1's conversions to the internal type and defaulter registration.
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
args=scheduler-plugin/apis/config
args_pkgs=("$module/$args" "$module/$args/v1")

rm -f "$apis"/diskfit/v1alpha1/zz_generated.deepcopy.go "$args"/zz_generated.deepcopy.go "$args"/v1/zz_generated.*.go
"$bin/deepcopy-gen" --go-header-file "$header" --output-file zz_generated.deepcopy.go "${pkgs[@]}" "${args_pkgs[@]}"
"$bin/conversion-gen" --go-header-file "$header" --output-file zz_generated.conversion.go "$module/$args/v1"
"$bin/defaulter-gen" --go-header-file "$header" --output-file zz_generated.defaults.go "$module/$args/v1"

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
# Helm installs a chart's CRDs from its crds/ as they are written; test/chart
# checks that they stay these files.
install -m 0644 manifests/base/crd/*.yaml manifests/helm/diskfit/crds/
