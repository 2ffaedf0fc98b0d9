"""Issue 11, item 4 (and the production example): spec.podTemplate merged onto the generated pods.

examples/encoderpool-production.yaml is applied as it is, on the fake GPU nodes: a hub model with
its cache on a shared claim (a PersistentVolume standing in for the RWX provisioner is created
here), autoscaling, rollout and drain settings, and a podTemplate with topology spread. Then
an override of a field the operator owns is kept out and reported (condition SpecApplied), and
an override the API server refuses is ApplyFailed with the API server's own words.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from testkit.cluster.api import path_for
from testkit.cluster.objects import condition
from tests.e2e.pools import EXAMPLES, Pools, load_example, pool_ready, pool_reason

pytestmark = [pytest.mark.kind, pytest.mark.usefixtures("gpu_nodes")]

EXAMPLE = "encoderpool-production.yaml"
NAME = "qwen2-5-vl"
READY_SECONDS = 90.0


@pytest.fixture
def provided_claim(pools: Pools) -> Iterator[None]:
    """What a ReadWriteMany provisioner would do for the example's claim: a matching volume."""
    claim = next(d for d in load_all(EXAMPLE) if d["kind"] == "PersistentVolumeClaim")
    name = f"{pools.namespace}-hf-cache"
    pools.api.create(path_for("v1", "persistentvolumes"), {
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
        "spec": {"capacity": {"storage": claim["spec"]["resources"]["requests"]["storage"]},
                 "accessModes": claim["spec"]["accessModes"], "storageClassName": claim["spec"]["storageClassName"],
                 "persistentVolumeReclaimPolicy": "Delete", "hostPath": {"path": f"/tmp/{pools.namespace}-hf-cache"},
                 "claimRef": {"namespace": pools.namespace, "name": claim["metadata"]["name"]}}})
    yield
    pools.api.delete(path_for("v1", "persistentvolumes", name=name))


def load_all(name: str) -> list[dict[str, Any]]:
    """Every object of a multi-document example."""
    return [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]


@pytest.mark.usefixtures("provided_claim")
def test_the_production_example_applies_as_it_is(pools: Pools) -> None:
    pools.kubectl("create", "secret", "generic", "hf-token", "--from-literal=token=hf_test")
    pools.apply(EXAMPLES / EXAMPLE)
    # No spec.replicas in the example: the HPA raises the pool to its minReplicas (2).
    pool = pools.wait(NAME, lambda p: pool_ready(p) and p["status"]["readyReplicas"] == 2, READY_SECONDS,
                      "Ready with the HPA's 2 replicas")
    example = next(d for d in load_all(EXAMPLE) if d["kind"] == "EncoderPool")
    spread = example["spec"]["podTemplate"]["spec"]["topologySpreadConstraints"]
    pods = pools.pods(NAME)
    for pod in pods:
        spec = pod["spec"]
        assert [c["topologyKey"] for c in spec["topologySpreadConstraints"]] == [c["topologyKey"] for c in spread]
        assert pod["metadata"]["labels"]["team"] == "multimodal"
        (fetch,) = spec["initContainers"]
        assert fetch["command"] == ["encoder-pod", "fetch-model", example["spec"]["model"]]
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["model-cache"]["persistentVolumeClaim"]["claimName"] == "encoder-hf-cache"
        encoder = spec["containers"][0]
        assert encoder["lifecycle"]["preStop"]["sleep"]["seconds"] == 10
        assert spec["terminationGracePeriodSeconds"] == 10 + 125 + 10
        env = {e["name"]: e.get("value") for e in encoder["env"]}
        assert env["ENCODER_REGISTER_URLS"] == "http://prefill-bootstrap.ml-serving.svc:8998"
        assert env["HF_HUB_OFFLINE"] == "1"
    assert {p["spec"]["nodeName"] for p in pods} == {"kwok-gpu-0", "kwok-gpu-1"}, "spread over both nodes"
    hpa = pools.api.get(path_for("autoscaling/v2", "horizontalpodautoscalers", pools.namespace, NAME))
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 8)
    sts = pools.child("StatefulSet", NAME)
    strategy = sts["spec"]["updateStrategy"]  # type: ignore[index]
    assert strategy["type"] == "RollingUpdate" and strategy["rollingUpdate"]["partition"] == 0
    assert strategy["rollingUpdate"].get("maxUnavailable", 1) == 1  # the API server's default, where it sets one
    applied = condition(pool, "SpecApplied")
    assert applied is not None and applied["status"] == "True"


def test_an_override_of_an_owned_field_is_kept_out_and_reported(pools: Pools) -> None:
    manifest = load_example("encoderpool.yaml")
    manifest["metadata"]["name"] = "owned"
    manifest["spec"].update(replicas=1, parallelism={"tensor": 1, "data": 1}, podTemplate={"spec": {"containers": [
        {"name": "encoder", "command": ["sleep", "infinity"],
         "env": [{"name": "ENCODER_PORT", "value": "1"}, {"name": "EXTRA", "value": "yes"}]},
        {"name": "log-shipper", "image": "fluent/fluent-bit:3"}]}})
    pools.apply(manifest)

    def reported(pool: dict[str, Any]) -> bool:
        applied = condition(pool, "SpecApplied") or {}
        return pool_ready(pool) and applied.get("reason") == "ProtectedFieldOverride"

    pool = pools.wait("owned", reported, READY_SECONDS, "Ready with SpecApplied=False (ProtectedFieldOverride)")
    applied = condition(pool, "SpecApplied")
    assert applied is not None and applied["status"] == "False"
    assert "spec.containers[encoder].command" in applied["message"]
    assert "spec.containers[encoder].env[ENCODER_PORT]" in applied["message"]
    assert pool["status"]["ignoredFields"] == ["spec.podTemplate.spec.containers[encoder].command",
                                               "spec.podTemplate.spec.containers[encoder].env[ENCODER_PORT]"]
    [pod] = pools.pods("owned")
    encoder, shipper = pod["spec"]["containers"]
    assert encoder["command"][:2] == ["encoder-pod", "serve"] and shipper["name"] == "log-shipper"
    env = {e["name"]: e.get("value") for e in encoder["env"]}
    assert env["ENCODER_PORT"] == "30000" and env["EXTRA"] == "yes", "the rest of the override is applied"


def test_an_override_the_api_server_refuses_is_apply_failed_with_its_message(pools: Pools) -> None:
    manifest = load_example("encoderpool.yaml")
    manifest["metadata"]["name"] = "refused"
    manifest["spec"].update(replicas=1, parallelism={"tensor": 1, "data": 1}, podTemplate={"spec": {
        "topologySpreadConstraints": [{"maxSkew": 0, "topologyKey": "kubernetes.io/hostname",
                                       "whenUnsatisfiable": "DoNotSchedule"}]}})
    pools.apply(manifest)
    pool = pools.wait("refused", pool_reason("ApplyFailed"), READY_SECONDS, "ApplyFailed")
    assert "maxSkew" in pool["status"]["message"], pool["status"]["message"]
    assert pools.child("StatefulSet", "refused") is None, "validated by a dry run: nothing was created"
    fixed = {"spec": {"podTemplate": {"spec": {"topologySpreadConstraints": [
        {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule"}]}}}}
    pools.kubectl("patch", "encpool", "refused", "--type=merge", "-p", json.dumps(fixed))
    pools.wait("refused", pool_ready, READY_SECONDS, "Ready once fixed")
