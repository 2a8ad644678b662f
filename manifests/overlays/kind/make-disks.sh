#!/usr/bin/env bash
# Makes the disks of manifests/overlays/kind/node-config.yaml on every node
# of a kind cluster: a sparse image file per disk inside the node container,
# formatted XFS (reflink on) and loop-mounted at /mnt/disks/<disk>.
# Idempotent: a disk already mounted is left alone.
#
# Usage: make-disks.sh [kind cluster name]   (default: kind)
# Sizes: DISKS="nvme0=3G nvme1=2G hdd0=6G" make-disks.sh
set -euo pipefail

cluster=${1:-kind}
disks=${DISKS:-nvme0=3G nvme1=2G hdd0=6G}

nodes=$(kind get nodes --name "$cluster")
if [[ -z $nodes ]]; then
	echo "no nodes in kind cluster $cluster" >&2
	exit 1
fi

for node in $nodes; do
	# kindest/node images do not ship xfsprogs.
	if ! docker exec "$node" sh -c 'command -v mkfs.xfs' >/dev/null; then
		docker exec "$node" sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq xfsprogs' >/dev/null
	fi
	for spec in $disks; do
		name=${spec%%=*}
		size=${spec#*=}
		docker exec -e NAME="$name" -e SIZE="$size" "$node" sh -euc '
			img=/var/lib/diskfit-disks/$NAME.img
			mnt=/mnt/disks/$NAME
			mkdir -p /var/lib/diskfit-disks "$mnt"
			if mountpoint -q "$mnt"; then exit 0; fi
			if [ ! -e "$img" ]; then
				truncate -s "$SIZE" "$img"
				mkfs.xfs -q -m reflink=1 "$img"
			fi
			mount -o loop "$img" "$mnt"
		'
		echo "$node: $name ($size) at /mnt/disks/$name"
	done
done
