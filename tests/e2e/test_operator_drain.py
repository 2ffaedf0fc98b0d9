"""Issue 11, item 1: drains that lose nothing, for real: CPU encoder pods on the local node under
continuous /encode load through the pool's headless Service (tests/e2e/load.py), while

1. a model change rolls both pods (each replaced pod: preStop wait while it leaves the
   EndpointSlice, then SIGTERM: it answers new requests 503 + Retry-After, finishes what it
   holds, exits; its successor loads the new checkpoint), and then
2. the pool is scaled from 2 pods to 1.

Every request must be answered 200, or refused by an already draining pod (503 with Retry-After)
and then answered 200 on a retry to the Service. The numbers are printed.

It needs the encoder pod's drain (SIGTERM handling with ENCODER_DRAIN_TIMEOUT) and GET /livez:
until the pod has them it fails, saying which (tests/e2e/pod_features.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cluster import Cluster, local_node_placement
from tests.e2e.cluster.api import wait_for
from tests.e2e.load import ServiceLoad
from tests.support.server import jpeg_uri
from tests.e2e.pod_features import require, require_livez
from tests.e2e.pools import Pools, load_example, pool_ready

pytestmark = pytest.mark.e2e

NAME = "drains"
READY_SECONDS = 240.0
SETTLE_SECONDS = 3.0  # load keeps running this long after each step


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """Two tiny qwen2_vl checkpoints (different random weights): the model before and after."""
    out = []
    for name in ("before", "after"):
        path = tmp_path_factory.mktemp("drain-models") / name
        built = subprocess.run([str(Path(sys.executable).parent / "encoder-pod"), "make-tiny-model", "--arch",
                                "qwen2_vl", "--out", str(path)], capture_output=True, text=True, timeout=300,
                               env={**os.environ, "HF_HUB_OFFLINE": "1"})
        assert built.returncode == 0, built.stderr
        out.append(str(path))
    return out[0], out[1]


def drain_pool(model: str) -> dict[str, Any]:
    manifest = load_example("encoderpool-cpu.yaml")
    manifest["metadata"]["name"] = NAME
    spec = manifest["spec"]
    spec.update(model=model, replicas=2, parallelism={"tensor": 1, "data": 1}, startupTimeoutSeconds=180,
                **local_node_placement())
    # One request per batch, each of eight 512x512 photos (a few hundred ms on this CPU): with six
    # clients per pod, a pod holds a queue of requests for longer than the preStop wait, so its
    # SIGTERM always finds queued work, which a lossless drain finishes (and a lossy one fails).
    spec["batching"] = {"maxBatchSize": 1, "maxQueue": 256, "requestTimeoutSeconds": 30}
    spec["drain"] = {"preStopSeconds": 1, "timeoutSeconds": 30}
    spec["resources"] = {"requests": {"cpu": "500m", "memory": "1Gi"}}
    return manifest


def ready_on_one_revision(replicas: int) -> Any:
    def check(pool: dict[str, Any]) -> bool:
        status = pool.get("status") or {}
        return (pool_ready(pool) and status.get("readyReplicas") == replicas
                and status.get("updatedReadyReplicas") == replicas and len(status.get("revisions") or []) == 1)
    return check


def test_a_rolling_model_change_and_a_scale_down_under_load_lose_no_request(
        k8s_cluster: Cluster, pools: Pools, checkpoints: tuple[str, str]) -> None:
    if getattr(k8s_cluster, "external", False):
        pytest.skip("runs encoder pods as processes of the local node (and, for its volume, a hostPath PV)")
    require("drain")
    node = k8s_cluster.local_node
    assert node is not None
    if not node.pod_ips_routable:
        pytest.fail("the load goes through the Service's EndpointSlice, which needs routed pod IPs (run as root)",
                    pytrace=False)
    before, after = checkpoints
    pools.apply(drain_pool(before))
    pools.wait(NAME, ready_on_one_revision(2), READY_SECONDS, "Ready with 2 pods")
    [(address, _, port), *_] = wait_for(lambda: pools.ready_addresses(NAME), 30, "ready EndpointSlice addresses")
    require_livez(f"http://{address}:{port}")

    phases: list[str] = []
    with ServiceLoad(pools, NAME, workers=12, items=[jpeg_uri(512, 512, seed=i) for i in range(8)]) as load:
        time.sleep(SETTLE_SECONDS)
        began = time.monotonic()
        old_revision = pools.get(NAME)["status"]["updateRevision"]
        pools.kubectl("patch", "encpool", NAME, "--type=merge", "-p", f'{{"spec":{{"model":"{after}"}}}}')
        pool = pools.wait(NAME, lambda p: ready_on_one_revision(2)(p) and p["status"]["updateRevision"] != old_revision,
                          READY_SECONDS, "rolled to the new model, Ready with 2 pods")
        phases.append(f"rolling update (model change) took {time.monotonic() - began:.1f}s: {load.tally.line()}")
        time.sleep(SETTLE_SECONDS)
        began = time.monotonic()
        pools.kubectl("scale", f"encpool/{NAME}", "--replicas=1")
        pools.wait(NAME, ready_on_one_revision(1), READY_SECONDS, "scaled down to 1 pod")
        wait_for(lambda: len(pools.pods(NAME)) == 1, 120, "the removed pod to be gone")
        phases.append(f"scale-down 2 -> 1 took {time.monotonic() - began:.1f}s")
        time.sleep(SETTLE_SECONDS)
    tally = load.tally
    for pod in pools.pods(NAME):
        assert pod["spec"]["containers"][0]["command"][3] == after, "the pods run the new model"
    print("\nlossless drain under load (12 closed-loop clients through the Service, 8 photos per request):\n  "
          + "\n  ".join(phases) + f"\n  in all: {tally.line()}")
    assert pool["status"]["endpoints"], "the pool kept serving"
    assert tally.ok > 0 and tally.sent > 30, f"the load did not run: {tally.line()}"
    assert tally.lost == 0, f"{tally.line()}\nlost:\n" + "\n".join(tally.lost_details)
    assert tally.retried_ok == tally.refused_draining
