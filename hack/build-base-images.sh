#!/usr/bin/env bash
# Builds, without any container registry, the base images that hack/Dockerfile
# otherwise pulls, and prints them as the Dockerfile's build arguments:
#
#   GOLANG_IMAGE=diskfit.local/golang:1.26.8-bookworm-<hash>   for golang:1.26-bookworm
#   DEBIAN_IMAGE=diskfit.local/debian:bookworm-<hash>          for debian:bookworm-slim
#   STATIC_IMAGE=diskfit.local/static:nonroot-<hash>           for gcr.io/distroless/static-debian12:nonroot
#
# The Debian root file system comes from debootstrap (Debian's packages),
# the Go toolchain from the Go module proxy (golang.org/toolchain), and
# `docker import` makes each an image. A tag ends in a hash of what the image
# is made from (this script's recipe for it, the suite, the Go version, the
# machine's own CAs for the build image), so
# a second run finds every image and does nothing; the root file system is
# cached in _output/base-images/ and survives an engine that lost its images.
# Logs go to stderr, the NAME=image lines to stdout. Needs root, docker,
# debootstrap (installed by hack/install-deps.sh when missing) and go.
#
#   GO_VERSION=1.26.8 hack/build-base-images.sh   (default: the host's go)
#
# Sourced (hack/kind/build-node-image.sh), it only defines its functions:
# rootfs_cached gives the same cached debootstrap with more packages.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=$root/_output/base-images
suite=bookworm
mirror=http://deb.debian.org/debian
# ca-certificates and tzdata for the static image and for `go mod download`;
# netbase for /etc/services and /etc/protocols, as distroless has them.
include=ca-certificates,tzdata,netbase
repo=diskfit.local

log() { echo "${log_prefix:-build-base-images}: $*" >&2; }

# need fails unless the tools named are on PATH.
need() {
	local tool
	for tool in "$@"; do
		command -v "$tool" >/dev/null || { log "$tool not found"; exit 1; }
	done
}

# hash prints the first 12 hex digits of the SHA-256 of its arguments.
hash() { printf '%s\n' "$@" | sha256sum | cut -c1-12; }

have() { docker image inspect "$1" >/dev/null 2>&1; }

# scratch sets REPLY to a new directory under $cache, removed at exit.
scratch_dirs=()
trap 'rm -rf "${scratch_dirs[@]}"' EXIT
scratch() {
	REPLY=$(mktemp -d "$cache/$1.XXXXXX")
	scratch_dirs+=("$REPLY")
}

