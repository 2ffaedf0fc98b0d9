#!/usr/bin/env bash
# make test: the whole suite (`make test` runs `make lint` before it). First everything that needs
# no container engine (unit, integration, the local control plane's e2e tier: tests/ minus
# tests/kind), then the kind tier (hack/kind-e2e.sh) whenever a Docker engine answers or can be
# started here (below). pytest's exit 5 ("no tests collected") is a failure too: a suite that runs nothing
# must not pass.
set -uo pipefail
cd "$(dirname "$0")/.."
began=$SECONDS
.venv/bin/pytest --ignore=tests/kind "$@"
rc=$?
if [ "$rc" -eq 5 ]; then echo "pytest collected no tests" >&2; rc=1; fi
echo ">> make test: tests/ without the kind tier: exit $rc in $((SECONDS - began))s"
began=$SECONDS
# The kind tier (hack/kind-e2e.sh) runs whenever a Docker engine answers or can be started here.
# ENCODERPOOL_KIND_TIER=0 leaves it out; =1 requires it (no engine is then a failure); unset, a
# machine that cannot run a Docker engine skips it, loudly.
tier="${ENCODERPOOL_KIND_TIER:-auto}"
if [ "$tier" = 0 ]; then
  echo ">> make test: the kind tier is left out (ENCODERPOOL_KIND_TIER=0; make kind-e2e runs it alone)"
  kind_rc=0
elif bash hack/docker-engine.sh can; then
  PYTEST_ARGS="${KIND_PYTEST_ARGS:-}" bash hack/kind-e2e.sh
  kind_rc=$?
  echo ">> make test: the kind tier: exit $kind_rc in $((SECONDS - began))s"
else
  echo "!! make test: no Docker engine answers and none can be started here (needs root or passwordless sudo," >&2
  echo "   and dockerd or apt-get): the kind tier cannot run." >&2
  if [ "$tier" = 1 ]; then kind_rc=1; else echo "!! make test: the kind tier is SKIPPED (ENCODERPOOL_KIND_TIER=1 makes this a failure)" >&2; kind_rc=0; fi
fi
[ "$rc" -eq 0 ] && [ "$kind_rc" -eq 0 ]
