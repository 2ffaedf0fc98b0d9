"""The encoder pod template: container, probes, volumes and a restricted security context.

Pure functions of the typed spec and the operator settings; snapshot-tested.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from encoderpool_operator import names
from encoderpool_operator.podenv import CACHE_DIR, container_command, container_env
from encoderpool_operator.settings import OperatorSettings
from encoderpool_operator.spec import PoolSpec, ResourceList

READINESS_PATH = "/health_generate"  # a real encode: ready means the model answers
LIVENESS_PATH = "/health"  # cheap: alive means the server process answers
STARTUP_PERIOD_SECONDS = 10
# Above the pod's own health-encode timeout (ENCODER_HEALTH_TIMEOUT, 20 s by default), so a slow
# encode is reported by the pod as 503 with a message rather than cut off by the kubelet.
HEALTH_GENERATE_TIMEOUT_SECONDS = 25
RUN_AS_USER = 10001  # the numeric USER of docker/Dockerfile.encoder-pod


def spec_hash(spec: PoolSpec) -> str:
    """A short hash of everything in the spec that shapes a pod (all but replicas).

    It goes on the pod template, so any spec change rolls the pods, even one that would not
    otherwise change the template, while scaling never does.
    """
    wire = spec.wire()
    wire.pop("replicas", None)
    return hashlib.sha256(json.dumps(wire, sort_keys=True).encode()).hexdigest()[:16]


def image_for(spec: PoolSpec, settings: OperatorSettings) -> str:
    """spec.image, else the operator's default CUDA or CPU image."""
    if spec.image:
        return spec.image
    return settings.default_image if spec.gpus_per_pod > 0 else settings.default_cpu_image


def _resource_dict(res: ResourceList | None) -> dict[str, Any]:
    if res is None:
        return {}
    return res.model_dump(mode="json", by_alias=True, exclude_none=True)


def resources(spec: PoolSpec) -> dict[str, Any]:
    """requests/limits from the spec plus tensor x data GPUs (extended resources need both equal)."""
    requests = _resource_dict(spec.resources.requests)
    limits = _resource_dict(spec.resources.limits)
    if spec.gpus_per_pod > 0:
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

    The startup probe is the real encode too: "started" then means the model loaded and answered
    once, which is what lets status tell a slow model load from a failing probe. Its budget is
    spec.startupTimeoutSeconds; liveness only starts after it, so a long load is never killed.
    """

    def get(path: str) -> dict[str, Any]:
        return {"path": path, "port": names.PORT_NAME, "scheme": "HTTP"}

    return {
        "startupProbe": {
            "httpGet": get(READINESS_PATH),
            "periodSeconds": STARTUP_PERIOD_SECONDS,
            "timeoutSeconds": HEALTH_GENERATE_TIMEOUT_SECONDS,
            "failureThreshold": math.ceil(spec.startup_timeout_seconds / STARTUP_PERIOD_SECONDS),
        },
        "readinessProbe": {
            "httpGet": get(READINESS_PATH),
            "periodSeconds": 10,
            "timeoutSeconds": HEALTH_GENERATE_TIMEOUT_SECONDS,
            "failureThreshold": 3,
        },
        # Generous: a pod busy with a large batch must not be restarted for a slow answer.
        "livenessProbe": {
            "httpGet": get(LIVENESS_PATH),
            "periodSeconds": 20,
            "timeoutSeconds": 10,
            "failureThreshold": 6,
        },
    }


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


def volumes_and_mounts(spec: PoolSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Writable emptyDirs for the read-only root, shared memory for DP workers, the model."""
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
    return volumes, mounts


def container(spec: PoolSpec, settings: OperatorSettings, mounts: list[dict[str, Any]]) -> dict[str, Any]:
    """The one encoder container."""
    return {
        "name": names.CONTAINER_NAME,
        "image": image_for(spec, settings),
        "imagePullPolicy": spec.image_pull_policy,
        "command": container_command(spec),
        "env": container_env(spec),
        "ports": [{"name": names.PORT_NAME, "containerPort": spec.port, "protocol": "TCP"}],
        "resources": resources(spec),
        **probes(spec),
        "securityContext": container_security_context(),
        "volumeMounts": mounts,
        # The tail of the log becomes the termination message when the container fails, so
        # status can quote why the model did not load (reason ModelLoadFailed).
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def _optional_pod_fields(spec: PoolSpec) -> dict[str, Any]:
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


def pod_template(pool_name: str, spec: PoolSpec, settings: OperatorSettings) -> dict[str, Any]:
    """The StatefulSet's pod template."""
    volumes, mounts = volumes_and_mounts(spec)
    annotations = {
        **spec.pod_annotations,
        names.SPEC_HASH_ANNOTATION: spec_hash(spec),
        names.DEFAULT_CONTAINER_ANNOTATION: names.CONTAINER_NAME,
    }
    return {
        "metadata": {
            "labels": {**spec.pod_labels, **names.common_labels(pool_name)},
            "annotations": annotations,
        },
        "spec": {
            "containers": [container(spec, settings, mounts)],
            "volumes": volumes,
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "terminationGracePeriodSeconds": spec.termination_grace_period_seconds,
            # The encoder never calls the API server.
            "automountServiceAccountToken": False,
            # Service links inject <SVC>_PORT variables for every Service in the namespace; a
            # Service named "encoder" would inject ENCODER_PORT=tcp://..., a settings variable.
            "enableServiceLinks": False,
            **_optional_pod_fields(spec),
        },
    }
