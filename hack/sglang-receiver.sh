#!/usr/bin/env bash
# SGLang's own source for the interop tests, WITHOUT its dependencies (no GPU stack), in a cache
# outside the repo. Usage: hack/sglang-receiver.sh RELEASE... | all   -> prints one site dir per release.
#
#   wheels: $ENCODERPOOL_CACHE/sglang-wheels/sglang-<release>-*.whl  (pip download --no-deps, once)
#   source: $ENCODERPOOL_CACHE/sglang-<release>/site                   (the wheel unpacked; nothing runs)
#
# The tests load these files directly (hack/sglang_release.py); nothing is installed into the
# project's environment. A fresh machine needs the package index once; later runs are offline.
set -euo pipefail
ALL=(0.5.19 0.5.20 0.5.21 0.5.22 0.5.23)   # keep equal to encoder_pod.settings.SGLANG_RELEASES
CACHE="${ENCODERPOOL_CACHE:-$HOME/.cache/encoderpool}"
WHEELS="$CACHE/sglang-wheels"
if [ "$#" -eq 0 ] || [ "$1" = all ]; then set -- "${ALL[@]}"; fi

pip_cmd() {
  # Any pip works for a --no-deps download: the tools venv's (Makefile), else the system's.
  if [ -x "$CACHE/tools/bin/pip" ]; then "$CACHE/tools/bin/pip" "$@"; else python3 -m pip "$@"; fi
}

for RELEASE in "$@"; do
  SITE="$CACHE/sglang-$RELEASE/site"
  if [ ! -f "$SITE/sglang/srt/disaggregation/encoder/receiver.py" ]; then
    mkdir -p "$WHEELS" "$CACHE/sglang-$RELEASE"
    WHEEL="$(ls "$WHEELS"/sglang-"$RELEASE"-*.whl 2>/dev/null | head -n1 || true)"
    if [ -z "$WHEEL" ]; then
      echo ">> downloading sglang==$RELEASE (wheel only, --no-deps) into $WHEELS" >&2
      pip_cmd download -q --no-deps --only-binary=:all: --dest "$WHEELS" "sglang==$RELEASE" >&2
      WHEEL="$(ls "$WHEELS"/sglang-"$RELEASE"-*.whl | head -n1)"
    fi
    TMP="$(mktemp -d "$CACHE/sglang-$RELEASE/tmp.XXXXXX")"
    trap 'rm -rf "$TMP"' EXIT
    python3 -m zipfile -e "$WHEEL" "$TMP"
    test -f "$TMP/sglang/srt/disaggregation/encoder/receiver.py"
    rm -rf "$SITE" && mv "$TMP" "$SITE"
    trap - EXIT
  fi
  echo "$SITE"
done
