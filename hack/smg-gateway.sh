#!/usr/bin/env bash
# The SMG gateway (PyPI `smg`, the Rust gateway SGLang's gRPC encoder proto was written for) in a
# venv of its own, in the cache outside the repo. Usage: hack/smg-gateway.sh -> prints the `smg` path.
#
#   $ENCODERPOOL_CACHE/smg-<version>/bin/smg   (uv pip install, once; offline afterwards)
#
# Only tests/integration/test_grpc_smg.py uses it; nothing is installed into the project's environment.
set -euo pipefail
VERSION="${SMG_VERSION:-1.13.0}"
CACHE="${ENCODERPOOL_CACHE:-$HOME/.cache/encoderpool}"
VENV="$CACHE/smg-$VERSION"
UV="$CACHE/tools/bin/uv"
if [ ! -x "$VENV/bin/smg" ]; then
  echo ">> installing smg==$VERSION into $VENV" >&2
  rm -rf "$VENV"
  if [ -x "$UV" ]; then
    "$UV" venv -q --python python3 "$VENV" >&2
    "$UV" pip install -q --python "$VENV/bin/python" "smg==$VERSION" >&2
  else
    python3 -m venv "$VENV" >&2
    "$VENV/bin/pip" install -q "smg==$VERSION" >&2
  fi
fi
echo "$VENV/bin/smg"
