#!/usr/bin/env bash
# Makes hack/runc-capfilter the Docker engine's default runtime, and undoes
# it. kind starts its nodes with `docker run --privileged`, which fails on a
# host whose capability bounding set lacks a capability Docker asks for
# (docs/kind-offline.md); the wrapper drops those and runs runc.
#
#   hack/kind/host-setup.sh enable    back up /etc/docker/daemon.json, add the runtime, make it the default
#                                     (nothing where dockerd's bounding set is full);
#                                     make loop device nodes for the kind nodes (loop_nodes)
#   hack/kind/host-setup.sh disable   put the backup back
#
# dockerd reloads `runtimes` and `default-runtime` on SIGHUP: running
# containers are left alone. Needs root and python3.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
wrapper=$(cd "$here/.." && pwd)/runc-capfilter
config=${DOCKER_DAEMON_JSON:-/etc/docker/daemon.json}
backup=$config.diskfit-kind-backup
# The backup of a host that had no daemon.json.
absent=$backup.absent

log() { echo "host-setup: $*" >&2; }

# reload sends dockerd SIGHUP and waits until it reports default runtime $1.
reload() {
	local want=$1 _
	kill -HUP "$(pidof dockerd)"
	for _ in $(seq 20); do
		[[ $(docker info -f '{{.DefaultRuntime}}') == "$want" ]] && { log "default runtime: $want"; return; }
		sleep 0.5
	done
	log "dockerd's default runtime is $(docker info -f '{{.DefaultRuntime}}'), not $want"
	exit 1
}

# write_config writes daemon.json as $1 (a JSON file, or none) with the
# keys of the JSON object $2 set.
write_config() {
	python3 - "$config" "$1" "$2" <<-'EOF'
		import json, os, sys
		path, base, keys = sys.argv[1:]
		doc = json.load(open(base)) if os.path.exists(base) else {}
		doc.update(json.loads(keys))
		open(path + ".tmp", "w").write(json.dumps(doc, indent=2) + "\n")
		os.replace(path + ".tmp", path)
	EOF
}

# full_bounding_set: dockerd's capability bounding set holds every
# capability the kernel knows, so privileged containers start without help.
full_bounding_set() {
	local bnd last
	bnd=$(awk '/^CapBnd:/ {print $2}' "/proc/$(pidof dockerd)/status")
	last=$(cat /proc/sys/kernel/cap_last_cap)
	(((0x$bnd & ((1 << (last + 1)) - 1)) == (1 << (last + 1)) - 1))
}

# loop_nodes makes the host's /dev/loop0 to loop127 device nodes where they
# are missing. A privileged container gets the host's device nodes as they
# are when it starts; losetup in a kind node (make-disks.sh, the driver's
# Block volumes) asks /dev/loop-control for a free loop device, which the
# kernel may create then, and opens /dev/loopN, which must already exist in
# the node's /dev.
loop_nodes() {
	local i
	for i in $(seq 0 127); do
		[[ -e /dev/loop$i ]] || mknod -m 0660 "/dev/loop$i" b 7 "$i"
	done
}

enable() {
	loop_nodes
	if full_bounding_set; then
		log "dockerd's bounding set is full: nothing to do"
		return
	fi
	if [[ -e $backup || -e $absent ]]; then
		log "already enabled ($backup exists)"
		return
	elif [[ -f $config ]]; then
		cp -p "$config" "$backup"
	else
		mkdir -p "$(dirname "$config")"
		touch "$absent"
	fi
	write_config "$backup" "{\"runtimes\": {\"runc-capfilter\": {\"path\": \"$wrapper\"}}, \"default-runtime\": \"runc-capfilter\"}"
	reload runc-capfilter
}

# disable: dockerd keeps the values of keys that a reload no longer finds,
# so it first reloads the backup with runc the default and the backup's
# runtimes (none if it had none), then puts the backup back as it was.
disable() {
	if [[ ! -e $backup && ! -e $absent ]]; then
		log "not enabled (no $backup)"
		return
	fi
	local runtimes
	runtimes=$(python3 -c 'import json, os, sys; p = sys.argv[1]; print(json.dumps((json.load(open(p)) if os.path.exists(p) else {}).get("runtimes", {})))' "$backup")
	write_config "$backup" "{\"runtimes\": $runtimes, \"default-runtime\": \"runc\"}"
	reload runc
	if [[ -e $absent ]]; then
		rm -f "$config" "$absent"
	else
		mv "$backup" "$config"
	fi
	kill -HUP "$(pidof dockerd)"
}

case ${1:-} in
enable | disable) "$1" ;;
*)
	echo "usage: $0 enable|disable" >&2
	exit 2
	;;
esac
