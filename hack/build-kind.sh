#!/usr/bin/env bash
# Build what an offline kind cluster needs from Go modules (no registry, no prebuilt downloads):
# kind itself, and the binaries of its node image: containerd (+ ctr, the runc shim), crictl, the
# CNI plugins, coredns, kubelet / kubeadm / kube-proxy (Kubernetes $K8S_VERSION, the same wrapper
# module and Go build cache as hack/build-control-plane.sh), and pause (C, from the kubernetes module).
#
# Everything lands OUTSIDE the repo, keyed by version, so warm runs take a second:
#   $ENCODERPOOL_CACHE/bin/<name>-<version>/<name>     the binaries
#   $ENCODERPOOL_CACHE/bin/kind.env                     their paths (read by hack/kind-cluster.sh)
#   $ENCODERPOOL_CACHE/go/{mod,build}                   Go caches, shared with the control plane
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE="${ENCODERPOOL_CACHE:-$HOME/.cache/encoderpool}"
K8S_VERSION="${K8S_VERSION:-v1.35.4}"
KIND_VERSION="${KIND_VERSION:-v0.33.0}"
CONTAINERD_VERSION="${CONTAINERD_VERSION:-v2.4.2}"
CRICTL_VERSION="${CRICTL_VERSION:-v1.36.0}"
CNI_VERSION="${CNI_VERSION:-v1.10.0}"
COREDNS_VERSION="${COREDNS_VERSION:-v1.13.1}"

BIN="$CACHE/bin"
SRC="$CACHE/src"
ENV_FILE="$BIN/kind.env"
TIMES_LOG="$BIN/build-times.log"
export GOMODCACHE="$CACHE/go/mod" GOCACHE="$CACHE/go/build" CGO_ENABLED=0 GOTOOLCHAIN=local
export GOFLAGS="-mod=mod -buildvcs=false"
mkdir -p "$BIN" "$SRC" "$GOMODCACHE" "$GOCACHE"
command -v go >/dev/null || { [[ -x /usr/local/go/bin/go ]] && export PATH="/usr/local/go/bin:$PATH"; }
command -v go >/dev/null || { echo "error: go is not on PATH (Go >= 1.26 is needed)" >&2; exit 1; }

exec 8>"$CACHE/.build-kind.lock"
flock 8

binary_path() { echo "$BIN/$1-$2/$1"; }

# wrapper DIR MODULE VERSION: a throwaway main module requiring the real one (as build-control-plane.sh).
wrapper() {
    local dir="$SRC/$1" module="$2" version="$3"
    mkdir -p "$dir"
    [[ -f "$dir/go.mod" ]] || printf 'module encoderpool.local/build/%s\n\ngo 1.26\n\nrequire %s %s\n' \
        "$1" "$module" "$version" >"$dir/go.mod"
    echo "$dir"
}

# build NAME VERSION DIR PACKAGE [LDFLAGS]: one static binary unless it is there already.
build() {
    local name="$1" version="$2" dir="$3" pkg="$4" ldflags="${5:--s -w}" out
    out="$(binary_path "$name" "$version")"
    if [[ -x "$out" ]]; then echo ">> $name $version: cached"; return 0; fi
    echo ">> building $name $version (cold: minutes on 2 cores)"
    local start=$SECONDS size
    mkdir -p "$(dirname "$out")"
    (cd "$dir" && nice -n 10 go build -trimpath -ldflags "$ldflags" -o "$out.tmp" "$pkg")
    mv "$out.tmp" "$out"
    size=$(du -m "$out" | cut -f1)
    echo ">> built $name $version in $((SECONDS - start))s (${size} MiB)"
    echo "$(date -u +%FT%TZ) $name $version $((SECONDS - start))s ${size}MiB go=$(go env GOVERSION)" >>"$TIMES_LOG"
}

build_pause() {
    local out moddir
    out="$(binary_path pause "$K8S_VERSION")"
    [[ -x "$out" ]] && { echo ">> pause $K8S_VERSION: cached"; return 0; }
    command -v gcc >/dev/null || { echo "error: gcc is needed to build pause (apt-get install gcc libc6-dev)" >&2; exit 1; }
    moddir="$(cd "$SRC" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
    mkdir -p "$(dirname "$out")"
    # The version kubeadm expects is stamped into the binary the same way the upstream Makefile does.
    gcc -Os -Wall -Werror -static -DVERSION="$K8S_VERSION" -o "$out.tmp" "$moddir/build/pause/linux/pause.c"
    strip "$out.tmp" 2>/dev/null || true
    mv "$out.tmp" "$out"
    echo ">> built pause from $moddir/build/pause/linux/pause.c"
}

