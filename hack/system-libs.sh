#!/usr/bin/env bash
# System libraries the test suite needs beyond Python wheels. The mooncake transfer engine
# (encoderpool[mooncake]) links libibverbs.so.1 even for TCP; Debian/Ubuntu ship it as libibverbs1.
set -euo pipefail
if ldconfig -p 2>/dev/null | grep -q 'libibverbs\.so\.1 '; then exit 0; fi
echo ">> libibverbs.so.1 is missing (needed by the mooncake transfer engine, even over TCP): installing libibverbs1" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null; then SUDO="sudo -n"; else
    echo "!! run as root or install it yourself: apt-get install -y libibverbs1" >&2; exit 1; fi
fi
if ! command -v apt-get >/dev/null; then
  echo "!! no apt-get here: install the package that provides libibverbs.so.1 (rdma-core / libibverbs)" >&2; exit 1
fi
$SUDO apt-get update -qq >&2 || true
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libibverbs1 >&2
ldconfig -p | grep -q 'libibverbs\.so\.1 '
