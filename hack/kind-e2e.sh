#!/usr/bin/env bash
# make kind-e2e: the tests that need real containers (tests/kind) on a kind cluster.
#
# 1. a Docker engine (hack/docker-engine.sh: started, installed from Debian's packages if missing);
# 2. the Go-built tools: kubectl, helm (hack/build-control-plane.sh), kind and its node image's
#    binaries (hack/build-kind.sh), all cached outside the repo;
# 3. the images (hack/images.sh);
# 4. a kind cluster (hack/kind-cluster.sh: kind's node image where it can be pulled, else one
#    assembled offline; --privileged or its stand-in, as the host allows), the images loaded;
# 5. pytest tests/kind against it (ENCODERPOOL_E2E_KUBECONFIG);
# 6. always: the cluster deleted, the host's sysctls restored, the kind network and volumes removed,
#    and the Docker engine stopped if step 1 started it; then tests/kind/after checks that the host
#    is as step 0 recorded it (sysctls, containers, networks, volumes, interfaces, the engine).
# Each step's time is printed at the end.
#
# Environment:
#   KIND_CLUSTER_NAME  cluster name (default encoderpool-e2e)
#   KIND_NODE_IMAGE    node image, e.g. kindest/node:v1.35.4 (default: detected, see hack/kind-cluster.sh)
#   KEEP_CLUSTER=1     keep the cluster (and the engine) at the end, for a look with kubectl
#   PYTEST_ARGS        extra pytest arguments
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${ENCODERPOOL_CACHE:-$HOME/.cache/encoderpool}"
export ENCODERPOOL_CACHE="$CACHE"
CLUSTER="${KIND_CLUSTER_NAME:-encoderpool-e2e}"
PY=.venv/bin/python
[ -x "$PY" ] || { echo "kind-e2e: no $PY: run through 'make kind-e2e', which creates it" >&2; exit 1; }

WORK="$(mktemp -d "${TMPDIR:-/tmp}/encoderpool-kind-e2e.XXXXXX")"
TIMES=()
step_began=$SECONDS
step() { TIMES+=("$(printf '%-28s %4ds' "$1" $((SECONDS - step_began)))"); step_began=$SECONDS; }

engine=""
cluster_made=0
finish() {
  local rc=$?
  step_began=$SECONDS
  if [ "$cluster_made" = 1 ] && [ "${KEEP_CLUSTER:-0}" != 1 ]; then
    bash hack/kind-cluster.sh down "$CLUSTER" || rc=1
  fi
  if [ "$engine" = started ] && [ "${KEEP_CLUSTER:-0}" != 1 ]; then bash hack/docker-engine.sh down || true; fi
  step "teardown"
  if [ "${KEEP_CLUSTER:-0}" != 1 ]; then
    ENCODERPOOL_HOST_BEFORE="$WORK/host-before" .venv/bin/pytest tests/kind/after -q -p no:cacheprovider || rc=1
    step "host left as found"
  fi
  rm -rf "$WORK"
  echo ">> kind-e2e times:"
  printf '   %s\n' "${TIMES[@]}"
  exit "$rc"
}
trap finish EXIT

"$PY" -m tests.kind.hoststate "$WORK/host-before"
engine="$(bash hack/docker-engine.sh up)"
step "docker engine ($engine)"
bash hack/build-control-plane.sh
step "control-plane tools"
bash hack/build-kind.sh
step "kind binaries"
bash hack/images.sh
step "images"

# shellcheck disable=SC1091
. "$CACHE/bin/control-plane.env"
KUBECONFIG_FILE="$WORK/kubeconfig"
cluster_made=1
bash hack/kind-cluster.sh up "$CLUSTER" "$KUBECONFIG_FILE"
step "cluster up"
read -r OPERATOR_IMAGE ENCODER_IMAGE < <("$PY" -c 'from tests.kind.images import OPERATOR_IMAGE as o, ENCODER_CPU_IMAGE as e; print(o, e)')
bash hack/kind-cluster.sh load "$CLUSTER" "$OPERATOR_IMAGE" "$ENCODER_IMAGE"
step "images loaded"

echo ">> running tests/kind against kind cluster $CLUSTER"
# shellcheck disable=SC2086  # PYTEST_ARGS is a list of words on purpose
ENCODERPOOL_E2E_KUBECONFIG="$KUBECONFIG_FILE" ENCODERPOOL_E2E_KUBECTL="$KUBECTL" ENCODERPOOL_E2E_HELM="$HELM" \
  KIND_CLUSTER_NAME="$CLUSTER" .venv/bin/pytest tests/kind --ignore=tests/kind/after -m kind -v -rs -p no:cacheprovider --timeout=1200 ${PYTEST_ARGS:-}
step "tests"
