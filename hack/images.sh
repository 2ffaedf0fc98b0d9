#!/usr/bin/env bash
# make images: the operator image and the encoder image(s) from docker/, with no registry.
#
#   hack/images.sh                     operator + encoder cpu (ENCODER_VARIANTS="cpu cuda" for both)
#
# - Docker engine: hack/docker-engine.sh up (started, and installed from Debian's packages, when
#   none answers; stopped again at the end if this script started it).
# - Base: $PYTHON_IMAGE (default python:3.11-slim-bookworm) if it is there or can be pulled, else a
#   base made from Debian's packages (hack/debian-image.sh: bookworm's python3.11 + venv).
# - Wheels: the pinned dependency set (pyproject.toml resolved by uv for Linux x86_64 / CPython
#   3.11 under constraints.txt, the lock's pins) downloaded ONCE on the host into $ENCODERPOOL_CACHE/wheelhouse/ (the host trusts the
#   network's certificates; the build does not need to), then installed in the build with
#   --no-index. Nothing of the wheelhouse or the host's certificates ends up in an image: the wheels
#   are in a build stage whose venv alone is copied on.
# - Cache: an image is rebuilt only when its inputs change (a hash of the Dockerfile, the sources,
#   the base image and the wheel set is its label encoderpool.inputs); Docker's data root is
#   $ENCODERPOOL_CACHE/docker/data (hack/docker-engine.sh).
#
# Tags are the chart's defaults: image.repository:appVersion and encoderImage.cpu / .cuda.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"

CACHE="${ENCODERPOOL_CACHE:-$HOME/.cache/encoderpool}"
export ENCODERPOOL_CACHE="$CACHE"
VARIANTS="${ENCODER_VARIANTS-cpu}"  # set and empty: the operator image alone
PYTHON_IMAGE="${PYTHON_IMAGE:-python:3.11-slim-bookworm}"
UV="${UV:-$CACHE/tools/bin/uv}"
PIP="${PIP:-$CACHE/tools/bin/pip}"
export UV_CACHE_DIR="${UV_CACHE_DIR:-$CACHE/uv}"
WHEELHOUSE="$CACHE/wheelhouse"
WORK="$CACHE/images"
mkdir -p "$WHEELHOUSE" "$WORK"

say() { echo ">> images: $*" >&2; }
die() { echo "!! images: $*" >&2; exit 1; }
[ -x "$UV" ] && [ -x "$PIP" ] || die "no uv/pip in $CACHE/tools (run through make, whose \$(UV) target installs them)"

engine="$(bash hack/docker-engine.sh up)"
trap '[ "$engine" = started ] && bash hack/docker-engine.sh down' EXIT

# --- tags, from the chart -----------------------------------------------------------------------
chart_value() { sed -n "s/^$1:[[:space:]]*\"\{0,1\}\([^\"]*\)\"\{0,1\}[[:space:]]*$/\1/p" "$2" | head -n1; }
APP_VERSION="$(chart_value appVersion charts/encoderpool-operator/Chart.yaml)"
OPERATOR_REPO="$(sed -n '/^image:/,/^[^ ]/s/^  repository:[[:space:]]*//p' charts/encoderpool-operator/values.yaml | head -n1)"
OPERATOR_IMAGE="$OPERATOR_REPO:$APP_VERSION"
encoder_image() { sed -n "/^encoderImage:/,/^[^ ]/s/^  $1:[[:space:]]*//p" charts/encoderpool-operator/values.yaml | head -n1; }

# --- base ---------------------------------------------------------------------------------------
base_image() {
  if docker image inspect "$PYTHON_IMAGE" >/dev/null 2>&1; then echo "$PYTHON_IMAGE"; return; fi
  if [ "${ENCODERPOOL_PULL_BASE:-1}" = 1 ] && timeout 120 docker pull -q "$PYTHON_IMAGE" >/dev/null 2>&1; then
    echo "$PYTHON_IMAGE"; return
  fi
  say "$PYTHON_IMAGE cannot be pulled here: using a base made from Debian's packages"
  bash hack/debian-image.sh python python3 python3-venv libibverbs1 ca-certificates
}

# --- pinned requirements and their wheels -------------------------------------------------------
# pinned NAME INPUT... -> path of a requirements file pinning every package (transitively), cached
# by the hash of the inputs: resolution needs the index once, warm runs none.
pinned() {
  local name="$1"; shift
  local key out
  key="$(cat "$@" | sha256sum | cut -c1-16)"
  out="$WHEELHOUSE/$name-requirements-$key.txt"
  if [ ! -s "$out" ]; then
    say "resolving the $name dependencies (uv pip compile, Linux x86_64, CPython 3.11)"
    "$UV" pip compile -q --no-header --no-annotate --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
      "${COMPILE_ARGS[@]}" -o "$out.tmp"
    mv "$out.tmp" "$out"
  fi
  echo "$out"
}

