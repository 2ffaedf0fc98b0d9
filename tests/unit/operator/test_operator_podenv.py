"""The env and command the operator renders are exactly what ``encoder-pod serve`` reads.

The rendered env goes through ``encoder_pod.settings.load_settings`` (the pod's own parser) and
every setting is compared with the spec; the command's flags go through the pod's own argparse
flags. A renamed setting on either side fails here instead of being ignored by the pod.
"""

from __future__ import annotations

import argparse
from typing import Any, Callable

import pytest

from encoder_pod.settings import RELATIONS, add_settings_arguments, all_settings, load_settings
from encoderpool_operator import names
from encoderpool_operator.podenv import container_command, container_env, derived_env, encoder_settings
from encoderpool_operator.podsettings import DERIVED_ENV, DIRECT_ENV, MANAGED_ENV
from encoderpool_operator.spec import Pool, PoolSpec

pytestmark = pytest.mark.unit

SPECS = {
    "defaults": {"model": "/opt/m"},
    "cpu": {"model": "/opt/m", "device": "cpu", "parallelism": {"data": 3}, "port": 31000},
    "gpu-tuned": {
        "model": "qwen", "modelVolume": {"persistentVolumeClaim": {"claimName": "c"}, "mountPath": "/w"},
        "parallelism": {"tensor": 2, "data": 4},
        "batching": {"maxBatchSize": 64, "maxWaitMs": 2.5, "maxBatchTokens": 123456, "requestTimeoutSeconds": 30.5,
                     "maxQueue": 4096, "dpWorkerMaxInflight": 7, "mmLoadWorkers": 16},
        "transfer": {"backend": "zmq_to_tokenizer", "sendTimeoutSeconds": 12},
    },
    "scheduler-transfer": {"model": "/opt/m", "transfer": {"backend": "zmq_to_scheduler"}},
    "registering": {"model": "/opt/m", "drain": {"timeoutSeconds": 40}, "sglang": {"registerURLs": ["http://p:8998"]}},
}
BY_ENV = {setting.env: name for name, setting in all_settings().items()}


def expected_fields(spec: PoolSpec) -> dict[str, Any]:
    """What each pod setting the operator renders must be for this spec."""
    # spec.vllm's settings belong to vLLM's face: rendered only for a pool that turns it on (spec.vllmStorage).
    direct = {BY_ENV[env]: getattr(getattr(spec, obj), attr) for obj, attr, env in DIRECT_ENV
              if obj != "vllm" or spec.vllm_storage is not None}
    direct = {name: value for name, value in direct.items() if value is not None}  # unset: the pod's default
    derived = {
        "model_path": spec.model_path,
        "host": "0.0.0.0",
        "port": spec.port,
        "device": "cuda" if spec.gpus_per_pod else "cpu",
        "drain_timeout": spec.drain_timeout_seconds,
    }
    if spec.sglang.register_urls:
        derived |= {"register_urls": spec.sglang.register_urls, "advertise_url": f"http://$(POD_IP):{spec.port}"}
    return direct | derived


@pytest.mark.parametrize("case", sorted(SPECS))
def test_rendered_env_loads_into_the_pod_settings(case: str, make_pool: Callable[..., Pool]) -> None:
    spec = make_pool(SPECS[case]).spec
    env = {e["name"]: e["value"] for e in container_env(spec) if "value" in e}
    loaded = load_settings(env=env).flat()
    expected = expected_fields(spec)
    assert {BY_ENV[name] for name in encoder_settings(spec)} == set(expected), "every rendered setting is checked"
    for field, value in expected.items():
        got = loaded[field]
        got = got.value if hasattr(got, "value") else got  # enums compare by value
        assert got == value, f"{field}: pod reads {got!r}, spec says {value!r}"


def away_from_default(node: dict[str, Any]) -> Any:
    """A valid value of a CRD field that is not its default (its maximum, another choice, the other boolean)."""
    if "enum" in node:
        return next(choice for choice in reversed(node["enum"]) if choice != node.get("default"))
    if node["type"] == "boolean":
        return not node.get("default", False)
    if node["type"] in ("integer", "number"):
        return node["maximum"] if node.get("default") != node["maximum"] else node["minimum"] + 1
    return "/x" if node["type"] == "string" else ["x"]


