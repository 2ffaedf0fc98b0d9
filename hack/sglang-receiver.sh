#!/usr/bin/env bash
# Installs SGLang's receiver code for the interop tests, WITHOUT its dependencies (no GPU stack),
# into a cache outside the repo: $ENCODERPOOL_CACHE/sglang-<release>/site (default ~/.cache/encoderpool).
# The tests load its source files directly (hack/sglang_receiver_harness.py); nothing is imported
# into the project's own environment. Prints the site directory.
set -euo pipefail
RELEASE="${1:-0.5.23}"
CACHE="${ENCODERPOOL_CACHE:-$HOME/.cache/encoderpool}"
SITE="$CACHE/sglang-$RELEASE/site"
MARKER="$SITE/sglang/srt/disaggregation/encoder/receiver.py"
if [ ! -f "$MARKER" ]; then
  mkdir -p "$(dirname "$SITE")"
  TMP="$(mktemp -d "$CACHE/sglang-$RELEASE/tmp.XXXXXX")"
  trap 'rm -rf "$TMP"' EXIT
  UV="$CACHE/tools/bin/uv"
  PY="$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python"
  if [ -x "$UV" ] && [ -x "$PY" ]; then
    "$UV" pip install -q --no-deps --target "$TMP" --python "$PY" "sglang==$RELEASE" >&2
  else
    python3 -m pip install -q --no-deps --target "$TMP" "sglang==$RELEASE" >&2
  fi
  test -f "$TMP/sglang/srt/disaggregation/encoder/receiver.py"
  rm -rf "$SITE" && mv "$TMP" "$SITE"
fi
echo "$SITE"
