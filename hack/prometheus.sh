#!/usr/bin/env bash
# Debian's prometheus package (2.42, with promtool), for the observability tests: they run the
# binaries themselves on loopback with a temporary config and data directory. The package's own
# service is never started: the install runs under a policy-rc.d that refuses every service start
# (Docker images of Debian ship one; where none exists a temporary one is put in place and removed).
set -euo pipefail
if command -v prometheus >/dev/null && command -v promtool >/dev/null; then exit 0; fi
echo ">> prometheus/promtool missing: installing Debian's prometheus package (its service is not started)" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null; then SUDO="sudo -n"; else
    echo "!! run as root or install it yourself: apt-get install -y --no-install-recommends prometheus" >&2; exit 1; fi
fi
if ! command -v apt-get >/dev/null; then
  echo "!! no apt-get here: install Prometheus 2.42+ (prometheus and promtool on PATH)" >&2; exit 1
fi
POLICY=/usr/sbin/policy-rc.d
placed=""
if [ ! -e "$POLICY" ]; then
  printf '#!/bin/sh\n# placed by encoderpool hack/prometheus.sh for one install: start no service\nexit 101\n' | $SUDO tee "$POLICY" >/dev/null
  $SUDO chmod 755 "$POLICY"
  placed=1
fi
cleanup() { if [ -n "$placed" ]; then $SUDO rm -f "$POLICY"; fi; }
trap cleanup EXIT
$SUDO apt-get update -qq -o DPkg::Lock::Timeout=900 >&2 || true
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq -o DPkg::Lock::Timeout=900 --no-install-recommends prometheus >&2
command -v prometheus >/dev/null && command -v promtool >/dev/null
