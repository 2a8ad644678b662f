#!/usr/bin/env bash
# Builds a kind node image without any container registry:
#
#   diskfit.local/kind-node:v1.37.2-<hash>
#
# kind's own node images are built on kind's base image and pull the control
# plane's images; here everything comes from Debian's packages (debootstrap)
# and the Go module proxy:
#
#   rootfs      Debian bookworm with systemd and the node's tools
#               (hack/build-base-images.sh's cached debootstrap)
#   binaries    kubelet, kubeadm, kubectl and the control plane from
#               k8s.io/kubernetes (module hack/kind), containerd, runc, the CNI
#               plugins, crictl and CoreDNS from their modules, pause from
#               Kubernetes' pause.c with gcc -static: _output/kind/bin/<hash>/
#   images      the control plane's images under the names kubeadm asks for
#               (registry.k8s.io/...), imported into the node's containerd
#   kind files  kind's base image files (entrypoint, systemd units,
#               containerd's config), taken from the kind module
#
# The hash covers the pins below, hack/kind/go.sum and this script, so a
# second run finds the image and does nothing. Prints the image's name on
# stdout, logs on stderr. Needs root, docker, debootstrap, go, gcc.
# Builds run under `nice -n 19`.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# Defines log, need, hash, have, scratch, import_dir, rootfs_cached and sets
# root and cache (its functions only: it runs nothing when sourced).
# shellcheck source=hack/build-base-images.sh
source "$here/../build-base-images.sh"
log_prefix=build-node-image

# Pins. Kubernetes and etcd are hack/kind/go.mod's; the rest are modules
# installed at these versions.
kube_version=$(sed -n 's|^\tk8s.io/kubernetes \(v[^ ]*\)$|\1|p' "$here/go.mod")
kind_module=sigs.k8s.io/kind@v0.33.0
containerd_module=github.com/containerd/containerd/v2@v2.4.2
runc_module=github.com/opencontainers/runc@v1.5.3
cni_module=github.com/containernetworking/plugins@v1.10.0
crictl_module=sigs.k8s.io/cri-tools@v1.37.0
coredns_module=github.com/coredns/coredns@v1.14.6
# The node's Debian packages: kind's base image's (systemd, iptables,
# conntrack, mount, jq for its OCI hook, ...) plus the disk tools.
node_packages=ca-certificates,tzdata,netbase,systemd,dbus,iptables,nftables,iproute2,mount,util-linux,conntrack,ethtool,socat,kmod,xfsprogs,e2fsprogs,libseccomp2,jq,procps,pigz,bash

# module_dir prints the directory of module@version $1 in the module cache.
module_dir() {
	GOFLAGS=-modcacherw go mod download -json "$1" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p'
}

# go_nice runs go at the lowest priority: these builds share the machine.
go_nice() { nice -n 19 go "$@"; }

