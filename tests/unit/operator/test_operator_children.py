"""The children a pool is turned into: snapshots of whole manifests, and the rules behind them.

Snapshots live in snapshots/<case>.yaml. After an intended change, rewrite them with
``ENCODERPOOL_UPDATE_SNAPSHOTS=1 .venv/bin/pytest tests/unit/operator`` and review the diff.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from encoderpool_operator import names
from encoderpool_operator.children import desired_children, pod_disruption_budget, service, statefulset
from encoderpool_operator.podtemplate import spec_hash
from encoderpool_operator.settings import OperatorSettings
from encoderpool_operator.spec import Pool

pytestmark = pytest.mark.unit

SNAPSHOTS = Path(__file__).resolve().parent / "snapshots"

CASES: dict[str, dict[str, Any]] = {
    "cpu-pool": {"model": "/opt/encoderpool/models/qwen2_vl-tiny", "device": "cpu", "parallelism": {"data": 2}},
    "gpu-tp2-dp4": {
        "model": "qwen2.5-vl-72b",
        "replicas": 3,
        "parallelism": {"tensor": 2, "data": 4},
        "modelVolume": {"persistentVolumeClaim": {"claimName": "models"}},
        "batching": {"maxBatchSize": 32, "maxWaitMs": 2.5, "maxQueue": 2048, "imageProcessorUseGPU": True},
        "transfer": {"backend": "zmq_to_scheduler"},
    },
    "custom-gpu-resource": {
        "model": "/m", "replicas": 2, "gpuResourceName": "amd.com/gpu", "parallelism": {"data": 2},
        "image": "registry.example.com/encoder-pod:rocm",
    },
    "placement": {
        "model": "/m",
        "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                               "labelSelector": {"matchLabels": {"encoderpool.io/pool": "enc"}}}}]}},
        "priorityClassName": "inference", "runtimeClassName": "nvidia", "serviceAccountName": "encoders",
        "imagePullSecrets": [{"name": "regcred"}],
        "podLabels": {"team": "vision"}, "podAnnotations": {"prometheus.io/scrape": "true"},
        "env": [{"name": "ENCODER_DTYPE", "value": "bfloat16"},
                {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}],
    },
}


def rendered(make_pool: Callable[..., Pool], settings: OperatorSettings, case: str) -> list[dict[str, Any]]:
    return desired_children(make_pool(CASES[case]), settings)


def container_of(sts: dict[str, Any]) -> dict[str, Any]:
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    return container


@pytest.mark.parametrize("case", sorted(CASES))
def test_snapshot(case: str, make_pool: Callable[..., Pool], settings: OperatorSettings) -> None:
    text = yaml.safe_dump_all(rendered(make_pool, settings, case), sort_keys=True)
    path = SNAPSHOTS / f"{case}.yaml"
    if os.environ.get("ENCODERPOOL_UPDATE_SNAPSHOTS") == "1":
        path.write_text(text)
    assert path.is_file(), f"no snapshot {path.name}: run with ENCODERPOOL_UPDATE_SNAPSHOTS=1 and review it"
    assert text == path.read_text()


@pytest.mark.parametrize(
    ("case", "kinds", "gpus", "resource", "device", "image"),
    [
        ("cpu-pool", ["Service", "StatefulSet"], 0, None, "cpu", "encoderpool/encoder-pod:0.1.0-cpu"),
        ("gpu-tp2-dp4", ["Service", "StatefulSet", "PodDisruptionBudget"], 8, "nvidia.com/gpu", "cuda",
         "encoderpool/encoder-pod:0.1.0-cuda"),
        ("custom-gpu-resource", ["Service", "StatefulSet", "PodDisruptionBudget"], 2, "amd.com/gpu", "cuda",
         "registry.example.com/encoder-pod:rocm"),
    ],
)
def test_gpus_device_and_image(case: str, kinds: list[str], gpus: int, resource: str | None, device: str, image: str,
                               make_pool: Callable[..., Pool], settings: OperatorSettings) -> None:
    children = rendered(make_pool, settings, case)
    assert [c["kind"] for c in children] == kinds
    container = container_of(children[1])
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["ENCODER_DEVICE"] == device and container["image"] == image
    res = container["resources"]
    if resource is None:
        assert not any("gpu" in k for part in res.values() for k in part)
    else:
        # Extended resources: the request must equal the limit.
        assert res["requests"][resource] == res["limits"][resource] == gpus


def test_tp2_dp4_command_line(make_pool: Callable[..., Pool], settings: OperatorSettings) -> None:
    command = container_of(rendered(make_pool, settings, "gpu-tp2-dp4")[1])["command"]
    assert command == ["encoder-pod", "serve", "--model-path", "/models/qwen2.5-vl-72b", "--host", "0.0.0.0",
                       "--port", "30000", "--dp-size", "4", "--tp-size", "2"]


def test_placement_fields_pass_through(make_pool: Callable[..., Pool], settings: OperatorSettings) -> None:
    spec = CASES["placement"]
    pod = rendered(make_pool, settings, "placement")[1]["spec"]["template"]
    assert pod["spec"]["nodeSelector"] == spec["nodeSelector"]
    assert pod["spec"]["tolerations"] == spec["tolerations"]
    assert pod["spec"]["affinity"] == spec["affinity"]
    assert (pod["spec"]["priorityClassName"], pod["spec"]["runtimeClassName"]) == ("inference", "nvidia")
    assert pod["metadata"]["labels"]["team"] == "vision"
    assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    env = container_of(rendered(make_pool, settings, "placement")[1])["env"]
    assert env[-2:] == spec["env"]
    assert [e["name"] for e in env].count("ENCODER_DTYPE") == 1


def test_unset_placement_is_not_applied(make_pool: Callable[..., Pool], settings: OperatorSettings) -> None:
    """An empty nodeSelector applied by the operator would take the field from anyone else."""
    pod_spec = rendered(make_pool, settings, "cpu-pool")[1]["spec"]["template"]["spec"]
    for key in ("nodeSelector", "tolerations", "affinity", "priorityClassName", "imagePullSecrets"):
        assert key not in pod_spec


def test_pods_pass_the_restricted_pod_security_standard(make_pool: Callable[..., Pool], settings: OperatorSettings) -> None:
    for case in CASES:
        pod_spec = rendered(make_pool, settings, case)[1]["spec"]["template"]["spec"]
        assert pod_spec["securityContext"]["runAsNonRoot"] is True
        assert pod_spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in pod_spec["containers"]:
            sc = container["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
            assert sc["runAsNonRoot"] is True and sc["readOnlyRootFilesystem"] is True
            assert sc["runAsUser"] != 0
            mounted = {m["mountPath"] for m in container["volumeMounts"]}
            assert {"/tmp", "/cache", "/dev/shm"} <= mounted, "a read-only root needs writable scratch space"
        allowed = {"emptyDir", "persistentVolumeClaim", "configMap", "secret", "projected", "downwardAPI", "csi",
                   "ephemeral", "image"}
        for volume in pod_spec["volumes"]:
            assert set(volume) - {"name"} <= allowed
        assert pod_spec["automountServiceAccountToken"] is False


def test_probes(make_pool: Callable[..., Pool], settings: OperatorSettings) -> None:
    container = container_of(statefulset(make_pool({"model": "/m", "startupTimeoutSeconds": 905}), settings))
    assert container["readinessProbe"]["httpGet"]["path"] == "/health_generate"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 905
    assert startup["failureThreshold"] == math.ceil(905 / startup["periodSeconds"])
    live = container["livenessProbe"]
    assert live["periodSeconds"] * live["failureThreshold"] >= 60, "liveness must be generous"


def test_service_is_headless_and_routes_only_to_ready_pods(make_pool: Callable[..., Pool]) -> None:
    pool = make_pool({"model": "/m", "port": 31000})
    svc = service(pool)
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is False
    assert svc["spec"]["ports"][0]["port"] == 31000 and svc["spec"]["ports"][0]["targetPort"] == names.PORT_NAME


def test_selectors_agree(make_pool: Callable[..., Pool], settings: OperatorSettings) -> None:
    pool = make_pool({"model": "/m", "replicas": 2})
    sts, svc, pdb = statefulset(pool, settings), service(pool), pod_disruption_budget(pool)
    assert pdb is not None
    labels = sts["spec"]["template"]["metadata"]["labels"]
    for selector in (sts["spec"]["selector"]["matchLabels"], svc["spec"]["selector"], pdb["spec"]["selector"]["matchLabels"]):
        assert selector.items() <= labels.items()
    assert sts["spec"]["serviceName"] == svc["metadata"]["name"]
    assert labels[names.MANAGED_BY_LABEL] == names.OPERATOR_NAME, "the operator watches pods by this label"


def test_children_are_owned_by_the_pool(make_pool: Callable[..., Pool], settings: OperatorSettings) -> None:
    for child in desired_children(make_pool({"model": "/m", "replicas": 2}, uid="abc"), settings):
        (ref,) = child["metadata"]["ownerReferences"]
        assert ref == {"apiVersion": "encoderpool.io/v1alpha1", "kind": "EncoderPool", "name": "enc", "uid": "abc",
                       "controller": True, "blockOwnerDeletion": True}
        assert child["metadata"]["namespace"] == "ml"


@pytest.mark.parametrize(("replicas", "has_pdb"), [(0, False), (1, False), (2, True), (10, True)])
def test_pdb_only_for_several_pods(replicas: int, has_pdb: bool, make_pool: Callable[..., Pool]) -> None:
    pdb = pod_disruption_budget(make_pool({"model": "/m", "replicas": replicas}))
    assert (pdb is not None) == has_pdb
    if pdb is not None:
        assert pdb["spec"]["maxUnavailable"] == 1


def test_spec_hash_rolls_pods_on_spec_changes_but_not_on_scaling(make_pool: Callable[..., Pool]) -> None:
    base = make_pool({"model": "/m"}).spec
    assert spec_hash(make_pool({"model": "/m", "replicas": 7}).spec) == spec_hash(base)
    assert spec_hash(make_pool({"model": "/m", "batching": {"maxWaitMs": 1}}).spec) != spec_hash(base)
    assert spec_hash(make_pool({"model": "/m", "env": [{"name": "X", "value": "1"}]}).spec) != spec_hash(base)


def test_model_volume_is_read_only(make_pool: Callable[..., Pool], settings: OperatorSettings) -> None:
    sts = statefulset(make_pool(CASES["gpu-tp2-dp4"]), settings)
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    assert volumes["model"]["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    mounts = {m["name"]: m for m in container_of(sts)["volumeMounts"]}
    assert mounts["model"] == {"name": "model", "mountPath": "/models", "readOnly": True}


def test_default_images_come_from_settings(make_pool: Callable[..., Pool]) -> None:
    settings = OperatorSettings.model_validate({"default_image": "r/gpu:1", "default_cpu_image": "r/cpu:1"})
    assert container_of(statefulset(make_pool({"model": "/m"}), settings))["image"] == "r/gpu:1"
    assert container_of(statefulset(make_pool({"model": "/m", "device": "cpu"}), settings))["image"] == "r/cpu:1"
