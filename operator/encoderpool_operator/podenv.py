"""What the encoder container is told: its command line and its ``ENCODER_*`` environment.

The env is the contract with ``encoder_pod.settings.EncoderSettings``: a unit test loads the
rendered env with ``encoder_pod.settings.load_settings`` and compares it field by field, so a
renamed setting breaks a test instead of being silently ignored by the pod.
"""

from __future__ import annotations

from typing import Any

from encoderpool_operator import names
from encoderpool_operator.spec import PoolSpec

# Caches live on an emptyDir because the root filesystem is read-only (restricted pods).
CACHE_DIR = "/cache"
CACHE_ENV = {
    "HOME": CACHE_DIR,
    "XDG_CACHE_HOME": CACHE_DIR,
    "HF_HOME": f"{CACHE_DIR}/huggingface",
    "TORCHINDUCTOR_CACHE_DIR": f"{CACHE_DIR}/torchinductor",
    "TRITON_CACHE_DIR": f"{CACHE_DIR}/triton",
}
# A hub model: the HF cache and the compile caches go on the model-cache volume (a PVC shared by
# the pool when given), so a restarted or added pod starts from what the others already fetched
# and compiled. The encoder reads the cache offline: only the init container downloads.
HUB_CACHE_ENV = {
    "HF_HOME": f"{names.MODEL_CACHE_DIR}/huggingface",
    "TORCHINDUCTOR_CACHE_DIR": f"{names.MODEL_CACHE_DIR}/torchinductor",
    "TRITON_CACHE_DIR": f"{names.MODEL_CACHE_DIR}/triton",
}


def _num(value: float | int) -> str:
    """A number as the pod parses it back: 180.0 -> '180', 0.5 -> '0.5'."""
    as_float = float(value)
    return str(int(as_float)) if as_float.is_integer() else repr(as_float)


def encoder_settings(spec: PoolSpec) -> dict[str, str]:
    """The ``ENCODER_*`` variables rendered from the spec (exactly ``names.MANAGED_ENV``)."""
    b, p = spec.batching, spec.parallelism
    return {
        "ENCODER_MODEL_PATH": spec.model_path,
        # 0.0.0.0: the kubelet's probes and the Service reach the pod on its pod IP.
        "ENCODER_HOST": "0.0.0.0",
        "ENCODER_PORT": str(spec.port),
        "ENCODER_DEVICE": "cuda" if spec.gpus_per_pod > 0 else "cpu",
        "ENCODER_DP_SIZE": str(p.data),
        "ENCODER_TP_SIZE": str(p.tensor),
        "ENCODER_MAX_BATCH_SIZE": str(b.max_batch_size),
        "ENCODER_MAX_WAIT_MS": _num(b.max_wait_ms),
        "ENCODER_MAX_BATCH_TOKENS": str(b.max_batch_tokens),
        "ENCODER_REQ_TIMEOUT": _num(b.request_timeout_seconds),
        "ENCODER_MAX_QUEUE": str(b.max_queue),
        "ENCODER_DP_WORKER_MAX_INFLIGHT": str(b.dp_worker_max_inflight),
        "ENCODER_MM_LOAD_WORKERS": str(b.mm_load_workers),
        "ENCODER_IMAGE_PROCESSOR_USE_GPU": "true" if b.image_processor_use_gpu else "false",
        "ENCODER_TRANSFER_BACKEND": spec.transfer.backend,
        "ENCODER_SEND_TIMEOUT": _num(spec.transfer.send_timeout_seconds),
        "ENCODER_DRAIN_TIMEOUT": _num(spec.drain_timeout_seconds),
        **registration_env(spec),
    }


def registration_env(spec: PoolSpec) -> dict[str, str]:
    """ENCODER_REGISTER_URLS and ENCODER_ADVERTISE_URL when the pool registers with SGLang, else nothing.

    The advertised URL is the pod's own IP (downward API, expanded by the kubelet from $(POD_IP),
    which container_env defines first), so a prefill server reaches exactly this pod.
    """
    if not spec.sglang.register_urls:
        return {}
    register_urls, advertise_url = names.REGISTRATION_ENV
    return {
        register_urls: ",".join(spec.sglang.register_urls),
        advertise_url: f"http://$({names.POD_IP_ENV}):{spec.port}",
    }


def cache_env(spec: PoolSpec) -> dict[str, str]:
    """Where the pod keeps caches: /cache, with the HF and compile caches on the model cache for hub models."""
    if spec.hub_model is None:
        return dict(CACHE_ENV)
    return {**CACHE_ENV, **HUB_CACHE_ENV, "HF_HUB_OFFLINE": "1"}


def pod_ip_env() -> dict[str, Any]:
    """POD_IP from the downward API (what ENCODER_ADVERTISE_URL expands)."""
    return {"name": names.POD_IP_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}


def user_env(spec: PoolSpec) -> list[dict[str, Any]]:
    """spec.env as core/v1 EnvVars."""
    env: list[dict[str, Any]] = []
    for var in spec.env:
        entry: dict[str, Any] = {"name": var.name}
        if var.value_from is not None:
            entry["valueFrom"] = var.value_from
        else:
            entry["value"] = var.value or ""
        env.append(entry)
    return env


def container_env(spec: PoolSpec) -> list[dict[str, Any]]:
    """The container's env list: POD_IP, encoder settings, cache dirs, then spec.env.

    spec.env may override a cache directory (it wins by name) but never an encoder setting
    (refused by the CRD and spec.py). Names are unique: server-side apply keys env by name and
    refuses duplicates.
    """
    user = {e.name for e in spec.env}
    rendered = {**encoder_settings(spec), **cache_env(spec)}
    env: list[dict[str, Any]] = [pod_ip_env()] if names.POD_IP_ENV not in user else []
    env += [{"name": k, "value": v} for k, v in rendered.items() if k not in user]
    return env + user_env(spec)


def fetch_env(spec: PoolSpec) -> list[dict[str, Any]]:
    """The fetch-model init container's env: the HF cache on the model cache, the token from its Secret."""
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in {**CACHE_ENV, **HUB_CACHE_ENV}.items()]
    ref = spec.model_source.token_secret_ref if spec.model_source else None
    if ref is not None:
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    return env


def fetch_command(spec: PoolSpec) -> list[str]:
    """``encoder-pod fetch-model hf://org/name[@revision]`` (exits at once when the cache holds it)."""
    hub = spec.hub_model
    assert hub is not None, "only hub models are fetched"
    return ["encoder-pod", "fetch-model", hub.url]


def container_command(spec: PoolSpec) -> list[str]:
    """``encoder-pod serve`` with the model and parallel sizes as flags (they mirror the env)."""
    return [
        "encoder-pod",
        "serve",
        "--model-path",
        spec.model_path,
        "--host",
        "0.0.0.0",
        "--port",
        str(spec.port),
        "--dp-size",
        str(spec.parallelism.data),
        "--tp-size",
        str(spec.parallelism.tensor),
    ]

