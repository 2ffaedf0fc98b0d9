#!/usr/bin/env bash
# Build the local Kubernetes control plane used by the e2e tier (no Docker, no kind):
# kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, etcd, kwok and helm,
# compiled from their Go modules through the module proxy.
#
# Everything lands OUTSIDE the repo, keyed by version, so warm runs take seconds:
#   $ENCODERPOOL_CACHE/bin/<component>-<version>/<component>   the binaries
#   $ENCODERPOOL_CACHE/bin/control-plane.env                    their paths (read by testkit/cluster)
#   $ENCODERPOOL_CACHE/go/{mod,build}                           Go module and build caches
#   $ENCODERPOOL_CACHE/src/<component>-<version>/go.mod         generated wrapper modules
#
# Versions can be overridden from the environment (K8S_VERSION, ETCD_VERSION, KWOK_VERSION,
# HELM_VERSION); see docs/testing.md for what was verified.
set -euo pipefail

CACHE="${ENCODERPOOL_CACHE:-$HOME/.cache/encoderpool}"
K8S_VERSION="${K8S_VERSION:-v1.35.4}"
# etcd 3.6 is what Kubernetes 1.35 is tested against (its go.mod pins the 3.6 client).
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
HELM_VERSION="${HELM_VERSION:-v3.22.0}"

BIN="$CACHE/bin"
SRC="$CACHE/src"
ENV_FILE="$BIN/control-plane.env"
TIMES_LOG="$BIN/build-times.log"

export GOMODCACHE="$CACHE/go/mod"
export GOCACHE="$CACHE/go/build"
export CGO_ENABLED=0
# Never download another Go toolchain behind the user's back: fail with a clear message instead.
export GOTOOLCHAIN=local
# -mod=mod lets `go build` write the wrapper's go.sum itself; no vcs stamping outside a checkout.
export GOFLAGS="-mod=mod -buildvcs=false"

mkdir -p "$BIN" "$SRC" "$GOMODCACHE" "$GOCACHE"

# Go's installer puts it in /usr/local/go; a non-login shell (CI) may not have that on PATH.
command -v go >/dev/null || { [[ -x /usr/local/go/bin/go ]] && export PATH="/usr/local/go/bin:$PATH"; }
command -v go >/dev/null || { echo "error: go is not on PATH (Go >= 1.26 is needed)" >&2; exit 1; }

# Two concurrent builds (make test in two shells) would fight over the same wrapper dirs.
exec 9>"$CACHE/.build-control-plane.lock"
flock 9

# binary_path NAME VERSION -> where that build lives.
binary_path() { echo "$BIN/$1-$2/$1"; }

# write_wrapper DIR MODULE VERSION [extra go.mod lines...]: a throwaway main module whose only job
# is to require the real module, so `go build` of its packages works despite their own replaces.
write_wrapper() {
    local dir="$1" module="$2" version="$3"
    shift 3
    mkdir -p "$dir"
    [[ -f "$dir/go.mod" ]] && return 0
    {
        echo "module encoderpool.local/build/$(basename "$dir")"
        echo
        echo "go 1.26"
        echo
        echo "require $module $version"
        printf '%s\n' "$@"
    } >"$dir/go.mod.tmp"
    mv "$dir/go.mod.tmp" "$dir/go.mod"
}

# go_module_file MODULE@VERSION -> path of its downloaded go.mod.
go_module_file() {
    (cd "$SRC" && go mod download -json "$1") |
        sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p'
}

# build NAME VERSION WRAPPER_DIR PACKAGE LDFLAGS: build one static binary unless already there.
build() {
    local name="$1" version="$2" dir="$3" pkg="$4" ldflags="$5"
    local out
    out="$(binary_path "$name" "$version")"
    if [[ -x "$out" ]]; then
        echo ">> $name $version: cached ($out)"
        return 0
    fi
    echo ">> building $name $version (cold build, several minutes on 2 cores)"
    local start=$SECONDS
    mkdir -p "$(dirname "$out")"
    (cd "$dir" && nice -n 10 go build -trimpath -ldflags "$ldflags" -o "$out.tmp" "$pkg")
    mv "$out.tmp" "$out"
    local secs=$((SECONDS - start)) size
    size=$(du -m "$out" | cut -f1)
    echo ">> built $name $version in ${secs}s (${size} MiB)"
    echo "$(date -u +%FT%TZ) $name $version ${secs}s ${size}MiB go=$(go env GOVERSION)" >>"$TIMES_LOG"
}

# --- Kubernetes ---------------------------------------------------------------------------------
# k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces them with ./staging paths,
# which do not exist in the module zip. Derive the wrapper's replace list from its go.mod: every
# "k8s.io/X => ./staging/src/k8s.io/X" becomes "k8s.io/X => k8s.io/X v0.<minor>.<patch>".
kube_wrapper() {
    local dir="$SRC/kubernetes-$K8S_VERSION"
    [[ -f "$dir/go.mod" ]] && { echo "$dir"; return 0; }
    local modfile staging_version
    modfile="$(go_module_file "k8s.io/kubernetes@$K8S_VERSION")"
    [[ -f "$modfile" ]] || { echo "error: cannot download k8s.io/kubernetes@$K8S_VERSION" >&2; exit 1; }
    staging_version="v0.${K8S_VERSION#v1.}"
    local replaces
    replaces="$(sed -n 's#^[[:space:]]*\(k8s\.io/[A-Za-z0-9._-]*\) => \./staging/src/.*$#\1#p' "$modfile" |
        while read -r m; do echo "replace $m => $m $staging_version"; done)"
    [[ -n "$replaces" ]] || { echo "error: no staging replaces found in $modfile" >&2; exit 1; }
    # shellcheck disable=SC2086  # one line per replace directive
    write_wrapper "$dir" k8s.io/kubernetes "$K8S_VERSION" "" "$replaces"
    echo "$dir"
}