def test_every_direct_setting_set_away_from_its_default_reaches_the_pod(openapi: dict[str, Any]) -> None:
    """Each setting that is a spec field, set to a non-default value, is what the pod reads (no case list to keep up)."""
    spec_props = openapi["properties"]["spec"]["properties"]
    # A CPU pool (no GPUs-per-pod bound on the parallelism) that serves vLLM's face (its settings render only then).
    raw: dict[str, Any] = {"model": "/m", "device": "cpu", "vllmStorage": {}}
    for obj, _, env in DIRECT_ENV:
        for key, node in spec_props[obj]["properties"].items():
            if f"({env})" in node["description"]:
                raw.setdefault(obj, {})[key] = away_from_default(node)
    for rule in RELATIONS:  # keep related settings valid: the lower one no higher than the other
        low = next(((o, k) for o, keys in raw.items() if isinstance(keys, dict) for k in keys
                    if f"({all_settings()[rule.low].env})" in spec_props[o]["properties"][k]["description"]), None)
        high = next(((o, k) for o, keys in raw.items() if isinstance(keys, dict) for k in keys
                     if f"({all_settings()[rule.high].env})" in spec_props[o]["properties"][k]["description"]), None)
        if low and high:
            raw[low[0]][low[1]] = min(raw[low[0]][low[1]], raw[high[0]][high[1]])
    assert {env for _, _, env in DIRECT_ENV} <= {
        all_settings()[name].env for name in expected_fields(PoolSpec.model_validate(raw))}, "every direct setting was set"
    spec = PoolSpec.model_validate(raw)
    loaded = load_settings(env=encoder_settings(spec)).flat()
    for obj, attr, env in DIRECT_ENV:
        got, want = loaded[BY_ENV[env]], getattr(getattr(spec, obj), attr)
        assert (got.value if hasattr(got, "value") else got) == want, env
        assert want != all_settings()[BY_ENV[env]].info.get_default(call_default_factory=True), f"{env} left at its default"


@pytest.mark.parametrize("case", sorted(SPECS))
def test_command_flags_mean_the_same_as_the_env(case: str, make_pool: Callable[..., Pool]) -> None:
    spec = make_pool(SPECS[case]).spec
    command = container_command(spec)
    assert command[:2] == ["encoder-pod", "serve"]
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser)
    flags = vars(parser.parse_args(command[2:]))
    env = {e["name"]: e["value"] for e in container_env(spec) if "value" in e}
    from_flags = load_settings(cli=flags, env={})
    from_env = load_settings(env=env)
    for field in ("model_path", "host", "port", "dp_size", "tp_size"):
        assert from_flags.flat()[field] == from_env.flat()[field]


def test_the_derived_settings_are_the_declared_ones() -> None:
    """podenv computes exactly the settings the pod's declaration marks derived_from (registration, vLLM storage and gRPC only when asked)."""
    registering = PoolSpec.model_validate({"model": "/m", "sglang": {"registerURLs": ["http://p:8998"]}, "vllmStorage": {}, "grpc": {"port": 50051}})
    assert tuple(derived_env(registering)) == DERIVED_ENV
    plain = tuple(derived_env(PoolSpec(model="/m")))
    assert plain == tuple(v for v in DERIVED_ENV if v not in (*names.REGISTRATION_ENV, "ENCODER_VLLM_STORAGE_PATH", names.GRPC_ENV))


def test_rendered_names_are_the_managed_list() -> None:
    """Every managed name is rendered, in the declared order; the registration pair only when the pool
    registers, the gRPC port only when it has one."""
    plain_spec = PoolSpec(model="/m")
    unset = {env for obj, attr, env in DIRECT_ENV if getattr(getattr(plain_spec, obj), attr) is None}
    plain = tuple(encoder_settings(plain_spec))
    assert plain == tuple(v for v in MANAGED_ENV if v not in (*names.REGISTRATION_ENV, names.GRPC_ENV) and not v.startswith("ENCODER_VLLM_")
                          and v not in unset)
    registering = PoolSpec.model_validate({"model": "/m", "sglang": {"registerURLs": ["http://p:8998"]}, "vllmStorage": {}, "grpc": {"port": 50051}})
    assert tuple(encoder_settings(registering)) == tuple(v for v in MANAGED_ENV if v not in unset)


def test_registration_advertises_the_pod_ip_from_the_downward_api(make_pool: Callable[..., Pool]) -> None:
    spec = make_pool({"model": "/m", "port": 31000,
                      "sglang": {"registerURLs": ["http://prefill-0:8998", "https://prefill-1:8998/x"]}}).spec
    env = container_env(spec)
    by_name = {e["name"]: e for e in env}
    assert by_name["ENCODER_REGISTER_URLS"]["value"] == "http://prefill-0:8998,https://prefill-1:8998/x"
    assert by_name["ENCODER_ADVERTISE_URL"]["value"] == "http://$(POD_IP):31000"
    # $(POD_IP) expands only if POD_IP is defined earlier in the list (kubelet rule).
    assert env[0] == {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}


def test_drain_timeout_defaults_from_the_request_timeout(make_pool: Callable[..., Pool]) -> None:
    spec = make_pool({"model": "/m", "batching": {"requestTimeoutSeconds": 30}}).spec
    assert encoder_settings(spec)["ENCODER_DRAIN_TIMEOUT"] == "35"
    spec = make_pool({"model": "/m", "drain": {"timeoutSeconds": 90}}).spec
    assert encoder_settings(spec)["ENCODER_DRAIN_TIMEOUT"] == "90"


