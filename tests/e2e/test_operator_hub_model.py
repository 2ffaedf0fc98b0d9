"""Issue 11, item 5: a model from the hub, for real on the local node (no hub here: the cache volume
is pre-populated, as a pool's shared claim is after its first pod fetched the model).

A tiny qwen2_vl checkpoint is laid out in the Hugging Face cache layout (hub/models--org--name
with blobs, a snapshot and refs/main) on a PersistentVolume, which a claim binds; the pool names
``hf://encoderpool-e2e/qwen2-vl-tiny`` with that claim as its modelSource cache. The init
container ``fetch-model`` (the encoder image's ``encoder-pod fetch-model``) finds it there and
exits 0 offline; the encoder serves it from the cache with HF_HUB_OFFLINE=1 (its HF_HOME, and the
compile caches, on the claim); an /encode through the Service's EndpointSlice answers.

This needs the encoder pod's ``fetch-model`` command and hub-id model paths: until the pod has
them it fails, saying so (tests/e2e/pod_features.py).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.cluster import Cluster, local_node_placement
from tests.e2e.cluster.api import path_for, wait_for
from tests.e2e.load import PNG_B64
from tests.e2e.pod_features import require
from tests.e2e.pools import Pools, load_example, pool_ready

pytestmark = pytest.mark.e2e

REPO_ID = "encoderpool-e2e/qwen2-vl-tiny"
COMMIT = hashlib.sha1(b"encoderpool-e2e tiny qwen2_vl").hexdigest()
READY_SECONDS = 240.0


def populate_hf_cache(root: Path, checkpoint: Path) -> Path:
    """``root`` as HF_HOME holding ``checkpoint`` as REPO_ID at COMMIT (branch main)."""
    repo = root / "hub" / f"models--{REPO_ID.replace('/', '--')}"
    snapshot = repo / "snapshots" / COMMIT
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(COMMIT)
    for path in sorted(checkpoint.iterdir()):
        if not path.is_file():
            continue
        blob = hashlib.sha256(path.read_bytes()).hexdigest()
        (repo / "blobs" / blob).write_bytes(path.read_bytes())
        (snapshot / path.name).symlink_to(Path("../../blobs") / blob)
    return root


@pytest.fixture
def cache_claim(k8s_cluster: Cluster, pools: Pools, tmp_path: Path) -> Iterator[str]:
    """A claim bound to a volume whose directory already holds the model in the HF cache layout."""
    if getattr(k8s_cluster, "external", False):
        pytest.skip("runs the encoder pod as a process of the local node, its cache on a hostPath volume here")
    built = subprocess.run([str(Path(sys.executable).parent / "encoder-pod"), "make-tiny-model", "--arch", "qwen2_vl",
                            "--out", str(tmp_path / "ckpt")], capture_output=True, text=True, timeout=300,
                           env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert built.returncode == 0, built.stderr
    volume_dir = tmp_path / "volume"
    populate_hf_cache(volume_dir / "huggingface", tmp_path / "ckpt")
    volume_dir.chmod(0o777)
    name = f"{pools.namespace}-hf-cache"
    pools.api.create(path_for("v1", "persistentvolumes"), {
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
                 "hostPath": {"path": str(volume_dir)}, "persistentVolumeReclaimPolicy": "Retain"}})
    pools.api.create(path_for("v1", "persistentvolumeclaims", pools.namespace), {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "hf-cache"},
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": name,
                 "resources": {"requests": {"storage": "1Gi"}}}})
    wait_for(lambda: pools.api.get(path_for("v1", "persistentvolumeclaims", pools.namespace, "hf-cache"))
             .get("status", {}).get("phase") == "Bound", 60, "the cache claim to be bound")
    yield "hf-cache"
    pools.api.delete(path_for("v1", "persistentvolumes", name=name))


def hub_pool(claim: str) -> dict[str, Any]:
    manifest = load_example("encoderpool-cpu.yaml")
    manifest["metadata"]["name"] = "hub"
    spec = manifest["spec"]
    spec.update(model=f"hf://{REPO_ID}", parallelism={"tensor": 1, "data": 1}, **local_node_placement())
    spec["modelSource"] = {"cache": {"persistentVolumeClaim": {"claimName": claim}}}
    return manifest


def test_a_hub_model_is_served_from_a_prepopulated_cache_volume(
        k8s_cluster: Cluster, pools: Pools, cache_claim: str) -> None:
    require("fetch-model")
    node = k8s_cluster.local_node
    assert node is not None
    pools.apply(hub_pool(cache_claim))
    pool = pools.wait("hub", pool_ready, READY_SECONDS, "Ready, served from the hub cache")
    [pod] = pools.pods("hub")
    (fetch,) = pod["status"]["initContainerStatuses"]
    assert fetch["name"] == "fetch-model" and fetch["state"]["terminated"]["exitCode"] == 0
    assert pod["spec"]["initContainers"][0]["command"] == ["encoder-pod", "fetch-model", f"hf://{REPO_ID}"]
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["ENCODER_MODEL_PATH"] == REPO_ID and env["HF_HUB_OFFLINE"] == "1"
    assert pool["status"]["readyReplicas"] == 1
    if not node.pod_ips_routable:
        return
    [(address, _, port)] = wait_for(lambda: pools.ready_addresses("hub"), 30, "a ready EndpointSlice address")
    body = {"req_id": "hub-1", "modality": "IMAGE", "mm_items": [f"data:image/png;base64,{PNG_B64}"]}
    response = httpx.post(f"http://{address}:{port}/encode", json=body, timeout=120)
    assert response.status_code == 200, response.text
    assert response.json()["embedding"]["dtype"] == "float32"
