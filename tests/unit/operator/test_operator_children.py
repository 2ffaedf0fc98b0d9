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
from encoderpool_operator.children import desired_children, pod_disruption_budget, service
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
        "batching": {"maxBatchSize": 32, "maxWaitMs": 2.5, "maxQueue": 2048},
        "transfer": {"backend": "zmq_to_scheduler"},
    },
    "custom-gpu-resource": {
        "model": "/m", "replicas": 2, "gpuResourceName": "amd.com/gpu", "parallelism": {"data": 2},
        "image": "registry.example.com/encoder-pod:rocm",
    },
    "hub-model-pvc": {
        "model": "hf://Qwen/Qwen2.5-VL-7B-Instruct@cc59489",
        "replicas": 2,
        "modelSource": {"tokenSecretRef": {"name": "hf-token"},
                        "cache": {"persistentVolumeClaim": {"claimName": "hf-cache"}}},
    },
    "day-two": {
        "model": "/m",
        "replicas": 4,
        "drain": {"preStopSeconds": 10, "timeoutSeconds": 120},
        "rollout": {"maxUnavailable": "50%", "partition": 3, "progressDeadlineSeconds": 900},
        "autoscaling": {"minReplicas": 2, "maxReplicas": 8, "metric": "inflightRequests", "targetAverageValue": "16",
                        "behavior": {"scaleDown": {"stabilizationWindowSeconds": 300}}},
        "sglang": {"registerURLs": ["http://prefill.ml.svc:8998"]},
        "podTemplate": {
            "metadata": {"labels": {"tier": "gold"}},
            "spec": {
                "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                                               "whenUnsatisfiable": "ScheduleAnyway",
                                               "labelSelector": {"matchLabels": {"encoderpool.io/pool": "enc"}}}],
                "containers": [
                    {"name": "encoder", "volumeMounts": [{"name": "extra", "mountPath": "/extra"}],
                     "readinessProbe": {"periodSeconds": 2}},
                    {"name": "log-shipper", "image": "fluent/fluent-bit:3", "args": ["-c", "/etc/fb.conf"]},
                ],
                "volumes": [{"name": "extra", "emptyDir": {}}],
            },
        },
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
    return desired_children(make_pool(CASES[case]), settings).manifests


def of_kind(children: list[dict[str, Any]], kind: str = "StatefulSet") -> dict[str, Any]:
    (child,) = [c for c in children if c["kind"] == kind]
    return child


def statefulset(pool: Pool, settings: OperatorSettings) -> dict[str, Any]:
    return of_kind(desired_children(pool, settings).manifests)


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
        ("cpu-pool", ["StatefulSet", "Service"], 0, None, "cpu", "encoderpool/encoder-pod:0.1.0-cpu"),
        ("gpu-tp2-dp4", ["StatefulSet", "Service", "PodDisruptionBudget"], 8, "nvidia.com/gpu", "cuda",
         "encoderpool/encoder-pod:0.1.0-cuda"),
        ("custom-gpu-resource", ["StatefulSet", "Service", "PodDisruptionBudget"], 2, "amd.com/gpu", "cuda",
         "registry.example.com/encoder-pod:rocm"),
    ],
)
def test_gpus_device_and_image(case: str, kinds: list[str], gpus: int, resource: str | None, device: str, image: str,
                               make_pool: Callable[..., Pool], settings: OperatorSettings) -> None:
    children = rendered(make_pool, settings, case)
    assert [c["kind"] for c in children] == kinds
    container = container_of(of_kind(children))
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["ENCODER_DEVICE"] == device and container["image"] == image
    res = container["resources"]
    if resource is None:
        assert not any("gpu" in k for part in res.values() for k in part)
    else:
        # Extended resources: the request must equal the limit.
        assert res["requests"][resource] == res["limits"][resource] == gpus


def test_tp2_dp4_command_line(make_pool: Callable[..., Pool], settings: OperatorSettings) -> None:
    command = container_of(of_kind(rendered(make_pool, settings, "gpu-tp2-dp4")))["command"]
    assert command == ["encoder-pod", "serve", "--model-path", "/models/qwen2.5-vl-72b", "--host", "0.0.0.0",
                       "--port", "30000", "--dp-size", "4", "--tp-size", "2"]


