#!/usr/bin/env bash
# vLLM's own source for the interop tests, WITHOUT its dependencies (no GPU stack), in a cache
# outside the repo. Usage: hack/vllm-wheel.sh [RELEASE]  -> prints the unpacked site dir.
#
#   wheel:  $ENCODERPOOL_CACHE/wheels/vllm-<release>-*.whl   (pip download --no-deps, once; ~240 MB)
#   source: $ENCODERPOOL_CACHE/vllm-<release>/site            (its .py files unpacked; nothing runs)
#
# The tests load these files directly (hack/vllm_release.py); nothing is installed into the
# project's environment. A fresh machine needs the package index once; later runs are offline.
set -euo pipefail
RELEASE="${1:-0.34.0}"   # keep equal to encoder_pod.settings.VLLM_RELEASES
CACHE="${ENCODERPOOL_CACHE:-$HOME/.cache/encoderpool}"
WHEELS="$CACHE/wheels"
SITE="$CACHE/vllm-$RELEASE/site"
if [ ! -f "$SITE/vllm/multimodal/hasher.py" ]; then
  mkdir -p "$WHEELS" "$CACHE/vllm-$RELEASE"
  WHEEL="$(ls "$WHEELS"/vllm-"$RELEASE"-*.whl 2>/dev/null | head -n1 || true)"
  if [ -z "$WHEEL" ]; then
    echo ">> downloading vllm==$RELEASE (wheel only, --no-deps) into $WHEELS" >&2
    if [ -x "$CACHE/tools/bin/pip" ]; then PIP=("$CACHE/tools/bin/pip"); else PIP=(python3 -m pip); fi
    "${PIP[@]}" download -q --no-deps --only-binary=:all: --dest "$WHEELS" "vllm==$RELEASE" >&2
    WHEEL="$(ls "$WHEELS"/vllm-"$RELEASE"-*.whl | head -n1)"
  fi
  TMP="$(mktemp -d "$CACHE/vllm-$RELEASE/tmp.XXXXXX")"
  trap 'rm -rf "$TMP"' EXIT
  # Only the Python sources and the metadata: the compiled kernels are never loaded here.
  python3 - "$WHEEL" "$TMP" <<'PY'
import sys, zipfile
wheel = zipfile.ZipFile(sys.argv[1])
wheel.extractall(sys.argv[2], members=[n for n in wheel.namelist() if n.endswith((".py", "METADATA"))])
PY
  test -f "$TMP/vllm/multimodal/hasher.py"
  rm -rf "$SITE" && mv "$TMP" "$SITE"
  trap - EXIT
fi
echo "$SITE"
