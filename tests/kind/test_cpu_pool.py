"""examples/encoderpool-cpu.yaml applied as it is, on kind, in a namespace that enforces the
``restricted`` Pod Security Standard: the operator (the chart's Deployment, the built image)
renders the StatefulSet, PodSecurity admits its pod, the kubelet starts the encoder image's
container (the baked checkpoint, two data-parallel workers) as uid 10001 on a read-only root
filesystem, its own startup and readiness probes make the pod Ready, and the pool reports Ready.
A client pod in the cluster then gets embeddings through the Service's DNS name and through every
URL of status.endpoints (CoreDNS resolves them to the pod). A pool whose model path is wrong is
reported with the reason users need.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from testkit.cluster.api import path_for, wait_for
from testkit.cluster.objects import condition, pod_ready
from tests.e2e.pools import EXAMPLES, Pools, load_example, pool_ready
from tests.kind.incluster import ClientPod

pytestmark = pytest.mark.kind

EXAMPLE = "encoderpool-cpu.yaml"
NAME = load_example(EXAMPLE)["metadata"]["name"]
# Container start and model load by three processes (front + two workers) on a busy 2-core host.
READY_SECONDS = 420.0


def exec_in(pools: Pools, pod: str, *command: str) -> Any:
    return pools.kubectl("exec", pod, "-c", "encoder", "--", *command, check=False)


def test_the_cpu_example_is_ready_through_the_kubelets_probes_and_answers_in_the_cluster(
        restricted: tuple[Pools, ClientPod]) -> None:
    pools, client = restricted
    pools.apply(EXAMPLES / EXAMPLE)
    seen: list[dict[str, Any]] = []
    pool = pools.wait(NAME, pool_ready, READY_SECONDS, "Ready", seen=seen)
    assert any((p.get("status") or {}).get("reason") == "Starting" for p in seen), "it was Starting before Ready"

    [pod] = pools.pods(NAME)
    assert pod_ready(pod)
    status = pod["status"]["containerStatuses"][0]
    assert status["ready"] and status["started"] and status["restartCount"] == 0
    assert status["image"].endswith(load_example(EXAMPLE)["spec"].get("image") or "encoder-pod:0.1.0-cpu")
    assert [e["message"] for e in pools.api.get(path_for("v1", "events", pools.namespace))["items"]
            if e["reason"] == "FailedCreate"] == [], "PodSecurity admitted the StatefulSet's pod"
    # What the kubelet enforces: uid 10001, a read-only root, writable emptyDirs at /tmp and /cache.
    name = pod["metadata"]["name"]
    assert exec_in(pools, name, "id", "-u").stdout.strip() == "10001"
    for path in ("/x", "/opt/encoderpool/x"):
        denied = exec_in(pools, name, "touch", path)
        assert denied.returncode != 0 and "Read-only file system" in denied.stderr, denied.stderr
    assert exec_in(pools, name, "touch", "/tmp/x", "/cache/x").returncode == 0

    service = f"http://{NAME}.{pools.namespace}.svc:30000"
    endpoints = pool["status"]["endpoints"]
    assert endpoints == [f"http://{NAME}-0.{NAME}.{pools.namespace}.svc:30000"]
    answers = client.run("encode.py", service, *endpoints)
    for answer in answers:
        assert answer.get("status") == 200, answer
        assert answer["addresses"] == [pod["status"]["podIP"]], answer  # DNS names the pod itself
        rows, width = answer["shape"]
        assert rows > 0 and width > 0 and answer["dtype"] == "float32"


def test_a_pool_with_a_wrong_model_path_is_reported_model_load_failed(pools: Pools) -> None:
    manifest = copy.deepcopy(load_example(EXAMPLE))
    manifest["metadata"]["name"] = "wrong-path"
    manifest["spec"]["model"] = missing = "/nonexistent/encoderpool/qwen2_vl-tiny"
    manifest["spec"]["parallelism"] = {"tensor": 1, "data": 1}
    pools.apply(manifest)
    seen: list[dict[str, Any]] = []
    pool = pools.wait("wrong-path", lambda p: (p.get("status") or {}).get("reason") == "ModelLoadFailed",
                      READY_SECONDS, "ModelLoadFailed", seen=seen)
    assert not any(pool_ready(p) for p in seen)
    status = pool["status"]
    assert status["readyReplicas"] == 0 and status["endpoints"] == []
    assert missing in status["message"], status["message"]  # the container's last words, via the kubelet
    ready = condition(pool, "Ready")
    assert ready is not None and ready["status"] == "False" and ready["reason"] == "ModelLoadFailed"
    [pod] = pools.pods("wrong-path")
    terminated = (pod["status"]["containerStatuses"][0].get("lastState") or {}).get("terminated") or \
        pod["status"]["containerStatuses"][0]["state"].get("terminated") or {}
    assert terminated.get("exitCode") == 3, pod["status"]["containerStatuses"]
    wait_for(lambda: any(e["reason"] == "ModelLoadFailed" and e["type"] == "Warning" for e in pools.events("wrong-path")),
             30, "a Warning Event ModelLoadFailed on the pool")
