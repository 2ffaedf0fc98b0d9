#!/usr/bin/env bash
# A kind node image assembled offline (prints its reference, encoderpool/kind-node:<k8s>-<hash>).
#
# `kind build node-image` cannot work without a registry: it always fetches the etcd, coredns,
# pause, kindnetd and local-path images. This script does what kind's builder and its base image
# Dockerfile do, from local parts only:
#   - rootfs: Debian bookworm (hack/debian-image.sh) with the packages of kind's images/base
#     Dockerfile (bookworm: its systemd 252 boots on cgroup v1, trixie's 257 does not), plus kind's
#     own entrypoint and config files from the kind module source (images/base/files/); none of
#     Debian's sysctl.d files (systemd-sysctl in a node would write them to the HOST kernel);
#   - containerd, crictl, the CNI plugins, kubelet, kubeadm, kubectl (hack/build-kind.sh and
#     hack/build-control-plane.sh), runc from Debian;
#   - the images kubeadm runs, each a static binary on an empty or Debian base: kube-apiserver,
#     kube-controller-manager, kube-scheduler, etcd, coredns, pause, kube-proxy (with iptables),
#     imported into the node's containerd the way kind does (`ctr -n k8s.io images import`);
#   - a bridge CNI config (kind's kindnetd image is not available; one node only) and an
#     entrypoint wrapper that makes the node boot without --privileged too (below).
# The hash covers every input, so the image is rebuilt only when one changes.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${ENCODERPOOL_CACHE:-$HOME/.cache/encoderpool}"
export ENCODERPOOL_CACHE="$CACHE"
# shellcheck disable=SC1091
. "$CACHE/bin/kind.env"
# shellcheck disable=SC1091
. "$CACHE/bin/control-plane.env"
# hack/kind-cluster.sh runs this with its docker shim first in PATH where --privileged cannot work.

say() { echo ">> kind node image: $*" >&2; }

NODE_PACKAGES=(systemd dbus conntrack iptables nftables iproute2 ethtool util-linux mount kmod libseccomp2
  pigz fuse-overlayfs socat ca-certificates procps bash ebtables runc jq)
PROXY_PACKAGES=(iptables conntrack)
# Non-namespaced sysctls must never be set from a node: drop every sysctl.d file Debian ships.
export DEBIAN_IMAGE_PRUNE="usr/lib/sysctl.d etc/sysctl.d etc/sysctl.conf"
# Both rootfs builds at once (each is mostly waiting on the mirror).
bash hack/debian-image.sh iptables "${PROXY_PACKAGES[@]}" >"$CACHE/.proxy-base.ref" &
proxy_job=$!
rootfs="$(bash hack/debian-image.sh kind-node "${NODE_PACKAGES[@]}")"
wait "$proxy_job"
proxy_base="$(cat "$CACHE/.proxy-base.ref")"
unset DEBIAN_IMAGE_PRUNE

KIND_SRC="$(cd "$CACHE/src/kind-$KIND_VERSION" && GOMODCACHE="$CACHE/go/mod" GOFLAGS=-mod=mod go mod download -json sigs.k8s.io/kind@"$KIND_VERSION" |
  sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
[ -d "$KIND_SRC/images/base/files" ] || { echo "!! kind source not found ($KIND_SRC)" >&2; exit 1; }

key="$( { sha256sum "$0" "$CACHE/bin/kind.env" "$CACHE/bin/control-plane.env";
          docker image inspect -f '{{.Id}}' "$rootfs" "$proxy_base";
          (cd "$KIND_SRC/images/base/files" && find . -type f -print0 | sort -z | xargs -0 sha256sum); } | sha256sum | cut -c1-12)"
NODE_IMAGE="encoderpool/kind-node:$K8S_VERSION-$key"
if docker image inspect "$NODE_IMAGE" >/dev/null 2>&1; then say "$NODE_IMAGE: cached"; echo "$NODE_IMAGE"; exit 0; fi

