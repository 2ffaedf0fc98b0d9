"""Names the operator, the CRD, the chart and the tests agree on.

The API names mirror ``crds/encoderpools.encoderpool.io.yaml`` (a unit test checks they match).
Children share the pool's name so a person finds them with ``kubectl get sts,svc,pdb <pool>``.
"""

from __future__ import annotations

GROUP = "encoderpool.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "EncoderPool"
PLURAL = "encoderpools"

OPERATOR_NAME = "encoderpool-operator"
CONTAINER_NAME = "encoder"
PORT_NAME = "http"
GRPC_PORT_NAME = "grpc"
"""The encoder container's port of SGLang's gRPC face (spec.grpc.port)."""
GRPC_ENV = "ENCODER_GRPC_PORT"
"""Rendered only for a pool with spec.grpc.port (the pod's gRPC face is off by default)."""
GRPC_LIVENESS_SERVICE = "encoderpool.liveness"
"""The grpc.health.v1 service name a pod answers like GET /livez (the event loop alone)."""

# Labels. The selector uses only our own domain label: app.kubernetes.io/instance is shared with
# Helm releases and other tools, and a selector must never match someone else's pods.
POOL_LABEL = f"{GROUP}/pool"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
NAME_LABEL = "app.kubernetes.io/name"
INSTANCE_LABEL = "app.kubernetes.io/instance"
COMPONENT_LABEL = "app.kubernetes.io/component"
RESERVED_LABELS = (POOL_LABEL, MANAGED_BY_LABEL, NAME_LABEL, INSTANCE_LABEL, COMPONENT_LABEL)

# Set by the StatefulSet controller on every pod it creates: which template revision the pod runs.
REVISION_LABEL = "controller-revision-hash"

# Rendered only when spec.sglang.registerURLs is set (the pod derives its own URL otherwise).
REGISTRATION_ENV = ("ENCODER_REGISTER_URLS", "ENCODER_ADVERTISE_URL")
# Where vLLM's consumers read the stored embeddings (spec.vllmStorage): its claim, or an emptyDir per pod.
VLLM_STORAGE_VOLUME = "vllm-ec"
VLLM_STORAGE_DIR = "/vllm-ec"
# The pod's own IP from the downward API, for ENCODER_ADVERTISE_URL=http://$(POD_IP):<port>.
POD_IP_ENV = "POD_IP"

# Hub models: an init container fetches the model into a cache volume shared with the encoder.
FETCH_CONTAINER_NAME = "fetch-model"
MODEL_CACHE_VOLUME = "model-cache"
MODEL_CACHE_DIR = "/model-cache"

SPEC_HASH_ANNOTATION = f"{GROUP}/spec-hash"
# On every child: a hash of the manifest last applied, so an unchanged child is not written again.
MANIFEST_HASH_ANNOTATION = f"{GROUP}/manifest-hash"
DEFAULT_CONTAINER_ANNOTATION = "kubectl.kubernetes.io/default-container"

# The StatefulSet controller labels each pod "<sts>-<10-char hash>" (controller-revision-hash);
# a label value holds at most 63 characters, so the pool name may use 63 - 11 = 52.
MAX_POOL_NAME = 52


def child_name(pool_name: str) -> str:
    """Name of the StatefulSet, headless Service, PodDisruptionBudget and HPA of a pool."""
    return pool_name


def selector_labels(pool_name: str) -> dict[str, str]:
    """The immutable label selector of a pool's pods (also its scale subresource selector)."""
    return {POOL_LABEL: pool_name}


def selector_string(pool_name: str) -> str:
    """The selector as the string the scale subresource (HPA, kubectl scale) expects."""
    return ",".join(f"{k}={v}" for k, v in sorted(selector_labels(pool_name).items()))


def common_labels(pool_name: str) -> dict[str, str]:
    """Labels on every child and pod; the operator watches children by the managed-by label."""
    return {
        NAME_LABEL: "encoder-pod",
        INSTANCE_LABEL: pool_name,
        COMPONENT_LABEL: "encoder",
        MANAGED_BY_LABEL: OPERATOR_NAME,
        **selector_labels(pool_name),
    }


def pod_dns_name(pod_name: str, pool_name: str, namespace: str) -> str:
    """DNS name of a ready pod through the pool's headless Service."""
    return f"{pod_name}.{child_name(pool_name)}.{namespace}.svc"