# wheels NAME REQUIREMENTS -> a folder holding exactly those wheels (downloaded once).
wheels() {
  local name="$1" reqs="$2" dir="$WHEELHOUSE/$1"
  local done="$dir/.complete-$(sha256sum "$reqs" | cut -c1-16)"
  mkdir -p "$dir"
  if [ ! -f "$done" ]; then
    say "downloading the $name wheels into $dir (cold; the encoder's are about 4 GB: torch and its CUDA libraries)"
    local began=$SECONDS
    # The host's pip picks the wheels for the host (Linux x86_64, CPython 3.11, glibc of Debian
    # bookworm): the images' own platform, checked below.
    "$PIP" download -q --no-deps --only-binary=:all: --dest "$dir" -r "$reqs" >&2 \
      || die "pip download of the $name wheels failed"
    # Only what this requirements file names stays: stale versions would bloat the build context.
    local keep
    keep="$(sed -n 's/^\([A-Za-z0-9._-]*\)==\([^ ;]*\).*/\1 \2/p' "$reqs" |
      while read -r pkg ver; do echo "$(echo "$pkg" | tr 'A-Z.-' 'a-z__')-$ver-"; done)"
    local f base norm
    for f in "$dir"/*.whl; do
      base="$(basename "$f")"
      norm="$(echo "${base%%-*}" | tr 'A-Z.-' 'a-z__')-$(echo "$base" | cut -d- -f2)-"
      grep -qxF "$norm" <<<"$keep" || rm -f "$f"
    done
    rm -f "$dir"/.complete-*
    touch "$done"
    say "$name wheels: $(ls "$dir"/*.whl | wc -l) files, $(du -sh "$dir" | cut -f1) in $((SECONDS - began))s"
  fi
  echo "$dir"
}

# --- build context and build --------------------------------------------------------------------
# context NAME WHEELDIR REQS -> a context folder: the sources make needs, and docker/wheels/ = the wheels.
context() {
  local ctx="$WORK/context-$1"
  rm -rf "$ctx"
  mkdir -p "$ctx/docker/wheels"
  git ls-files -co --exclude-standard -- pyproject.toml constraints.txt README.md encoder_pod operator docker |
    grep -v -E '(^|/)__pycache__/|^docker/wheels/' | while read -r f; do [ -f "$f" ] && echo "$f"; done |
    xargs cp --parents -t "$ctx"
  cp -l "$2"/*.whl "$ctx/docker/wheels/" 2>/dev/null || cp "$2"/*.whl "$ctx/docker/wheels/"
  cp "$3" "$ctx/docker/wheels/requirements.txt"
  echo "$ctx"
}

inputs_hash() {
  local ctx="$1" dockerfile="$2" base="$3"; shift 3
  {
    echo "$* $(docker image inspect -f '{{.Id}}' "$base")"
    (cd "$ctx" && find . -type f ! -name '*.whl' -print0 | sort -z | xargs -0 sha256sum)
    (cd "$ctx" && find . -name '*.whl' -printf '%f %s\n' | sort)
    sha256sum "$dockerfile"
  } | sha256sum | cut -c1-16
}

# build IMAGE DOCKERFILE CONTEXT BASE [BUILD ARGS...]
build() {
  local image="$1" dockerfile="$2" ctx="$3" base="$4"; shift 4
  local hash
  hash="$(inputs_hash "$ctx" "$dockerfile" "$base" "$@")"
  if [ "$(docker image inspect -f '{{index .Config.Labels "encoderpool.inputs"}}' "$image" 2>/dev/null)" = "$hash" ]; then
    say "$image: up to date ($(size_of "$image"))"
    return 0
  fi
  say "building $image (inputs $hash; base $base)"
  local began=$SECONDS log="$WORK/build-$(echo "$image" | tr '/:' '__').log"
  local args=(--build-arg "PYTHON_IMAGE=$base" --build-arg PIP_NO_INDEX=1 --label "encoderpool.inputs=$hash")
  local a
  for a in "$@"; do args+=(--build-arg "$a"); done
  # Step lines are the progress; the whole output is in the log.
  if ! docker build -f "$ctx/docker/$(basename "$dockerfile")" -t "$image" "${args[@]}" "$ctx" 2>&1 |
      tee "$log" | grep --line-buffered -E '^Step [0-9]+/|^#[0-9]+ \[|^Successfully tagged' >&2; then :; fi
  docker image inspect -f '{{index .Config.Labels "encoderpool.inputs"}}' "$image" 2>/dev/null | grep -qx "$hash" ||
    { tail -n 40 "$log" >&2; die "docker build of $image failed (log: $log)"; }
  say "built $image in $((SECONDS - began))s ($(size_of "$image"))"
}

size_of() { docker image inspect -f '{{.Size}}' "$1" | awk '{printf "%.2f GB", $1/1e9}'; }

main() {
  local began=$SECONDS base encoder_reqs operator_reqs
  "$PIP" --version | grep -q 'python 3\.11' && [ "$(uname -m)" = x86_64 ] ||
    die "the wheels are fetched with the host's pip for the images' platform: it must be CPython 3.11 on x86_64"
  base="$(base_image)"
  # constraints.txt is uv.lock exported for pip: the images get exactly the locked versions.
  COMPILE_ARGS=(pyproject.toml --extra mooncake --extra grpc -c constraints.txt)
  encoder_reqs="$(pinned encoder pyproject.toml constraints.txt)"
  local operator_in="$WORK/operator-requirements.in"
  { cat docker/operator-requirements.in; echo setuptools; } >"$operator_in"
  COMPILE_ARGS=("$operator_in" -c constraints.txt)
  operator_reqs="$(pinned operator "$operator_in" constraints.txt)"

  local ctx
  ctx="$(context operator "$(wheels operator "$operator_reqs")" "$operator_reqs")"
  build "$OPERATOR_IMAGE" docker/Dockerfile.operator "$ctx" "$base"
  local wheeldir variant
  if [ -n "$VARIANTS" ]; then
    wheeldir="$(wheels encoder "$encoder_reqs")"
    ctx="$(context encoder "$wheeldir" "$encoder_reqs")"
  fi
  for variant in $VARIANTS; do
    build "$(encoder_image "$variant")" docker/Dockerfile.encoder-pod "$ctx" "$base" "VARIANT=$variant"
  done
  rm -rf "$WORK"/context-*
  say "done in $((SECONDS - began))s: $OPERATOR_IMAGE$(for v in $VARIANTS; do printf ' %s' "$(encoder_image "$v")"; done)"
}

main "$@"
