"""Parts of the encoder pod: containers, probes, lifecycle, resources, volumes, security context.

Pure functions of the typed spec; ``podtemplate.py`` assembles them. Snapshot-tested.
"""

from __future__ import annotations

import math
from typing import Any

from encoderpool_operator import names
from encoderpool_operator.podenv import CACHE_DIR, container_command, container_env, fetch_command, fetch_env
from encoderpool_operator.spec import PoolSpec
from encoderpool_operator.specmodels import ResourceList

# Readiness and startup: GET /health answers from the pod's state (a real encode that succeeded
# recently, run in the background on a priority path), so it is bounded even at saturation and
# turns 503 at once on SIGTERM. Liveness: GET /livez, only the event loop, never the model.
HEALTH_PATH = "/health"
LIVENESS_PATH = "/livez"
STARTUP_PERIOD_SECONDS = 10
HEALTH_TIMEOUT_SECONDS = 5  # /health answers in well under a second by contract
RUN_AS_USER = 10001  # the numeric USER of docker/Dockerfile.encoder-pod


def _resource_dict(res: ResourceList | None) -> dict[str, Any]:
    if res is None:
        return {}
    return res.model_dump(mode="json", by_alias=True, exclude_none=True)


def resources(spec: PoolSpec, gpus: bool = True) -> dict[str, Any]:
    """requests/limits from the spec plus tensor x data GPUs (extended resources need both equal)."""
    requests = _resource_dict(spec.resources.requests)
    limits = _resource_dict(spec.resources.limits)
    if gpus and spec.gpus_per_pod > 0:
        requests[spec.gpu_resource_name] = spec.gpus_per_pod
        limits[spec.gpu_resource_name] = spec.gpus_per_pod
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def probes(spec: PoolSpec) -> dict[str, Any]:
    """Startup, readiness and liveness probes.

    Startup and readiness ask GET /health: "started" means the model loaded and a real encode
    passed, which is what lets status tell a slow model load from a failing probe. The startup
    budget is spec.startupTimeoutSeconds; liveness only starts after it, so a long load is never
    killed, and it asks /livez, which a saturated pod still answers (its queue is never lost to a
    liveness restart). With spec.grpc.probes the same three ask grpc.health.v1 on the gRPC port
    instead (readiness and startup: the verdict of /health; liveness: that of /livez).
    """

    def get(path: str) -> dict[str, Any]:
        return {"path": path, "port": names.PORT_NAME, "scheme": "HTTP"}

    if spec.grpc.probes:
        assert spec.grpc.port is not None  # Grpc guarantees it
        port = spec.grpc.port
        # The kubelet's gRPC probe calls grpc.health.v1.Health/Check: service "" is the same verdict
        # as GET /health, encoderpool.liveness the same as GET /livez. (A gRPC probe names its port
        # by number: the API has no named port for it.)
        def ready() -> dict[str, Any]:
            return {"grpc": {"port": port}}

        def alive() -> dict[str, Any]:
            return {"grpc": {"port": port, "service": names.GRPC_LIVENESS_SERVICE}}
    else:
        def ready() -> dict[str, Any]:
            return {"httpGet": get(HEALTH_PATH)}

        def alive() -> dict[str, Any]:
            return {"httpGet": get(LIVENESS_PATH)}

    return {
        "startupProbe": {
            **ready(),
            "periodSeconds": STARTUP_PERIOD_SECONDS,
            "timeoutSeconds": HEALTH_TIMEOUT_SECONDS,
            "failureThreshold": math.ceil(spec.startup_timeout_seconds / STARTUP_PERIOD_SECONDS),
        },
        "readinessProbe": {
            **ready(),
            "periodSeconds": 5,
            "timeoutSeconds": HEALTH_TIMEOUT_SECONDS,
            "failureThreshold": 2,
        },
        # Generous: only a process whose event loop is gone for a minute is restarted.
        "livenessProbe": {
            **alive(),
            "periodSeconds": 10,
            "timeoutSeconds": 10,
            "failureThreshold": 6,
        },
    }


def container_ports(spec: PoolSpec) -> list[dict[str, Any]]:
    """The encoder container's ports: HTTP, and SGLang's gRPC face when spec.grpc.port is set."""
    ports = [{"name": names.PORT_NAME, "containerPort": spec.port, "protocol": "TCP"}]
    if spec.grpc.port is not None:
        ports.append({"name": names.GRPC_PORT_NAME, "containerPort": spec.grpc.port, "protocol": "TCP"})
    return ports


def lifecycle(spec: PoolSpec) -> dict[str, Any]:
    """A preStop wait, so endpoint removal reaches routers before SIGTERM starts the drain."""
    if spec.drain.pre_stop_seconds <= 0:
        return {}
    return {"lifecycle": {"preStop": {"sleep": {"seconds": spec.drain.pre_stop_seconds}}}}