def test_a_hub_model_is_served_offline_from_the_model_cache(make_pool: Callable[..., Pool]) -> None:
    spec = make_pool({"model": "hf://Qwen/Qwen2-VL-2B-Instruct@abc123"}).spec
    env = {e["name"]: e.get("value") for e in container_env(spec)}
    assert env["ENCODER_MODEL_PATH"] == "Qwen/Qwen2-VL-2B-Instruct@abc123"
    assert env["HF_HOME"] == "/model-cache/huggingface" and env["HF_HUB_OFFLINE"] == "1"
    assert env["TORCHINDUCTOR_CACHE_DIR"].startswith("/model-cache/")
    assert env["TRITON_CACHE_DIR"].startswith("/model-cache/")
    assert container_command(spec)[2:4] == ["--model-path", "Qwen/Qwen2-VL-2B-Instruct@abc123"]


def test_spec_env_overrides_cache_dirs_but_keeps_unique_names(make_pool: Callable[..., Pool]) -> None:
    spec = make_pool({"model": "/m", "env": [{"name": "HF_HOME", "value": "/data/hf"},
                                             {"name": "ENCODER_DTYPE", "value": "float16"}]}).spec
    env = container_env(spec)
    listed = [e["name"] for e in env]
    assert len(listed) == len(set(listed)), "server-side apply refuses duplicate env names"
    values = {e["name"]: e.get("value") for e in env}
    assert values["HF_HOME"] == "/data/hf" and values["ENCODER_DTYPE"] == "float16"
    assert load_settings(env={k: v for k, v in values.items() if v is not None}).model.dtype == "float16"


def test_value_from_is_passed_through(make_pool: Callable[..., Pool]) -> None:
    ref = {"secretKeyRef": {"name": "hf", "key": "token"}}
    spec = make_pool({"model": "/m", "env": [{"name": "HF_TOKEN", "valueFrom": ref}]}).spec
    assert container_env(spec)[-1] == {"name": "HF_TOKEN", "valueFrom": ref}



def test_a_vllm_pool_renders_the_face_settings_the_pod_reads(make_pool: Callable[..., Pool]) -> None:
    """spec.vllm and spec.vllmStorage become the pod's vLLM settings (parsed back by the pod's own loader) and the /vllm-ec volume."""
    from encoderpool_operator.podparts import pod_security_context, volumes_and_mounts

    spec = make_pool({"model": "hf://Qwen/Qwen2.5-VL-7B-Instruct", "vllmStorage": {"claimName": "ec-shared"},
                      "vllm": {"modelID": "Qwen/Qwen2.5-VL-7B-Instruct", "hasherAlgorithm": "sha256", "dtype": "bfloat16",
                               "storageMaxMB": 2048, "storageTTLSeconds": 90}}).spec
    settings = load_settings(env=encoder_settings(spec)).vllm
    assert (settings.vllm_storage_path, settings.vllm_model_id, settings.vllm_mm_hasher_algorithm, settings.vllm_dtype,
            settings.vllm_storage_max_mb, settings.vllm_storage_ttl) == ("/vllm-ec", "Qwen/Qwen2.5-VL-7B-Instruct", "sha256",
                                                                          "bfloat16", 2048, 90.0)
    volumes, mounts = volumes_and_mounts(spec)
    assert {"name": "vllm-ec", "persistentVolumeClaim": {"claimName": "ec-shared"}} in volumes
    assert {"name": "vllm-ec", "mountPath": "/vllm-ec"} in mounts
    # The pod's user can write to a fresh claim, whose root belongs to root.
    assert pod_security_context(spec)["fsGroup"] == 10001
    own = make_pool({"model": "/m", "vllmStorage": {}}).spec
    assert {"name": "vllm-ec", "emptyDir": {}} in volumes_and_mounts(own)[0]
    assert "fsGroup" not in pod_security_context(own), "an emptyDir is the pod's own"
    assert load_settings(env=encoder_settings(own)).vllm.vllm_storage_path == "/vllm-ec"
    plain = make_pool({"model": "/m"}).spec
    assert "vllm-ec" not in str(volumes_and_mounts(plain)) and load_settings(env=encoder_settings(plain)).vllm.vllm_storage_path is None


def test_only_a_pool_that_serves_vllm_renders_the_vllm_settings(make_pool: Callable[..., Pool]) -> None:
    """The CRD defaults spec.vllm on every pool; its ENCODER_VLLM_* are rendered only with spec.vllmStorage (no rollout on upgrade)."""
    plain = encoder_settings(make_pool({"model": "/m", "vllm": {"modelID": "m"}}).spec)
    served = encoder_settings(make_pool({"model": "/m", "vllmStorage": {}}).spec)
    assert not [k for k in plain if k.startswith("ENCODER_VLLM_")]
    assert {"ENCODER_VLLM_STORAGE_PATH", "ENCODER_VLLM_MODEL_ID", "ENCODER_VLLM_MM_HASHER_ALGORITHM", "ENCODER_VLLM_DTYPE",
            "ENCODER_VLLM_STORAGE_MAX_MB", "ENCODER_VLLM_STORAGE_TTL"} <= set(served)