began=$SECONDS
WORK="$(mktemp -d "$CACHE/kind-node-build.XXXXXX")"
build_container=""
cleanup() {
  [ -n "$build_container" ] && docker rm -f -v "$build_container" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT

# --- the images kubeadm runs ---------------------------------------------------------------------
# component_image TAG BINARY PATH_IN_IMAGE [ENTRYPOINT] [BASE]: a static binary on an empty (or Debian) base.
component_image() {
  local tag="$1" binary="$2" dest="$3" entrypoint="${4:-}" base="${5:-scratch}" dir
  dir="$WORK/img-$(echo "$tag" | tr '/:' '__')"
  mkdir -p "$dir"
  cp "$binary" "$dir/bin"
  {
    echo "FROM $base"
    echo "COPY bin $dest"
    echo "ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin"
    if [ -n "$entrypoint" ]; then echo "ENTRYPOINT [\"$entrypoint\"]"; fi
    if [ -f "$dir/extra" ]; then cat "$dir/extra"; fi
  } >"$dir/Dockerfile"
  docker build -q -t "$tag" "$dir" >/dev/null
  echo "$tag"
}

say "building the control-plane, DNS, pause and kube-proxy images"
etcd_tag="${ETCD_VERSION#v}-0"
images=(
  "$(component_image "registry.k8s.io/kube-apiserver:$K8S_VERSION" "$KUBE_APISERVER" /usr/local/bin/kube-apiserver)"
  "$(component_image "registry.k8s.io/kube-controller-manager:$K8S_VERSION" "$KUBE_CONTROLLER_MANAGER" /usr/local/bin/kube-controller-manager)"
  "$(component_image "registry.k8s.io/kube-scheduler:$K8S_VERSION" "$KUBE_SCHEDULER" /usr/local/bin/kube-scheduler)"
  "$(component_image "registry.k8s.io/etcd:$etcd_tag" "$ETCD" /usr/local/bin/etcd)"
  "$(component_image "registry.k8s.io/coredns/coredns:$COREDNS_VERSION" "$COREDNS" /coredns /coredns)"
)
# kind's containerd config names pause:3.10 as the sandbox image; kubeadm asks for its own tag.
pause_tags=(registry.k8s.io/pause:3.10 "$("$KUBEADM" config images list --kubernetes-version "$K8S_VERSION" 2>/dev/null | grep '/pause:' || echo registry.k8s.io/pause:3.10.1)")
images+=("$(component_image "${pause_tags[0]}" "$PAUSE" /pause /pause)")
for t in "${pause_tags[@]:1}"; do docker tag "${pause_tags[0]}" "$t"; images+=("$t"); done
# kube-proxy programs iptables in the node's mode (nft or legacy, chosen by kind's entrypoint):
# the same detection as kind's select_iptables, then the real binary.
proxy_dir="$WORK/img-registry.k8s.io_kube-proxy_$K8S_VERSION"
mkdir -p "$proxy_dir"
cat >"$proxy_dir/kube-proxy-wrapper" <<'EOF'
#!/bin/sh
legacy=$( (iptables-legacy-save; ip6tables-legacy-save) 2>/dev/null | grep -c '^-')
nft=$( (iptables-nft-save; ip6tables-nft-save) 2>/dev/null | grep -c '^-')
if [ "${legacy:-0}" -gt "${nft:-0}" ]; then mode=legacy; else mode=nft; fi
update-alternatives --set iptables "/usr/sbin/iptables-$mode" >/dev/null
update-alternatives --set ip6tables "/usr/sbin/ip6tables-$mode" >/dev/null
exec /usr/local/bin/kube-proxy.bin "$@"
EOF
printf 'COPY kube-proxy-wrapper /usr/local/bin/kube-proxy\nRUN chmod 0755 /usr/local/bin/kube-proxy\n' >"$proxy_dir/extra"
images+=("$(component_image "registry.k8s.io/kube-proxy:$K8S_VERSION" "$KUBE_PROXY" /usr/local/bin/kube-proxy.bin "" "$proxy_base")")
docker save "${images[@]}" -o "$WORK/images.tar"

# --- the node ------------------------------------------------------------------------------------
say "assembling the node from $rootfs"
files="$WORK/files"
mkdir -p "$files/usr/local/bin" "$files/usr/bin" "$files/opt/cni/bin" "$files/etc/cni/net.d" "$files/kind"
cp -r "$KIND_SRC/images/base/files/." "$files/"
chmod -R u+w "$files"
cp "$CONTAINERD" "$CTR" "$CONTAINERD_SHIM_RUNC_V2" "$CRICTL" "$files/usr/local/bin/"
cp "$KUBELET" "$KUBEADM" "$KUBECTL" "$files/usr/bin/"
cp "$CNI_BRIDGE" "$CNI_LOOPBACK" "$CNI_PTP" "$CNI_HOST_LOCAL" "$CNI_PORTMAP" "$files/opt/cni/bin/"
rm -f "$files/etc/systemd/system/containerd-fuse-overlayfs.service"   # rootless only; not built here
echo -n "$K8S_VERSION" >"$files/kind/version"
# One node: a plain bridge with host-local addresses from the node's pod CIDR, what kindnetd would do.
cat >"$files/etc/cni/net.d/10-bridge.conflist" <<'EOF'
{
  "cniVersion": "1.0.0",
  "name": "kind-bridge",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
# Without --privileged (hack/kind-cluster.sh decides) Docker mounts the cgroup hierarchies read-only
# and creates no /dev/kmsg, /dev/fuse or /dev/loop-control; kind's entrypoint needs them. With
# --privileged every step below finds things as it wants them and changes nothing.
cat >"$files/usr/local/bin/entrypoint-offline" <<'EOF'
#!/bin/bash
set -e
for m in $(awk '$3 == "cgroup" || $3 == "cgroup2" {print $2}' /proc/self/mounts); do
  mount -o remount,bind,rw "$m" 2>/dev/null || true
done
[ -e /dev/kmsg ] || mknod -m 600 /dev/kmsg c 1 11
[ -e /dev/fuse ] || mknod -m 666 /dev/fuse c 10 229
[ -e /dev/loop-control ] || mknod -m 660 /dev/loop-control c 10 237
exec /usr/local/bin/entrypoint "$@"
EOF
chmod 0755 "$files/usr/local/bin/"* "$files/usr/bin/"* "$files/opt/cni/bin/"* "$files/kind/bin/"*

build_container="$(docker run -d --privileged --entrypoint sleep "$rootfs" infinity)"
docker cp "$files/." "$build_container:/"
docker cp "$WORK/images.tar" "$build_container:/kind/images.tar"
docker exec -i "$build_container" bash -euo pipefail >&2 <<'EOF'
chown -R root:root /usr/local/bin /usr/bin/kubelet /usr/bin/kubeadm /usr/bin/kubectl /opt/cni /etc/cni /kind
chmod 755 /kind /kind/bin
# What kind's images/base Dockerfile does after installing its packages.
find /lib/systemd/system/sysinit.target.wants/ -name "systemd-tmpfiles-setup.service" -delete
rm -f /lib/systemd/system/multi-user.target.wants/* /etc/systemd/system/*.wants/* \
  /lib/systemd/system/local-fs.target.wants/* /lib/systemd/system/sockets.target.wants/*udev* \
  /lib/systemd/system/sockets.target.wants/*initctl* /lib/systemd/system/basic.target.wants/*
echo "ReadKMsg=no" >> /etc/systemd/journald.conf
ln -sf /usr/lib/systemd/systemd /sbin/init
systemctl enable kubelet.service containerd.service undo-mount-hacks.service
systemctl mask systemd-binfmt.service
mkdir -p /etc/kubernetes/manifests
ctr oci spec | jq '.hooks.createContainer[.hooks.createContainer| length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' \
  | jq 'del(.process.rlimits)' > /etc/containerd/cri-base.json
# Import the images the way kind's builder does (content only; unpacked at first use).
containerd >/tmp/containerd.log 2>&1 &
pid=$!
for _ in $(seq 1 100); do ctr version >/dev/null 2>&1 && break; sleep 0.2; done
ctr -n k8s.io images import --all-platforms --no-unpack --digests /kind/images.tar >/dev/null
ctr -n k8s.io images ls -q
kill "$pid"; wait "$pid" || true
rm -f /kind/images.tar /tmp/containerd.log
rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/log/*
EOF
committed="$(docker commit --change 'ENV container=docker' --change 'ENTRYPOINT ["/usr/local/bin/entrypoint-offline", "/sbin/init"]' \
  --change 'CMD []' "$build_container")"
# docker commit cannot set STOPSIGNAL: systemd as PID 1 stops on SIGRTMIN+3, as kind's image declares.
printf 'FROM %s\nSTOPSIGNAL SIGRTMIN+3\n' "$committed" | docker build -q -t "$NODE_IMAGE" - >/dev/null
docker rmi "$committed" >/dev/null 2>&1 || true
# Node images of earlier inputs are dead weight in the data root (about 1 GB each).
for old in $(docker images --format '{{.Repository}}:{{.Tag}}' encoderpool/kind-node | grep -vx "$NODE_IMAGE"); do
  docker rmi "$old" >/dev/null 2>&1 || true
done
say "$NODE_IMAGE built in $((SECONDS - began))s ($(docker image inspect -f '{{.Size}}' "$NODE_IMAGE" | awk '{printf "%.2f GB", $1/1e9}'))"
echo "$NODE_IMAGE"