kube_ldflags() {
    local v="${K8S_VERSION#v}" pkg=k8s.io/component-base/version
    local major="${v%%.*}" rest="${v#*.}"
    local minor="${rest%%.*}"
    # Unstamped builds report v0.0.0, which breaks helm kubeVersion checks and kubectl skew logic.
    echo "-s -w -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor" \
        "-X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z" \
        "-X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"
}

build_kubernetes() {
    local components=(kube-apiserver kube-controller-manager kube-scheduler kubectl) c missing=0
    for c in "${components[@]}"; do [[ -x "$(binary_path "$c" "$K8S_VERSION")" ]] || missing=1; done
    local dir=""
    [[ $missing == 1 ]] && dir="$(kube_wrapper)"
    for c in "${components[@]}"; do
        build "$c" "$K8S_VERSION" "$dir" "k8s.io/kubernetes/cmd/$c" "$(kube_ldflags)"
    done
}

# --- etcd ---------------------------------------------------------------------------------------
# server/go.mod replaces its sibling modules with ../paths; require them at the same version
# instead (derived from those replace lines) so MVS picks one consistent etcd release.
build_etcd() {
    [[ -x "$(binary_path etcd "$ETCD_VERSION")" ]] && { build etcd "$ETCD_VERSION" "" "" ""; return; }
    local dir="$SRC/etcd-$ETCD_VERSION" modfile siblings
    if [[ ! -f "$dir/go.mod" ]]; then
        modfile="$(go_module_file "go.etcd.io/etcd/server/v3@$ETCD_VERSION")"
        siblings="$(sed -n 's#^[[:space:]]*\(go\.etcd\.io/etcd/[A-Za-z0-9/._-]*\) => \.\./.*$#\1#p' "$modfile" |
            while read -r m; do echo "require $m $ETCD_VERSION"; done)"
        write_wrapper "$dir" go.etcd.io/etcd/server/v3 "$ETCD_VERSION" "$siblings"
    fi
    build etcd "$ETCD_VERSION" "$dir" go.etcd.io/etcd/server/v3 \
        "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=$ETCD_VERSION"
}

# --- kwok and helm: plain modules without replace directives ------------------------------------
build_kwok() {
    local dir="$SRC/kwok-$KWOK_VERSION"
    write_wrapper "$dir" sigs.k8s.io/kwok "$KWOK_VERSION"
    build kwok "$KWOK_VERSION" "$dir" sigs.k8s.io/kwok/cmd/kwok \
        "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}"
    # The kwok binary has no built-in stages (kwokctl embeds them); without a --config it refuses
    # to start. Ship the release's own "fast" node/pod stages next to the binary, same version.
    local stages
    stages="$(dirname "$(binary_path kwok "$KWOK_VERSION")")/stages.yaml"
    [[ -f "$stages" ]] && return 0
    local moddir
    moddir="$(cd "$SRC" && go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" |
        sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
    local f first=1
    for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
        pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
        [[ $first == 1 ]] || echo "---"
        first=0
        cat "$moddir/kustomize/stage/$f"
    done >"$stages.tmp"
    mv "$stages.tmp" "$stages"
}

build_helm() {
    local dir="$SRC/helm-$HELM_VERSION"
    write_wrapper "$dir" helm.sh/helm/v3 "$HELM_VERSION"
    build helm "$HELM_VERSION" "$dir" helm.sh/helm/v3/cmd/helm \
        "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
}

write_env_file() {
    {
        echo "# Written by hack/build-control-plane.sh; read by testkit/cluster."
        echo "K8S_VERSION=$K8S_VERSION"
        echo "ETCD_VERSION=$ETCD_VERSION"
        echo "KWOK_VERSION=$KWOK_VERSION"
        echo "HELM_VERSION=$HELM_VERSION"
        echo "ETCD=$(binary_path etcd "$ETCD_VERSION")"
        echo "KUBE_APISERVER=$(binary_path kube-apiserver "$K8S_VERSION")"
        echo "KUBE_CONTROLLER_MANAGER=$(binary_path kube-controller-manager "$K8S_VERSION")"
        echo "KUBE_SCHEDULER=$(binary_path kube-scheduler "$K8S_VERSION")"
        echo "KUBECTL=$(binary_path kubectl "$K8S_VERSION")"
        echo "KWOK=$(binary_path kwok "$KWOK_VERSION")"
        echo "KWOK_STAGES=$(dirname "$(binary_path kwok "$KWOK_VERSION")")/stages.yaml"
        echo "HELM=$(binary_path helm "$HELM_VERSION")"
    } >"$ENV_FILE.tmp"
    mv "$ENV_FILE.tmp" "$ENV_FILE"
}

main() {
    local start=$SECONDS
    echo ">> control plane: kubernetes $K8S_VERSION, etcd $ETCD_VERSION, kwok $KWOK_VERSION, helm $HELM_VERSION"
    echo ">> cache: $CACHE"
    build_etcd
    build_kubernetes
    build_kwok
    build_helm
    write_env_file
    echo ">> control plane ready in $((SECONDS - start))s; binaries listed in $ENV_FILE"
}

main "$@"
