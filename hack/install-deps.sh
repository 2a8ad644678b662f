#!/usr/bin/env bash
# Installs the system packages that diskfit's tests and demo use, when they
# are missing: filesystem tools for the volumes, losetup for loop devices,
# LVM tools for the lvm backend's command layer, btrfs-progs for a disk
# whose state directory is a subvolume of its own. Needs root (apt-get).
#
#   hack/install-deps.sh [package...]   also the packages named, when missing
#                                       (debootstrap for OFFLINE=1 images)
set -euo pipefail

declare -A need=(
  [mkfs.xfs]=xfsprogs
  [xfs_growfs]=xfsprogs
  [mkfs.ext4]=e2fsprogs
  [resize2fs]=e2fsprogs
  [losetup]=mount
  [findmnt]=util-linux
  [blockdev]=util-linux
  [fallocate]=util-linux
  [lvm]=lvm2
  [mkfs.btrfs]=btrfs-progs
  [mount]=mount
)
missing=()
for pkg in "$@"; do
  dpkg-query -W -f '${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed' || missing+=("$pkg")
done
for cmd in "${!need[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || PATH=$PATH:/usr/sbin:/sbin command -v "$cmd" >/dev/null 2>&1 || missing+=("${need[$cmd]}")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
pkgs=$(printf '%s\n' "${missing[@]}" | sort -u | tr '\n' ' ')
if [ "$(id -u)" -ne 0 ]; then
  echo "diskfit needs these packages: $pkgs(run as root, or install them)" >&2
  exit 1
fi
echo "installing $pkgs"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends $pkgs >/dev/null