def test_placement_fields_pass_through(make_pool: Callable[..., Pool], settings: OperatorSettings) -> None:
    spec = CASES["placement"]
    pod = of_kind(rendered(make_pool, settings, "placement"))["spec"]["template"]
    assert pod["spec"]["nodeSelector"] == spec["nodeSelector"]
    assert pod["spec"]["tolerations"] == spec["tolerations"]
    assert pod["spec"]["affinity"] == spec["affinity"]
    assert (pod["spec"]["priorityClassName"], pod["spec"]["runtimeClassName"]) == ("inference", "nvidia")
    assert pod["metadata"]["labels"]["team"] == "vision"
    assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    env = container_of(of_kind(rendered(make_pool, settings, "placement")))["env"]
    assert env[-2:] == spec["env"]
    assert [e["name"] for e in env].count("ENCODER_DTYPE") == 1


def test_unset_placement_is_not_applied(make_pool: Callable[..., Pool], settings: OperatorSettings) -> None:
    """An empty nodeSelector applied by the operator would take the field from anyone else."""
    pod_spec = of_kind(rendered(make_pool, settings, "cpu-pool"))["spec"]["template"]["spec"]
    for key in ("nodeSelector", "tolerations", "affinity", "priorityClassName", "imagePullSecrets"):
        assert key not in pod_spec