# rootfs_tar makes $1, a tar of a minimal Debian $suite: debootstrap's
# minbase plus the packages in $2 (comma-separated), without documentation,
# man pages, locales and apt's lists (as debian:*-slim), with dpkg told to
# leave them out of later installs too.
rootfs_tar() {
	local out=$1 packages=$2 dir
	[[ $(id -u) -eq 0 ]] || { log "debootstrap needs root"; exit 1; }
	command -v debootstrap >/dev/null || "$root/hack/install-deps.sh" debootstrap >&2
	need debootstrap
	scratch rootfs
	dir=$REPLY
	log "debootstrap $suite into $dir"
	debootstrap --variant=minbase --include="$packages" "$suite" "$dir" "$mirror" >&2
	cat >"$dir/etc/dpkg/dpkg.cfg.d/slim" <<-'EOF'
		path-exclude /usr/share/doc/*
		path-include /usr/share/doc/*/copyright
		path-exclude /usr/share/man/*
		path-exclude /usr/share/info/*
		path-exclude /usr/share/locale/*
		path-include /usr/share/locale/locale.alias
		path-exclude /usr/share/lintian/*
	EOF
	find "$dir/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
	find "$dir/usr/share/doc" -mindepth 1 -type d -empty -delete
	rm -rf "$dir"/usr/share/{man,info,lintian}/* "$dir"/var/cache/apt/*.bin "$dir"/var/cache/apt/archives/*.deb \
		"$dir"/var/lib/apt/lists/* "$dir"/var/log/* "$dir"/dev/* "$dir"/etc/hostname "$dir"/etc/resolv.conf
	find "$dir/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} +
	rm -f "$dir/etc/apt/sources.list"
	cat >"$dir/etc/apt/sources.list.d/debian.sources" <<-EOF
		Types: deb
		URIs: $mirror
		Suites: $suite $suite-updates
		Components: main
		Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

		Types: deb
		URIs: ${mirror%/debian}/debian-security
		Suites: $suite-security
		Components: main
		Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
	EOF
	tar --numeric-owner -C "$dir" -cf "$out.tmp" .
	mv "$out.tmp" "$out"
}

# import_dir makes image $1 from directory $2, with Dockerfile-style
# changes (docker import -c) in the remaining arguments.
import_dir() {
	local image=$1 dir=$2 change args=()
	shift 2
	for change in "$@"; do args+=(-c "$change"); done
	tar --numeric-owner -C "$dir" -c . | docker import "${args[@]}" - "$image" >/dev/null
	log "built $image ($(docker image inspect -f '{{.Size}}' "$image" | numfmt --to=iec))"
}

debian_image() {
	local image=$1 tar=$2 dir
	scratch debian
	dir=$REPLY
	tar -C "$dir" -xf "$tar"
	import_dir "$image" "$dir" 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' 'CMD ["bash"]'
}

# The machine's own CAs (Debian keeps them in /usr/local/share/ca-certificates),
# such as a TLS-inspecting proxy's: the build image trusts them as the host
# does, or `go mod download` in hack/Dockerfile fails where the host's go works.
local_cas() { cat /usr/local/share/ca-certificates/*.crt 2>/dev/null || true; }

# golang_image: Debian plus the Go toolchain in /usr/local/go, with the
# environment of the golang image, trusting the machine's own CAs.
golang_image() {
	local image=$1 tar=$2 dir gotree
	gotree=$(GOFLAGS=-modcacherw go mod download -json "golang.org/toolchain@v0.0.1-go$GO_VERSION.linux-amd64" |
		sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
	[[ -f $gotree/bin/go ]] || { log "no Go $GO_VERSION toolchain from the module proxy"; exit 1; }
	scratch golang
	dir=$REPLY
	tar -C "$dir" -xf "$tar"
	mkdir -p "$dir/usr/local/go" "$dir/go/bin" "$dir/go/src"
	cp -a "$gotree/." "$dir/usr/local/go/"
	# Module zips keep no file modes: the go command marks a toolchain's
	# programs executable itself when it runs one, and so does this.
	chmod -R u+w "$dir/usr/local/go"
	chmod a+x "$dir"/usr/local/go/bin/* "$dir"/usr/local/go/pkg/tool/*/*
	chmod 1777 "$dir/go"
	cp /usr/local/share/ca-certificates/*.crt "$dir/usr/local/share/ca-certificates/" 2>/dev/null || true
	local_cas >>"$dir/etc/ssl/certs/ca-certificates.crt"
	import_dir "$image" "$dir" \
		'ENV PATH=/go/bin:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
		'ENV GOPATH=/go' 'ENV GOTOOLCHAIN=local' "ENV GOLANG_VERSION=$GO_VERSION" 'WORKDIR /go' 'CMD ["bash"]'
}

# static_image: what distroless/static's nonroot image holds (users root,
# nobody and nonroot 65532, CA certificates, time zones, /etc/services),
# taken from the Debian root file system, on no base.
static_image() {
	local image=$1 tar=$2 dir
	scratch static
	dir=$REPLY
	tar -C "$dir" -xf "$tar" ./etc/ssl/certs/ca-certificates.crt ./usr/share/zoneinfo ./etc/services ./etc/protocols
	cat >"$dir/etc/passwd" <<-'EOF'
		root:x:0:0:root:/root:/sbin/nologin
		nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
		nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
	EOF
	cat >"$dir/etc/group" <<-'EOF'
		root:x:0:
		nobody:x:65534:
		tty:x:5:
		staff:x:50:
		nonroot:x:65532:
	EOF
	echo 'hosts: files dns' >"$dir/etc/nsswitch.conf"
	mkdir -p "$dir/tmp" "$dir/root" "$dir/home/nonroot"
	chmod 1777 "$dir/tmp"
	chmod 700 "$dir/root" "$dir/home/nonroot"
	chown 65532:65532 "$dir/home/nonroot"
	import_dir "$image" "$dir" 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
		'ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt' 'USER 65532:65532' 'WORKDIR /home/nonroot'
}

# rootfs_key prints the hash of rootfs_tar's recipe with the packages in $1.
rootfs_key() { hash "$suite" "$mirror" "$1" "$(declare -f rootfs_tar)"; }

# rootfs_cached sets REPLY to the cached tar of rootfs_tar with the packages
# in $1 (comma-separated), making it when missing.
rootfs_cached() {
	local tar
	tar=$cache/rootfs-$suite-$(rootfs_key "$1").tar
	mkdir -p "$cache"
	[[ -f $tar ]] || rootfs_tar "$tar" "$1"
	REPLY=$tar
}

main() {
	need docker go tar sha256sum
	GO_VERSION=${GO_VERSION:-$(go env GOVERSION | sed 's/^go//')}
	local key arg image
	key=$(rootfs_key "$include")
	local -A images=(
		[DEBIAN_IMAGE]=$repo/debian:$suite-$(hash "$key" "$(declare -f debian_image import_dir)")
		[GOLANG_IMAGE]=$repo/golang:$GO_VERSION-$suite-$(hash "$key" "$GO_VERSION" "$(local_cas)" "$(declare -f golang_image import_dir)")
		[STATIC_IMAGE]=$repo/static:nonroot-$(hash "$key" "$(declare -f static_image import_dir)")
	)
	local -A recipe=([DEBIAN_IMAGE]=debian_image [GOLANG_IMAGE]=golang_image [STATIC_IMAGE]=static_image)
	for arg in DEBIAN_IMAGE GOLANG_IMAGE STATIC_IMAGE; do
		image=${images[$arg]}
		if ! have "$image"; then
			rootfs_cached "$include"
			"${recipe[$arg]}" "$image" "$REPLY"
		fi
		echo "$arg=$image"
	done
}

[[ ${BASH_SOURCE[0]} != "$0" ]] || main "$@"