def container_security_context() -> dict[str, Any]:
    """What the ``restricted`` Pod Security Standard requires, plus a read-only root."""
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "runAsGroup": RUN_AS_USER,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _model_volume(spec: PoolSpec) -> dict[str, Any] | None:
    mv = spec.model_volume
    if mv is None:
        return None
    if mv.persistent_volume_claim is not None:
        source = {"persistentVolumeClaim": {"claimName": mv.persistent_volume_claim.claim_name, "readOnly": True}}
    elif mv.host_path is not None:
        source = {"hostPath": {"path": mv.host_path.path, "type": "Directory"}}
    else:
        assert mv.image is not None  # ModelVolume guarantees exactly one source
        source = {"image": {"reference": mv.image.reference, "pullPolicy": mv.image.pull_policy}}
    return {"name": "model", **source}


def model_cache_volume(spec: PoolSpec) -> dict[str, Any] | None:
    """The hub model's cache: the pool's shared PVC when given, else an emptyDir per pod."""
    if spec.hub_model is None:
        return None
    cache = spec.model_source.cache if spec.model_source else None
    if cache is not None and cache.persistent_volume_claim is not None:
        return {"name": names.MODEL_CACHE_VOLUME,
                "persistentVolumeClaim": {"claimName": cache.persistent_volume_claim.claim_name}}
    empty: dict[str, Any] = {}
    if cache is not None and cache.size_limit is not None:
        empty["sizeLimit"] = cache.size_limit
    return {"name": names.MODEL_CACHE_VOLUME, "emptyDir": empty}


def volumes_and_mounts(spec: PoolSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Writable emptyDirs for the read-only root, shared memory for DP workers, the model or its cache,
    and with spec.vllmStorage the stored embeddings (the pool's shared claim, or an emptyDir per pod)."""
    volumes: list[dict[str, Any]] = [
        {"name": "tmp", "emptyDir": {}},
        {"name": "cache", "emptyDir": {}},
        # torch moves tensors between worker processes through /dev/shm; the runtime's 64 MiB
        # default is too small for a batch of image features.
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.shm_size}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "cache", "mountPath": CACHE_DIR},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    model = _model_volume(spec)
    if model is not None and spec.model_volume is not None:
        volumes.append(model)
        mounts.append({"name": "model", "mountPath": spec.model_volume.mount_path, "readOnly": True})
    cache = model_cache_volume(spec)
    if cache is not None:
        volumes.append(cache)
        mounts.append({"name": names.MODEL_CACHE_VOLUME, "mountPath": names.MODEL_CACHE_DIR})
    if spec.vllm_storage is not None:
        claim = spec.vllm_storage.claim_name
        source = {"persistentVolumeClaim": {"claimName": claim}} if claim else {"emptyDir": {}}
        volumes.append({"name": names.VLLM_STORAGE_VOLUME, **source})
        mounts.append({"name": names.VLLM_STORAGE_VOLUME, "mountPath": names.VLLM_STORAGE_DIR})
    return volumes, mounts


def encoder_container(spec: PoolSpec, image: str, mounts: list[dict[str, Any]]) -> dict[str, Any]:
    """The encoder container."""
    return {
        "name": names.CONTAINER_NAME,
        "image": image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": container_command(spec),
        "env": container_env(spec),
        "ports": container_ports(spec),
        "resources": resources(spec),
        **probes(spec),
        **lifecycle(spec),
        "securityContext": container_security_context(),
        "volumeMounts": mounts,
        # The tail of the log becomes the termination message when the container fails, so
        # status can quote why the model did not load (reason ModelLoadFailed).
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def fetch_container(spec: PoolSpec, image: str, mounts: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The init container that fetches a hub model with the encoder image itself; None for paths.

    Same CPU and memory as the encoder but no GPU, so it changes nothing about scheduling.
    """
    if spec.hub_model is None:
        return None
    return {
        "name": names.FETCH_CONTAINER_NAME,
        "image": image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": fetch_command(spec),
        "env": fetch_env(spec),
        "resources": resources(spec, gpus=False),
        "securityContext": container_security_context(),
        "volumeMounts": [m for m in mounts if m["name"] in ("tmp", "cache", names.MODEL_CACHE_VOLUME)],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def pod_security_context(spec: PoolSpec) -> dict[str, Any]:
    """Non-root with the runtime's seccomp profile; a claim the pod writes to (the model cache's, the
    vLLM storage's) is made writable through fsGroup: a fresh volume's root belongs to root."""
    out: dict[str, Any] = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    cache = model_cache_volume(spec)
    writes_a_claim = (cache is not None and "persistentVolumeClaim" in cache) or (
        spec.vllm_storage is not None and bool(spec.vllm_storage.claim_name))
    if writes_a_claim:
        # OnRootMismatch: a large shared cache is not chowned file by file at every pod start.
        out.update(fsGroup=RUN_AS_USER, fsGroupChangePolicy="OnRootMismatch")
    return out


def optional_pod_fields(spec: PoolSpec) -> dict[str, Any]:
    """Pod fields set only when the spec sets them (an empty value would still be applied)."""
    out: dict[str, Any] = {}
    if spec.node_selector:
        out["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        out["tolerations"] = [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in spec.tolerations]
    if spec.affinity:
        out["affinity"] = spec.affinity
    if spec.image_pull_secrets:
        out["imagePullSecrets"] = [{"name": s.name} for s in spec.image_pull_secrets]
    for key, value in (
        ("priorityClassName", spec.priority_class_name),
        ("serviceAccountName", spec.service_account_name),
        ("runtimeClassName", spec.runtime_class_name),
    ):
        if value:
            out[key] = value
    return out