def test_pods_pass_the_restricted_pod_security_standard(make_pool: Callable[..., Pool], settings: OperatorSettings) -> None:
    for case in CASES:
        pod_spec = of_kind(rendered(make_pool, settings, case))["spec"]["template"]["spec"]
        assert pod_spec["securityContext"]["runAsNonRoot"] is True
        assert pod_spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        # The operator's own containers; a sidecar added through spec.podTemplate is the user's.
        for container in [*pod_spec["containers"][:1], *pod_spec.get("initContainers", [])]:
            sc = container["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
            assert sc["runAsNonRoot"] is True and sc["readOnlyRootFilesystem"] is True
            assert sc["runAsUser"] != 0
            mounted = {m["mountPath"] for m in container["volumeMounts"]}
            assert {"/tmp", "/cache"} <= mounted, "a read-only root needs writable scratch space"
        allowed = {"emptyDir", "persistentVolumeClaim", "configMap", "secret", "projected", "downwardAPI", "csi",
                   "ephemeral", "image"}
        for volume in pod_spec["volumes"]:
            assert set(volume) - {"name"} <= allowed
        assert pod_spec["automountServiceAccountToken"] is False


def test_probes(make_pool: Callable[..., Pool], settings: OperatorSettings) -> None:
    container = container_of(statefulset(make_pool({"model": "/m", "startupTimeoutSeconds": 905}), settings))
    # Readiness and startup: the pod's cached health (a recent real encode); liveness: the event loop.
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert container["startupProbe"]["httpGet"]["path"] == "/health"
    assert container["livenessProbe"]["httpGet"]["path"] == "/livez"
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
    for child in desired_children(make_pool({"model": "/m", "replicas": 2}, uid="abc"), settings).manifests:
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


def test_rollout_settings_reach_the_update_strategy(make_pool: Callable[..., Pool], settings: OperatorSettings) -> None:
    default = statefulset(make_pool({"model": "/m"}), settings)["spec"]["updateStrategy"]
    # partition 0 is written out: it makes a pod the controller recreates mid-rollout take the new
    # revision (without it the controller goes by a status.currentReplicas that can be stale).
    assert default == {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}
    sts = of_kind(rendered(make_pool, settings, "day-two"))
    assert sts["spec"]["updateStrategy"] == {"type": "RollingUpdate",
                                             "rollingUpdate": {"partition": 3, "maxUnavailable": "50%"}}


def test_rollout_and_autoscaling_changes_do_not_roll_pods(make_pool: Callable[..., Pool]) -> None:
    base = make_pool({"model": "/m"}).spec
    for change in ({"rollout": {"partition": 2}}, {"autoscaling": {"maxReplicas": 3}}, {"followDefaultImage": True},
                   {"rollout": {"maxUnavailable": 2}}):
        assert spec_hash(make_pool({"model": "/m", **change}).spec) == spec_hash(base), change
    assert spec_hash(make_pool({"model": "/m", "drain": {"preStopSeconds": 9}}).spec) != spec_hash(base)
    # A default written out is the same spec as one left out (a new field must not roll pools).
    assert spec_hash(make_pool({"model": "/m", "drain": {"preStopSeconds": 5}}).spec) == spec_hash(base)


def test_drain_wiring(make_pool: Callable[..., Pool], settings: OperatorSettings) -> None:
    pod = statefulset(make_pool({"model": "/m"}), settings)["spec"]["template"]["spec"]
    container = container_of({"spec": {"template": {"spec": pod}}})
    assert container["lifecycle"] == {"preStop": {"sleep": {"seconds": 5}}}
    # Grace covers the preStop wait, the drain (request timeout 180 + 5) and a margin.
    assert pod["terminationGracePeriodSeconds"] == 5 + 185 + 10
    pod = statefulset(make_pool({"model": "/m", "drain": {"preStopSeconds": 0}, "terminationGracePeriodSeconds": 30}),
                      settings)["spec"]["template"]["spec"]
    assert "lifecycle" not in pod["containers"][0] and pod["terminationGracePeriodSeconds"] == 30


def test_the_hpa_scales_the_pool_from_a_pods_metric(make_pool: Callable[..., Pool], settings: OperatorSettings) -> None:
    hpa = of_kind(rendered(make_pool, settings, "day-two"), "HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "encoderpool.io/v1alpha1", "kind": "EncoderPool", "name": "enc"}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 8)
    assert hpa["spec"]["metrics"] == [{"type": "Pods", "pods": {
        "metric": {"name": "encoder_inflight_requests"}, "target": {"type": "AverageValue", "averageValue": "16"}}}]
    assert hpa["spec"]["behavior"] == {"scaleDown": {"stabilizationWindowSeconds": 300}}
    queue = desired_children(make_pool({"model": "/m", "autoscaling": {"maxReplicas": 2}}), settings).of(
        "HorizontalPodAutoscaler")
    assert queue is not None and queue["spec"]["metrics"][0]["pods"]["metric"]["name"] == "encoder_queue_depth"
    assert desired_children(make_pool({"model": "/m"}), settings).of("HorizontalPodAutoscaler") is None


def test_a_hub_model_is_fetched_by_an_init_container_into_the_shared_cache(
        make_pool: Callable[..., Pool], settings: OperatorSettings) -> None:
    pod = of_kind(rendered(make_pool, settings, "hub-model-pvc"))["spec"]["template"]["spec"]
    (fetch,) = pod["initContainers"]
    encoder = pod["containers"][0]
    assert fetch["command"] == ["encoder-pod", "fetch-model", "hf://Qwen/Qwen2.5-VL-7B-Instruct@cc59489"]
    assert fetch["image"] == encoder["image"], "the encoder image fetches its own model"
    env = {e["name"]: e for e in fetch["env"]}
    assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf-token", "key": "token"}}
    assert "HF_TOKEN" not in {e["name"] for e in encoder["env"]}, "the server reads the cache offline"
    assert "nvidia.com/gpu" not in fetch["resources"].get("limits", {}), "fetching needs no GPU"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["model-cache"] == {"name": "model-cache", "persistentVolumeClaim": {"claimName": "hf-cache"}}
    for container in (fetch, encoder):
        assert {"name": "model-cache", "mountPath": "/model-cache"} in container["volumeMounts"]
    assert pod["securityContext"]["fsGroup"] == 10001, "the shared cache is writable by the pod's user"
    empty = statefulset(make_pool({"model": "hf://org/m", "modelSource": {"cache": {"sizeLimit": "50Gi"}}}),
                        settings)["spec"]["template"]["spec"]
    assert {v["name"]: v for v in empty["volumes"]}["model-cache"]["emptyDir"] == {"sizeLimit": "50Gi"}


def test_pod_template_overrides_merge_by_name_and_keep_owned_fields(
        make_pool: Callable[..., Pool], settings: OperatorSettings) -> None:
    desired = desired_children(make_pool(CASES["day-two"]), settings)
    pod = desired.of("StatefulSet")["spec"]["template"]  # type: ignore[index]
    containers = {c["name"]: c for c in pod["spec"]["containers"]}
    assert list(containers) == ["encoder", "log-shipper"], "a sidecar is appended, the encoder stays first"
    encoder = containers["encoder"]
    assert {"name": "extra", "mountPath": "/extra"} in encoder["volumeMounts"]
    assert {"name": "tmp", "mountPath": "/tmp"} in encoder["volumeMounts"], "merged by mountPath, not replaced"
    assert encoder["readinessProbe"]["periodSeconds"] == 2 and encoder["readinessProbe"]["httpGet"]["path"] == "/health"
    assert pod["spec"]["topologySpreadConstraints"][0]["topologyKey"] == "topology.kubernetes.io/zone"
    assert pod["metadata"]["labels"]["tier"] == "gold"
    assert desired.collisions == []


def test_every_example_pool_renders(make_pool: Callable[..., Pool], settings: OperatorSettings, repo: Path) -> None:
    for path in sorted((repo / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == names.KIND:
                desired = desired_children(make_pool(doc["spec"]), settings)
                assert desired.collisions == [], f"{path.name}: an example should not collide with owned fields"
