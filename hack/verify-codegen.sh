#!/usr/bin/env bash
# Fails when a generated file differs from what hack/update-codegen.sh makes.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

generated=(apis/diskfit/v1alpha1/zz_generated.deepcopy.go apis/client manifests/base/crd manifests/helm/diskfit/crds
  scheduler-plugin/apis/config/zz_generated.deepcopy.go
  scheduler-plugin/apis/config/v1/zz_generated.deepcopy.go
  scheduler-plugin/apis/config/v1/zz_generated.conversion.go
  scheduler-plugin/apis/config/v1/zz_generated.defaults.go)
# Regenerate into a copy of the tree so the working tree is never touched.
cd "$root"
git ls-files -co --exclude-standard -z | xargs -0 cp --parents -t "$tmp" 2>/dev/null || true
ln -s "$root/bin" "$tmp/bin"
(cd "$tmp" && hack/update-codegen.sh >/dev/null)

status=0
for path in "${generated[@]}"; do
  if ! diff -r "$root/$path" "$tmp/$path" >"$tmp/diff" 2>&1; then
    echo "stale generated code in $path; run 'make generate':" >&2
    cat "$tmp/diff" >&2
    status=1
  fi
done
exit $status
