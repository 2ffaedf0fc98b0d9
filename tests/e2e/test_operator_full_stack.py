"""Issue 4, test 10: the whole chain for real, with no GPU: EncoderPool -> StatefulSet -> Pod ->
``encoder-pod serve`` (a host process on the local node, or a container on kind) -> the encode
probe -> Ready -> pool Ready -> an /encode sent to an address from the headless Service's
EndpointSlice returns an embedding. And a pool whose model path is wrong never becomes Ready.

examples/encoderpool-cpu.yaml is applied with, on the local node only: a tiny checkpoint built
here as spec.model (the images bake one in at the example's path) and local-node placement
through spec.nodeSelector/spec.tolerations (the operator copies them to the pods). The pod's
emptyDirs (/tmp, /cache) are directories of the pod on the local node.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.cluster import LOCAL_NODE_NAME, Cluster, local_node_placement
from tests.e2e.cluster.api import wait_for
from tests.e2e.cluster.objects import condition, pod_ready
from tests.e2e.operator_harness import Operator
from tests.e2e.pools import Pools, http_base, load_example, pool_namespace, pool_ready

pytestmark = pytest.mark.e2e

EXAMPLE = "encoderpool-cpu.yaml"
NAME = load_example(EXAMPLE)["metadata"]["name"]
# Model load on a busy 2-core machine (torch imported by the front and two data-parallel workers)
# plus the startup probe's 10 s period; on kind, container start too.
READY_SECONDS = 240.0
PROBE_PATH = "/health"
# A 32x32 PNG (the same as `make run` prints).
PNG_B64 = ("iVBORw0KGgoAAAANSUhEUgAAACAAAAAgCAIAAAD8GO2jAAAAKklEQVR42u3NMQEAAAQAMATRP4pYSvBtBZbTHZ8q"
           "ngkEAoFAIBAIBIIrC+AFAUQz669uAAAAAElFTkSuQmCC")


def is_external(cluster: Any) -> bool:
    return bool(getattr(cluster, "external", False))


@pytest.fixture(scope="module")
def cpu_pool_manifest(k8s_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The CPU example, adapted to where its pods will run (see the module docstring)."""
    manifest = load_example(EXAMPLE)
    if is_external(k8s_cluster):
        return manifest  # the image's baked-in checkpoint, any node
    model = tmp_path_factory.mktemp("e2e-models") / "qwen2_vl-tiny"
    built = subprocess.run([str(Path(sys.executable).parent / "encoder-pod"), "make-tiny-model", "--arch", "qwen2_vl",
                            "--out", str(model)], capture_output=True, text=True, timeout=300,
                           env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert built.returncode == 0, built.stderr
    spec = manifest["spec"]
    spec["model"] = str(model)
    spec.update(local_node_placement())
    return manifest


@dataclasses.dataclass(frozen=True)
class Sample:
    """The pool and its pod at one moment, as a user polling kubectl would see them."""

    reason: str | None
    ready_replicas: int
    container_running: bool
    pod_ready: bool


@dataclasses.dataclass
class ReadyPool:
    """The full-stack pool once Ready, with what was seen on the way."""

    pools: Pools
    pool: dict[str, Any]
    timeline: list[Sample]


def sample(pools: Pools, pool: dict[str, Any]) -> Sample:
    """``pool`` as read once (its readiness was judged on this very read), and its pod read after."""
    pods = pools.pods(NAME)
    state = ((pods[0].get("status") or {}).get("containerStatuses") or [{}])[0].get("state", {}) if pods else {}
    status = pool.get("status") or {}
    return Sample(status.get("reason"), status.get("readyReplicas", 0), "running" in state,
                  bool(pods) and pod_ready(pods[0]))


@pytest.fixture(scope="module")
def cpu_pool(k8s_cluster: Cluster, operator_process: Operator,
             cpu_pool_manifest: dict[str, Any]) -> Iterator[ReadyPool]:
    """The CPU pool applied and polled (every 0.25 s) until Ready."""
    operator_process.check_alive()
    with pool_namespace(k8s_cluster, operator_process, prefix="e2e-fullstack") as pools:
        pools.apply(cpu_pool_manifest)
        timeline: list[Sample] = []
        deadline = time.monotonic() + READY_SECONDS
        # One read per turn decides both "Ready yet?" and the sample: two reads could see the
        # pool turn Ready in between, and record a Ready sample before the loop noticed.
        while not pool_ready(pool := pools.get(NAME)):
            timeline.append(sample(pools, pool))
            assert time.monotonic() < deadline, f"not Ready after {READY_SECONDS:.0f}s\n{pools.diagnose(NAME)}"
            time.sleep(0.25)
        yield ReadyPool(pools, pools.get(NAME), timeline)


def test_cpu_pool_becomes_ready_only_after_the_encode_probe_passes(k8s_cluster: Cluster, cpu_pool: ReadyPool) -> None:
    pools, timeline = cpu_pool.pools, cpu_pool.timeline
    # The encoder process ran, unready, while its model loaded and the probe's real encode had
    # not yet passed, and the pool said Starting with no ready replica all that time.
    loading = [s for s in timeline if s.container_running and not s.pod_ready]
    assert loading, f"never saw the pod running but unready: {timeline[-5:]}"
    # (WaitingForStatefulSet can still show for the moment the StatefulSet controller takes to report.)
    assert all(s.reason in ("Starting", "WaitingForStatefulSet") and s.ready_replicas == 0 for s in loading), set(loading)
    assert loading[-1].reason == "Starting", loading[-1]
    assert not any(s.reason == "Ready" for s in timeline)

    [pod] = pools.pods(NAME)
    assert pod_ready(pod)
    container = pod["spec"]["containers"][0]
    assert container["startupProbe"]["httpGet"]["path"] == PROBE_PATH
    assert container["readinessProbe"]["httpGet"]["path"] == PROBE_PATH
    assert container["resources"].get("limits", {}).get("nvidia.com/gpu") is None  # 0 GPUs
    if not is_external(k8s_cluster):
        assert pod["spec"]["nodeName"] == LOCAL_NODE_NAME  # spec.nodeSelector/tolerations reached the pod
    status = cpu_pool.pool["status"]
    assert (status["readyReplicas"], status["gpusPerPod"], status["readyText"]) == (1, 0, "1/1")
    # The probe that made it Ready passes now: a real encode through the pod's own server.
    with http_base(k8s_cluster, pools.namespace, pod["metadata"]["name"], pod["status"]["podIP"], 30000) as base:
        assert httpx.get(base + PROBE_PATH, timeout=60).status_code == 200


def test_encode_sent_to_an_endpointslice_address_returns_an_embedding(
        k8s_cluster: Cluster, cpu_pool: ReadyPool) -> None:
    node = k8s_cluster.local_node
    if node is not None and not node.pod_ips_routable:
        pytest.skip("local pod IPs are loopback addresses here (no CAP_NET_ADMIN): the API server refuses "
                    "them in EndpointSlices; run as root (as CI does) for routed pod IPs")
    pools = cpu_pool.pools
    [(address, pod, port)] = wait_for(lambda: pools.ready_addresses(NAME), 30, "a ready EndpointSlice address")
    assert address == pools.pods(NAME)[0]["status"]["podIP"]
    body = {"req_id": "e2e-1", "modality": "IMAGE", "mm_items": [f"data:image/png;base64,{PNG_B64}"]}
    with http_base(k8s_cluster, pools.namespace, pod, address, port) as base:
        response = httpx.post(base + "/encode", json=body, timeout=120)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["req_id"] == "e2e-1"
    embedding = answer["embedding"]  # the inline backend answers with the embedding itself
    rows, width = embedding["shape"]
    assert rows > 0 and width > 0 and embedding["dtype"] == "float32"
    assert len(base64.b64decode(embedding["data"])) == math.prod(embedding["shape"]) * 4


def test_pool_with_a_wrong_model_path_never_becomes_ready(pools: Pools, cpu_pool_manifest: dict[str, Any]) -> None:
    manifest = copy.deepcopy(cpu_pool_manifest)
    manifest["metadata"]["name"] = "wrong-path"
    manifest["spec"]["model"] = missing = "/nonexistent/encoderpool/qwen2_vl-tiny"
    pools.apply(manifest)
    seen: list[dict[str, Any]] = []
    failing = {"ModelLoadFailed", "ProbeFailing"}
    pool = pools.wait("wrong-path", lambda p: (p.get("status") or {}).get("reason") in failing,
                      READY_SECONDS, "to report ModelLoadFailed or ProbeFailing", seen=seen)
    assert not any(pool_ready(p) for p in seen)
    status = pool["status"]
    assert status["readyReplicas"] == 0 and status["endpoints"] == []
    ready = condition(pool, "Ready")
    assert ready["status"] == "False" and ready["reason"] == status["reason"]  # type: ignore[index]
    if status["reason"] == "ModelLoadFailed":  # exit code 3; the message quotes the pod's last words
        assert missing in status["message"], status["message"]
    # The Event is posted right after the status is written.
    wait_for(lambda: any(e["reason"] == status["reason"] and e["type"] == "Warning" for e in pools.events("wrong-path")),
             15, f"a Warning Event {status['reason']} on the pool")
