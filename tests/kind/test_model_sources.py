"""Where a pool's checkpoint comes from, on kind with real volumes:

- spec.modelVolume with a PersistentVolumeClaim (kind's default StorageClass) that a Job filled,
  mounted read-only into the encoder container;
- spec.model hf://org/name with spec.modelSource.cache on a claim that already holds the model in
  the Hugging Face cache layout (as after a first pod downloaded it; no hub is reachable here):
  the init container ``fetch-model`` (the encoder image's ``encoder-pod fetch-model``) finds it and
  exits 0 offline, and the encoder serves it from the cache.

Both answer /encode from a client pod in the cluster.
"""

from __future__ import annotations

import hashlib

import pytest

from tests.e2e.pools import Pools, cpu_pool, pool_ready
from tests.kind.incluster import ClientPod
from tests.kind.volumes import claim, fill, tiny_checkpoints

pytestmark = pytest.mark.kind

READY_SECONDS = 420.0
REPO_ID = "encoderpool-e2e/qwen2-vl-tiny"
COMMIT = hashlib.sha1(b"encoderpool-e2e tiny qwen2_vl").hexdigest()


def encodes(client: ClientPod, pools: Pools, name: str) -> None:
    [answer] = client.run("encode.py", f"http://{name}.{pools.namespace}.svc:30000")
    assert answer.get("status") == 200 and answer["dtype"] == "float32", answer


def test_a_model_on_a_persistent_volume_claim_is_served(pools: Pools, client: ClientPod) -> None:
    tiny_checkpoints(pools, "models", "qwen2_vl-tiny")
    pools.apply(cpu_pool("on-pvc", model="qwen2_vl-tiny", modelVolume={"persistentVolumeClaim": {"claimName": "models"}}))
    pools.wait("on-pvc", pool_ready, READY_SECONDS, "Ready from the claim")
    [pod] = pools.pods("on-pvc")
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mounts = {m["name"]: m for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert volumes["model"]["persistentVolumeClaim"]["claimName"] == "models"
    assert mounts["model"]["readOnly"] is True and mounts["model"]["mountPath"] == "/models"
    assert "/models/qwen2_vl-tiny" in pod["spec"]["containers"][0]["command"]
    # Mounted read-only for real: the kubelet enforces it, not just the manifest.
    refused = pools.kubectl("exec", "on-pvc-0", "-c", "encoder", "--", "touch", "/models/x", check=False)
    assert refused.returncode != 0 and "Read-only file system" in refused.stderr, refused.stderr
    encodes(client, pools, "on-pvc")


def test_a_hub_model_is_served_from_a_prepopulated_cache_volume(pools: Pools, client: ClientPod) -> None:
    claim(pools, "hf-cache")
    fill(pools, "hf-cache", "encoder-pod make-tiny-model --arch qwen2_vl --out /tmp/ckpt; "
                            f"python /scripts/hf_cache.py /tmp/ckpt /data/huggingface {REPO_ID} {COMMIT}; "
                            "chmod -R a+w /data")
    pools.apply(cpu_pool("hub", model=f"hf://{REPO_ID}",
                         modelSource={"cache": {"persistentVolumeClaim": {"claimName": "hf-cache"}}}))
    pool = pools.wait("hub", pool_ready, READY_SECONDS, "Ready, served from the hub cache")
    [pod] = pools.pods("hub")
    (fetch,) = pod["status"]["initContainerStatuses"]
    assert fetch["name"] == "fetch-model" and fetch["state"]["terminated"]["exitCode"] == 0
    assert pod["spec"]["initContainers"][0]["command"] == ["encoder-pod", "fetch-model", f"hf://{REPO_ID}"]
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["ENCODER_MODEL_PATH"] == REPO_ID and env["HF_HUB_OFFLINE"] == "1"
    assert pool["status"]["readyReplicas"] == 1
    encodes(client, pools, "hub")
