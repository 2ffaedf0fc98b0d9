#!/usr/bin/env bash
# make kind-e2e: the operator's end-to-end tests on a kind cluster, for people with Docker.
#
# Builds the operator image and the CPU encoder image, creates a kind cluster (or reuses one of
# that name), loads both images into it, and runs the SAME tests as the local control plane
# (tests/e2e/test_operator_*.py), pointed at the kind cluster through ENCODERPOOL_E2E_KUBECONFIG:
# helm install of the chart and its CRD, the operator running as the chart's ServiceAccount (on
# kind: the chart's own Deployment, the operator image for real), invalid pools refused by the API
# server, and examples/encoderpool-cpu.yaml becoming Ready after its encode probe passes, with one
# /encode answered by the pod behind an address of the headless Service's EndpointSlice (reached
# through kubectl port-forward) and a pool with a wrong model path reported ModelLoadFailed.
# Tests that need the local control plane's fake GPU nodes or kill the operator process skip.
#
# It cannot run on the machines this project is developed and tested on (no Docker engine there):
# it is written to be right by reading, and `make e2e` runs the same tests on a locally built
# control plane instead. Needs docker, kind (a node image of Kubernetes 1.30 or later), kubectl
# and helm on PATH.
#
# Environment:
#   KIND_CLUSTER_NAME  cluster name (default encoderpool-e2e); reused if it exists
#   KIND_NODE_IMAGE    node image for a new cluster, e.g. kindest/node:v1.35.0 (default: kind's)
#   KEEP_CLUSTER=1     keep a cluster this script created (default: delete it at the end)
#   PYTEST_ARGS        extra pytest arguments
set -euo pipefail
cd "$(dirname "$0")/.."

PY=.venv/bin/python
CLUSTER=${KIND_CLUSTER_NAME:-encoderpool-e2e}

die() { echo "kind-e2e: $*" >&2; exit 1; }
for tool in docker kind kubectl helm; do
  command -v "$tool" >/dev/null || die "$tool is not on PATH (this target needs a Docker engine and kind)"
done
docker info >/dev/null 2>&1 || die "the Docker engine does not answer (docker info failed)"
[ -x "$PY" ] || die "no $PY: run through 'make kind-e2e', which creates it"

# The tags the chart uses by default: the operator image is tagged with the chart's appVersion,
# the CPU encoder image is values.yaml's encoderImage.cpu. Building exactly those means the chart
# is installed with the tests' values only, as on the local control plane.
read -r OPERATOR_IMAGE ENCODER_IMAGE < <("$PY" - <<'EOF'
import yaml
chart = yaml.safe_load(open("charts/encoderpool-operator/Chart.yaml"))
values = yaml.safe_load(open("charts/encoderpool-operator/values.yaml"))
image = values["image"]
print(f'{image["repository"]}:{image["tag"] or chart["appVersion"]}', values["encoderImage"]["cpu"])
EOF
)
[ -n "$OPERATOR_IMAGE" ] && [ -n "$ENCODER_IMAGE" ] || die "could not read the image names from the chart"

echo ">> building $OPERATOR_IMAGE and $ENCODER_IMAGE"
docker build -f docker/Dockerfile.operator -t "$OPERATOR_IMAGE" .
docker build -f docker/Dockerfile.encoder-pod --build-arg VARIANT=cpu -t "$ENCODER_IMAGE" .

WORK=$(mktemp -d "${TMPDIR:-/tmp}/encoderpool-kind-e2e.XXXXXX")
created=0
cleanup() {
  local rc=$?
  if [ "$created" = 1 ] && [ "${KEEP_CLUSTER:-0}" != 1 ]; then
    echo ">> deleting kind cluster $CLUSTER (KEEP_CLUSTER=1 keeps it)"
    kind delete cluster --name "$CLUSTER" || true
  fi
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT

if kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  echo ">> reusing kind cluster $CLUSTER"
else
  echo ">> creating kind cluster $CLUSTER"
  kind create cluster --name "$CLUSTER" --wait 180s ${KIND_NODE_IMAGE:+--image "$KIND_NODE_IMAGE"}
  created=1
fi
# A kubeconfig of its own: the user's ~/.kube/config is neither read nor changed.
kind get kubeconfig --name "$CLUSTER" > "$WORK/kubeconfig"
chmod 600 "$WORK/kubeconfig"

echo ">> loading the images into the cluster's nodes"
kind load docker-image --name "$CLUSTER" "$OPERATOR_IMAGE" "$ENCODER_IMAGE"

echo ">> running tests/e2e/test_operator_*.py against kind"
# shellcheck disable=SC2086  # PYTEST_ARGS is a list of words on purpose
ENCODERPOOL_E2E_KUBECONFIG="$WORK/kubeconfig" \
  .venv/bin/pytest -m e2e tests/e2e/test_operator_*.py -v -rs ${PYTEST_ARGS:-}