# kube_ldflags: the version stamps `make` gives Kubernetes' binaries;
# kubeadm checks the kubelet's and picks the control plane's version by its own.
kube_ldflags() {
	local pkg minor=${kube_version#v1.} flags="-s -w"
	minor=${minor%%.*}
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		flags+=" -X $pkg.gitVersion=$kube_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
		flags+=" -X $pkg.gitTreeState=clean -X $pkg.gitCommit=0000000000000000000000000000000000000000"
		flags+=" -X $pkg.buildDate=1970-01-01T00:00:00Z"
	done
	echo "$flags"
}

# kube_binaries builds Kubernetes' programs and etcd into $1 from the
# module hack/kind (upstream's dependency versions, not diskfit's).
kube_binaries() {
	local bin=$1 cmd pkgs=()
	for cmd in kubelet kubeadm kubectl kube-apiserver kube-controller-manager kube-scheduler kube-proxy; do
		[[ -x $bin/$cmd ]] || pkgs+=("k8s.io/kubernetes/cmd/$cmd")
	done
	if ((${#pkgs[@]})); then
		log "building ${pkgs[*]##*/}"
		(cd "$here" && CGO_ENABLED=0 go_nice build -ldflags "$(kube_ldflags)" -o "$bin/" "${pkgs[@]}")
	fi
	# etcd's server module is its main package.
	[[ -x $bin/etcd ]] || (cd "$here" && log "building etcd" &&
		CGO_ENABLED=0 go_nice build -ldflags "-s -w" -o "$bin/etcd" go.etcd.io/etcd/server/v3)
}

# install_module installs the packages $2... (paths inside module@version
# $1, "." for its root) into $bin with `go install`, so that each module
# builds with its own go.mod. $cgo, $tags and $ldflags change the build.
install_module() {
	local module=$1 pkg path
	shift
	for pkg in "$@"; do
		path=${module%@*}/$pkg
		path=${path%/.}
		[[ -x $bin/${path##*/} ]] && continue
		log "building ${path##*/} from $module"
		GOBIN=$bin CGO_ENABLED=${cgo:-0} go_nice install -ldflags "${ldflags:--s -w}" -tags "${tags:-}" \
			"$path@${module#*@}"
	done
}

# runtime_binaries builds containerd, runc, the CNI plugins, crictl and
# CoreDNS into $1.
runtime_binaries() {
	local bin=$1
	tags="no_btrfs no_devmapper no_zfs" install_module "$containerd_module" cmd/containerd cmd/containerd-shim-runc-v2 cmd/ctr
	# runc needs cgo, linked statically, and seccomp: the kubelet gives
	# every pod the runtime's default profile, which a runc without it
	# refuses ("seccomp: config provided but seccomp not supported"), so
	# no pod starts. A runc built without it (an older recipe) is built
	# again.
	"$root/hack/install-deps.sh" libseccomp-dev >&2
	if [[ -x $bin/runc ]] && ! "$bin/runc" --version | grep -q '^libseccomp:'; then
		rm -f "$bin/runc"
	fi
	cgo=1 tags="seccomp netgo osusergo" ldflags="-s -w -extldflags -static" install_module "$runc_module" .
	install_module "$cni_module" plugins/main/bridge plugins/main/ptp plugins/main/loopback \
		plugins/ipam/host-local plugins/meta/portmap
	install_module "$crictl_module" cmd/crictl
	install_module "$coredns_module" .
}

# pause_binary builds Kubernetes' pause container program, a static C
# binary, into $1.
pause_binary() {
	local bin=$1 src
	[[ -x $bin/pause ]] && return
	src=$(module_dir "k8s.io/kubernetes@$kube_version")/build/pause/linux/pause.c
	log "building pause"
	nice -n 19 gcc -Os -static -DVERSION="v$(pause_version)-diskfit" -o "$bin/pause" "$src"
	strip "$bin/pause"
}

# pause_version prints the pause image's tag that kubeadm asks for.
pause_version() {
	local dir
	dir=$(module_dir "k8s.io/kubernetes@$kube_version")
	sed -n 's/^\tPauseVersion = "\(.*\)"$/\1/p' "$dir/cmd/kubeadm/app/constants/constants.go"
}

# binaries sets REPLY to the directory holding every binary, building the
# missing ones (a build stopped half-way goes on where it stopped). The
# directory is named by the pins and Go's version only: after changing how a
# binary is built, remove it from there.
binaries() {
	local bin
	bin=$root/_output/kind/bin/$(hash "$kube_version" "$containerd_module" "$runc_module" "$cni_module" \
		"$crictl_module" "$coredns_module" "$(go env GOVERSION)" "$(cat "$here/go.sum")")
	mkdir -p "$bin"
	kube_binaries "$bin"
	runtime_binaries "$bin"
	pause_binary "$bin"
	REPLY=$bin
}

# control_plane_images makes the images kubeadm lists for $kube_version
# (registry.k8s.io/kube-apiserver:v1.37.2, etcd, coredns, pause, ...) from
# the binaries in $1 and saves them to the tar $2 (cached by main). kube-proxy runs on the
# node's root file system $3 (it needs iptables and nft); the others on none.
control_plane_images() {
	local bin=$1 out=$2 rootfs=$3 image name dir refs=()
	while read -r image; do
		refs+=("$image")
		name=${image##*/}
		name=${name%%:*}
		scratch image
		dir=$REPLY
		mkdir -p "$dir/usr/local/bin"
		case $name in
		kube-proxy)
			tar -C "$dir" -xf "$rootfs"
			cp "$bin/kube-proxy" "$dir/usr/local/bin/"
			import_dir "$image" "$dir" 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
			;;
		pause | coredns)
			cp "$bin/$name" "$dir/"
			import_dir "$image" "$dir" "ENTRYPOINT [\"/$name\"]"
			;;
		*)
			cp "$bin/$name" "$dir/usr/local/bin/"
			mkdir -p "$dir/tmp" "$dir/var/run"
			import_dir "$image" "$dir" 'ENV PATH=/usr/local/bin' "ENTRYPOINT [\"/usr/local/bin/$name\"]"
			;;
		esac
	done < <("$bin/kubeadm" config images list --kubernetes-version "$kube_version")
	docker save -o "$out.tmp" "${refs[@]}"
	mv "$out.tmp" "$out"
	# The tar is the cache: no stale registry.k8s.io tags stay in the engine.
	docker rmi "${refs[@]}" >/dev/null
}

# kind_files copies kind's base image files (Apache-2.0, images/base/files
# of the kind module: the entrypoint, containerd's and the kubelet's units
# and configuration, /kind/bin) into the root file system $1, with the
# modes kind's Dockerfile gives them.
kind_files() {
	local dir=$1 files
	scratch kind-files
	files=$REPLY
	cp -r "$(module_dir "$kind_module")/images/base/files/." "$files/"
	find "$files" -type d -exec chmod 0755 {} +
	find "$files" -type f -exec chmod 0644 {} +
	chmod 0755 "$files"/kind/bin/* "$files"/usr/local/bin/*
	# The sandbox image kubeadm asks for, which this image holds; and
	# containers keep at least containerd's OOM score: lowering it needs
	# CAP_SYS_RESOURCE, which a host with a short bounding set does not give
	# the node (runc: "failed to update /proc/self/oom_score_adj: Permission
	# denied"). kind's entrypoint sets the same for user namespaces.
	sed -i -e "s|sandbox_image = .*|sandbox_image = \"registry.k8s.io/pause:$(pause_version)\"|" \
		-e 's|restrict_oom_score_adj = false|restrict_oom_score_adj = true|' "$files/etc/containerd/config.toml"
	cp -r "$files/." "$dir/"
}

# node_files puts the binaries of $2 where kind's node image has them.
node_files() {
	local dir=$1 bin=$2 plugin
	install -m 0755 "$bin"/{kubelet,kubeadm,kubectl} "$dir/usr/bin/"
	install -m 0755 "$bin"/{containerd,containerd-shim-runc-v2,ctr,crictl} "$dir/usr/local/bin/"
	install -D -m 0755 "$bin/runc" "$dir/usr/local/sbin/runc"
	mkdir -p "$dir/opt/cni/bin" "$dir/etc/kubernetes/manifests" "$dir/kind/manifests"
	for plugin in bridge ptp loopback host-local portmap; do
		install -m 0755 "$bin/$plugin" "$dir/opt/cni/bin/"
	done
	echo -n "$kube_version" >"$dir/kind/version"
	sed "s/@KUBE_VERSION@/$kube_version/" "$here/default-cni.yaml" >"$dir/kind/manifests/default-cni.yaml"
	cp "$here/default-storage.yaml" "$dir/kind/manifests/default-storage.yaml"
}

# systemd_setup trims the units as kind's base image does (node_image
# enables kind's).
systemd_setup() {
	local dir=$1
	find "$dir/lib/systemd/system/sysinit.target.wants/" -name systemd-tmpfiles-setup.service -delete
	rm -f "$dir"/lib/systemd/system/multi-user.target.wants/* "$dir"/etc/systemd/system/*.wants/* \
		"$dir"/lib/systemd/system/local-fs.target.wants/* "$dir"/lib/systemd/system/sockets.target.wants/*udev* \
		"$dir"/lib/systemd/system/sockets.target.wants/*initctl* "$dir"/lib/systemd/system/basic.target.wants/*
	echo ReadKMsg=no >>"$dir/etc/systemd/journald.conf"
	ln -sf /usr/lib/systemd/systemd "$dir/sbin/init"
}

# node_base makes image $1: the node's root file system $2 with kind's
# files and the binaries of $3, before the images are imported.
node_base() {
	local image=$1 rootfs=$2 bin=$3 dir
	scratch node
	dir=$REPLY
	tar -C "$dir" -xf "$rootfs"
	kind_files "$dir"
	node_files "$dir" "$bin"
	systemd_setup "$dir"
	# kind's image also stops with SIGRTMIN+3 (systemd's halt), which
	# `docker import` cannot set; kind removes its nodes with `docker rm -f`.
	import_dir "$image" "$dir" 'ENV container=docker' 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]'
}

# node_image makes image $1 from base image $2 as `kind build node-image`
# does: containerd runs in a container of the base, imports the images of
# tar $3 pinned and unpacked later, writes its OCI base spec, and the
# container is committed.
node_image() {
	local image=$1 base=$2 images_tar=$3 id
	id=$(docker run -d --entrypoint=sleep --security-opt seccomp=unconfined "$base" infinity)
	containers+=("$id")
	docker cp "$images_tar" "$id:/images.tar"
	docker exec "$id" bash -euc '
		systemctl enable kubelet.service containerd.service undo-mount-hacks.service
		systemctl mask systemd-binfmt.service
		ctr oci spec | jq ".hooks.createContainer[.hooks.createContainer | length] |= . + {\"path\": \"/kind/bin/mount-product-files.sh\"}" |
			jq "del(.process.rlimits)" >/etc/containerd/cri-base.json
		nohup containerd >/dev/null 2>&1 &
		for i in $(seq 30); do [ -S /run/containerd/containerd.sock ] && break; sleep 1; done
		ctr info >/dev/null
		ctr -n k8s.io images import --label=io.cri-containerd.pinned=pinned --all-platforms --no-unpack --digests /images.tar >&2
		ctr -n k8s.io images ls -q >&2
		pkill containerd
		while pgrep -x containerd >/dev/null; do sleep 0.2; done
		rm /images.tar'
	docker commit -c 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]' -c 'CMD []' "$id" "$image" >/dev/null
	docker rm -f -v "$id" >/dev/null
	log "built $image ($(docker image inspect -f '{{.Size}}' "$image" | numfmt --to=iec))"
}

# Build containers, removed at exit with the scratch directories.
containers=()
cleanup() {
	((${#containers[@]} == 0)) || docker rm -f -v "${containers[@]}" >/dev/null 2>&1 || true
	rm -rf "${scratch_dirs[@]}"
}

main() {
	need docker go gcc tar sha256sum
	trap cleanup EXIT
	local key image base rootfs bin images_tar
	key=$(hash "$kube_version" "$containerd_module" "$runc_module" "$cni_module" "$crictl_module" \
		"$coredns_module" "$kind_module" "$node_packages" "$(cat "$here/go.sum")" \
		"$(cat "${BASH_SOURCE[0]}" "$here/default-cni.yaml" "$here/default-storage.yaml")" "$(declare -f rootfs_tar import_dir)")
	image=diskfit.local/kind-node:$kube_version-$key
	if have "$image"; then
		echo "$image"
		return
	fi
	rootfs_cached "$node_packages"
	rootfs=$REPLY
	binaries
	bin=$REPLY
	images_tar=$root/_output/kind/images-$(hash "$bin" "$rootfs" "$(declare -f control_plane_images import_dir)").tar
	[[ -f $images_tar ]] || control_plane_images "$bin" "$images_tar" "$rootfs"
	base=diskfit.local/kind-node-base:$kube_version-$key
	have "$base" || node_base "$base" "$rootfs" "$bin"
	node_image "$image" "$base" "$images_tar"
	docker rmi "$base" >/dev/null
	echo "$image"
}

[[ ${BASH_SOURCE[0]} != "$0" ]] || main "$@"