main() {
    local start=$SECONDS
    echo ">> kind $KIND_VERSION and its node image binaries (kubernetes $K8S_VERSION); cache: $CACHE"
    build kind "$KIND_VERSION" "$(wrapper "kind-$KIND_VERSION" sigs.k8s.io/kind "$KIND_VERSION")" sigs.k8s.io/kind

    local d
    d="$(wrapper "containerd-$CONTAINERD_VERSION" github.com/containerd/containerd/v2 "$CONTAINERD_VERSION")"
    local cver="-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION"
    build containerd "$CONTAINERD_VERSION" "$d" github.com/containerd/containerd/v2/cmd/containerd "$cver"
    build ctr "$CONTAINERD_VERSION" "$d" github.com/containerd/containerd/v2/cmd/ctr "$cver"
    build containerd-shim-runc-v2 "$CONTAINERD_VERSION" "$d" github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 "$cver"

    d="$(wrapper "cri-tools-$CRICTL_VERSION" sigs.k8s.io/cri-tools "$CRICTL_VERSION")"
    build crictl "$CRICTL_VERSION" "$d" sigs.k8s.io/cri-tools/cmd/crictl \
        "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$CRICTL_VERSION"

    d="$(wrapper "cni-plugins-$CNI_VERSION" github.com/containernetworking/plugins "$CNI_VERSION")"
    local p
    for p in main/bridge main/loopback main/ptp ipam/host-local meta/portmap; do
        build "$(basename "$p")" "$CNI_VERSION" "$d" "github.com/containernetworking/plugins/plugins/$p"
    done

    d="$(wrapper "coredns-$COREDNS_VERSION" github.com/coredns/coredns "$COREDNS_VERSION")"
    build coredns "$COREDNS_VERSION" "$d" github.com/coredns/coredns

    # kubelet, kubeadm and kube-proxy share most packages with the control plane: reuse its wrapper
    # and build cache (build-control-plane.sh holds its own lock while it builds).
    bash hack/build-control-plane.sh
    local kdir="$SRC/kubernetes-$K8S_VERSION" kpkg=k8s.io/component-base/version
    local v="${K8S_VERSION#v}"
    local kflags="-s -w -X $kpkg.gitVersion=$K8S_VERSION -X $kpkg.gitMajor=${v%%.*} -X $kpkg.gitMinor=$(echo "$v" | cut -d. -f2) -X $kpkg.gitTreeState=clean -X $kpkg.buildDate=1970-01-01T00:00:00Z -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"
    for p in kubelet kubeadm kube-proxy; do
        build "$p" "$K8S_VERSION" "$kdir" "k8s.io/kubernetes/cmd/$p" "$kflags"
    done
    build_pause

    {
        echo "# Written by hack/build-kind.sh; read by hack/kind-node-image.sh and hack/kind-cluster.sh."
        echo "K8S_VERSION=$K8S_VERSION"
        echo "KIND_VERSION=$KIND_VERSION"
        echo "CONTAINERD_VERSION=$CONTAINERD_VERSION"
        echo "CRICTL_VERSION=$CRICTL_VERSION"
        echo "CNI_VERSION=$CNI_VERSION"
        echo "COREDNS_VERSION=$COREDNS_VERSION"
        echo "KIND=$(binary_path kind "$KIND_VERSION")"
        for p in containerd ctr containerd-shim-runc-v2; do
            echo "$(echo "$p" | tr a-z- A-Z_)=$(binary_path "$p" "$CONTAINERD_VERSION")"
        done
        echo "CRICTL=$(binary_path crictl "$CRICTL_VERSION")"
        for p in bridge loopback ptp host-local portmap; do
            echo "CNI_$(echo "$p" | tr a-z- A-Z_)=$(binary_path "$p" "$CNI_VERSION")"
        done
        echo "COREDNS=$(binary_path coredns "$COREDNS_VERSION")"
        for p in kubelet kubeadm kube-proxy pause; do
            echo "$(echo "$p" | tr a-z- A-Z_)=$(binary_path "$p" "$K8S_VERSION")"
        done
    } >"$ENV_FILE.tmp"
    mv "$ENV_FILE.tmp" "$ENV_FILE"
    echo ">> kind binaries ready in $((SECONDS - start))s; listed in $ENV_FILE"
}

main "$@"
