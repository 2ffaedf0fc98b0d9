"""What the encoder container is told: its command line and its ``ENCODER_*`` environment.

Which variables are rendered, and from which spec field, is generated from the pod's settings
declaration (``podsettings.py``): a setting that is a spec field (``DIRECT_ENV``) is rendered
from its value here without naming it; only the settings derived from other spec fields
(``DERIVED_ENV``: model path, bind address, port, device, drain timeout, SGLang registration,
the gRPC port)
are computed by hand below. A unit test loads the rendered env with the pod's own
``encoder_pod.settings.load_settings`` and compares every setting with the spec.
"""

from __future__ import annotations

from typing import Any

from encoderpool_operator import names
from encoderpool_operator.podsettings import DERIVED_ENV, DIRECT_ENV, MANAGED_ENV
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


def env_value(value: Any) -> str:
    """A setting's value as the pod parses it back from its env var."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return _num(value)
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


FACE_OBJECTS: dict[str, str] = {"vllm": "vllm_storage"}
"""Spec objects whose settings belong to a face that is off unless the pool turns it on, with the
field that does (spec.vllm's settings only act once spec.vllmStorage turns vLLM's face on). They
are rendered only for a pool that serves the face: the CRD defaults spec.vllm on every pool, so
rendering its values everywhere would change every pool's pod template, and roll every pod, on an
operator upgrade that adds such a face."""


def _renders(spec: PoolSpec, obj: str) -> bool:
    switch = FACE_OBJECTS.get(obj)
    return switch is None or getattr(spec, switch) is not None


def direct_env(spec: PoolSpec) -> dict[str, str]:
    """The settings that are spec fields, from their values (unset ones are left to the pod's default;
    a face's, :data:`FACE_OBJECTS`, only for a pool that serves the face)."""
    values = ((env, getattr(getattr(spec, obj), attr)) for obj, attr, env in DIRECT_ENV if _renders(spec, obj))
    return {env: env_value(value) for env, value in values if value is not None}


def derived_env(spec: PoolSpec) -> dict[str, str]:
    """The settings computed from other spec fields (exactly ``DERIVED_ENV``; registration only when asked)."""
    return {
        "ENCODER_MODEL_PATH": spec.model_path,
        "ENCODER_DEVICE": "cuda" if spec.gpus_per_pod > 0 else "cpu",
        # 0.0.0.0: the kubelet's probes and the Service reach the pod on its pod IP.
        "ENCODER_HOST": "0.0.0.0",
        "ENCODER_PORT": str(spec.port),
        **grpc_env(spec),
        **registration_env(spec),
        "ENCODER_DRAIN_TIMEOUT": _num(spec.drain_timeout_seconds),
        **({"ENCODER_VLLM_STORAGE_PATH": names.VLLM_STORAGE_DIR} if spec.vllm_storage is not None else {}),
    }


def grpc_env(spec: PoolSpec) -> dict[str, str]:
    """ENCODER_GRPC_PORT when the pool serves SGLang's gRPC face (spec.grpc.port), else nothing (off)."""
    return {} if spec.grpc.port is None else {names.GRPC_ENV: str(spec.grpc.port)}


def encoder_settings(spec: PoolSpec) -> dict[str, str]:
    """The ``ENCODER_*`` variables rendered from the spec, in ``MANAGED_ENV`` order."""
    rendered = {**derived_env(spec), **direct_env(spec)}
    unknown = set(rendered) - set(MANAGED_ENV)
    assert not unknown and set(derived_env(spec)) <= set(DERIVED_ENV), f"not declared pod settings: {unknown}"
    return {name: rendered[name] for name in MANAGED_ENV if name in rendered}


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

