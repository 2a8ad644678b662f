#!/usr/bin/env bash
# Runs every Go fuzz target of the module (func FuzzXxx(f *testing.F) in a
# _test.go file) for a bounded time, one after the other, and fails when any
# of them finds a crash. A crash is written by `go test` to the package's
# testdata/fuzz/FuzzXxx/ directory: commit it with the fix, and from then on
# `go test ./...` (make test) replays it.
#
#   FUZZTIME=5m          time per target (go test -fuzztime: 30s, 1h, 10000x)
#   FUZZ='^FuzzParse'    only targets whose name matches this extended regex
#   FUZZPARALLEL=2       fuzzing worker processes per target (default GOMAXPROCS)
#
# FuzzCreateVolume needs root (it runs the driver on a loop-mounted disk) and
# skips otherwise. Mounts and loop devices a crashed fuzz worker could not
# clean up are removed after each target and reported as a failure.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
GO=${GO:-go}
FUZZTIME=${FUZZTIME:-5m}
FUZZ=${FUZZ:-.}
FUZZPARALLEL=${FUZZPARALLEL:-}
TMPBASE=${TMPDIR:-/tmp}

# "<package dir> <target>" for every fuzz target, sorted.
targets=$(grep -rHoE --include='*_test.go' --exclude-dir=.git --exclude-dir=hack \
	'^func Fuzz[A-Za-z0-9_]*\(f \*testing\.F\)' . |
	sed -E 's#^\./(.*)/[^/]*_test\.go:func (Fuzz[A-Za-z0-9_]*)\(.*#\1 \2#' |
	awk -v re="$FUZZ" '$2 ~ re' || true)
targets=$(sort -u <<<"$targets")
if [[ -z $targets ]]; then
	echo "fuzz.sh: no fuzz target matches FUZZ=$FUZZ" >&2
	exit 1
fi

# leftovers removes mounts and loop devices below $TMPBASE/Fuzz* (the fuzz
# targets' t.TempDir) and prints what it removed.
leftovers() {
	[[ $(id -u) == 0 ]] || return 0
	local m dev
	# /proc/self/mounts escapes spaces; t.TempDir paths have none.
	awk -v b="$TMPBASE/Fuzz" 'index($2, b) == 1 { print $2 }' /proc/self/mounts | sort -r |
		while read -r m; do umount -l "$m" && echo "$m"; done
	losetup -nO NAME,BACK-FILE 2>/dev/null | awk -v b="$TMPBASE/Fuzz" 'index($2, b) == 1 { print $1 }' |
		while read -r dev; do losetup -d "$dev" && echo "$dev"; done
}

failed=()
while read -r dir name; do
	echo "== $name (./$dir) for $FUZZTIME"
	args=(test -run '^$' -fuzz "^${name}\$" -fuzztime "$FUZZTIME")
	[[ -n $FUZZPARALLEL ]] && args+=(-parallel "$FUZZPARALLEL")
	if ! "$GO" "${args[@]}" "./$dir"; then
		failed+=("$name: crash or failure, see ./$dir/testdata/fuzz/$name/")
	fi
	left=$(leftovers)
	if [[ -n $left ]]; then
		echo "$name left mounts or loop devices behind (removed):" >&2
		echo "$left" >&2
		failed+=("$name: left mounts or loop devices behind")
	fi
done <<<"$targets"

if ((${#failed[@]})); then
	echo "fuzz.sh: FAILED" >&2
	printf '  %s\n' "${failed[@]}" >&2
	exit 1
fi
echo "fuzz.sh: $(wc -l <<<"$targets") targets, no crash"
