#!/usr/bin/env bash
# diskfit-scheduler for an older Kubernetes minor: the same source, built
# against that minor's k8s.io/kubernetes and staging modules.
#
#   hack/kube-minor.sh list                  the older minors, one per line
#   hack/kube-minor.sh test MINOR [FLAGS]    the scheduler's tests for MINOR
#   hack/kube-minor.sh build MINOR [FLAGS]   diskfit-scheduler for MINOR (e.g. -o bin/diskfit-scheduler-kube1.35)
#   hack/kube-minor.sh controlplane MINOR [FLAGS]  the tests' control plane for MINOR (test/cmd/controlplane, for test/skew)
#   hack/kube-minor.sh go MINOR CMD [ARGS]   a go command that takes build flags (build, test, vet, list, run) for MINOR
#   hack/kube-minor.sh check                 every older minor's module file resolves what is built for it (no compiling)
#   hack/kube-minor.sh update MINOR          rewrite hack/kube/MINOR.mod and .sum from go.mod
#
# go.mod is the newest minor's; each older minor has a module file,
# hack/kube/MINOR.mod (go's -modfile), that is go.mod with the Kubernetes
# modules and etcd at that minor's versions. The build tag kubeMINOR (e.g.
# kube1.35) selects the few files that follow an older framework API
# (scheduler-plugin/diskfit/kube*.go). docs/kubernetes-versions.md says
# which image goes with which cluster.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

# The k8s.io/kubernetes release of each older minor. The newest minor is
# go.mod's.
declare -A release=(
	[1.35]=v1.35.4
	[1.36]=v1.36.3
)

# What is built and tested for every minor: the API contract, the plugin,
# the scheduler command, and the scheduler against that minor's API server.
# The driver, CLI, webhook and controller are one build (client-go works
# with older API servers); the local cluster is the newest minor's.
tests=(./apis/... ./scheduler-plugin/... ./test/kubeminor)
scheduler=./cmd/diskfit-scheduler
# The control plane the newest minor's clients (driver, controller, CLI)
# are tested against in test/skew.
controlplane=./test/cmd/controlplane

usage() {
	sed -n '4,11p' "${BASH_SOURCE[0]}" | sed 's/^# *//' >&2
	exit 2
}

minor_go() {
	local minor=$1
	shift
	[[ -n "${release[$minor]:-}" ]] || { echo "unknown minor $minor; known: ${!release[*]}" >&2; exit 2; }
	local cmd=$1
	shift
	go "$cmd" -modfile="hack/kube/$minor.mod" -tags="kube$minor" "$@"
}

# update writes MINOR's module file: go.mod's direct requirements, with the
# staging modules of that release (those its own go.mod replaces with
# ./staging) and k8s.io/kubernetes replaced by that release, and etcd at
# the version that release's API server uses; `go mod tidy` then settles
# the indirect requirements
# (-e: packages only the newest minor builds, such as the scheduler_perf
# benchmarks, need not resolve), and listing what is built for the minor
# records every checksum it needs.
update() {
	local minor=$1 k8s=${release[$1]:-} mod staging upstream etcd
	[[ -n "$k8s" ]] || { echo "unknown minor $minor; known: ${!release[*]}" >&2; exit 2; }
	mod=hack/kube/$minor.mod
	staging=v0.${k8s#v1.}
	upstream=$(go mod download -json "k8s.io/kubernetes@$k8s" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')
	etcd=$(awk '$1 == "go.etcd.io/etcd/client/v3" {print $2; exit}' "$upstream")
	mkdir -p hack/kube
	{
		sed -E -e '/^\tk8s\.io\/[a-z0-9-]+ => /d' -e '/\/\/ indirect$/d' \
			-e "s#^(\tgo\.etcd\.io/etcd/[a-z0-9/]+/v3) v3\.[0-9.]+#\1 $etcd#" go.mod
		echo
		echo "replace ("
		awk -v v="$staging" '$2 == "=>" && $3 ~ /^\.\/staging\// {print "\t" $1 " => " $1 " " v}' "$upstream"
		echo "	k8s.io/kubernetes => k8s.io/kubernetes $k8s"
		echo ")"
	} >"$mod"
	cp go.sum "${mod%.mod}.sum"
	go mod edit -modfile="$mod" -require="k8s.io/kubernetes@$k8s"
	go mod tidy -e -modfile="$mod" 2>/dev/null
	minor_go "$minor" list -mod=mod -deps -test "${tests[@]}" "$scheduler" "$controlplane" >/dev/null
	echo "$mod: k8s.io/kubernetes $k8s, staging $staging, etcd $etcd"
}

[[ $# -ge 1 ]] || usage
case $1 in
list) printf '%s\n' "${!release[@]}" | sort -V ;;
test) [[ $# -ge 2 ]] || usage; minor_go "$2" test "${@:3}" "${tests[@]}" ;;
build) [[ $# -ge 2 ]] || usage; minor_go "$2" build "${@:3}" "$scheduler" ;;
controlplane) [[ $# -ge 2 ]] || usage; minor_go "$2" build "${@:3}" "$controlplane" ;;
go) [[ $# -ge 3 ]] || usage; minor_go "${@:2}" ;;
update) [[ $# -eq 2 ]] || usage; update "$2" ;;
check)
	# A module file that no longer covers an import (go.mod gained one)
	# fails here, with the command that fixes it.
	for minor in $(printf '%s\n' "${!release[@]}" | sort -V); do
		if ! minor_go "$minor" list -deps -test "${tests[@]}" "$scheduler" "$controlplane" >/dev/null; then
			echo "hack/kube/$minor.mod is stale: run hack/kube-minor.sh update $minor" >&2
			exit 1
		fi
	done
	;;
*) usage ;;
esac
