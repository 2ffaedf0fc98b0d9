"""A pool as vLLM's EPD encoder instance (spec.vllmStorage on a claim), on kind, in a namespace that
enforces the ``restricted`` Pod Security Standard, and what a vLLM consumer of the claim reads:

- a ReadWriteOnce claim of kind's default StorageClass (one node: the pool's pod and the consumer
  pod both mount it); a root Job gives its root to the pods' uid before the namespace is locked
  down, as an admin readies a shared volume (kind's hostPath volumes are root's directories, and
  the restricted standard admits no root pod);
- the operator renders ENCODER_VLLM_STORAGE_PATH and the claim mounted at that path (read from the
  API), and the pool becomes Ready through the kubelet's probes;
- a client pod sends /v1/chat/completions as vLLM's disagg_epd_proxy sends an encoder instance
  (only the media parts, ``stream: false``; one image with a uuid, one without) through the
  Service's DNS name: 200 and ec_transfer_params per item;
- a consumer pod mounting the same claim read-only, as a prefill instance's ECExampleConnector with
  its shared_storage_path there (another uid, another mount path), finds
  ``<path>/<identifier>/encoder_cache.safetensors`` for the uuid verbatim and for the identifier
  the answer reports for the other image, and loads each with safetensors: one tensor ``ec_cache``
  of [the rows the pod's /encode gives for that image, the tiny model's hidden size], /encode's values.
"""

from __future__ import annotations

import base64
import json
import re
from typing import Any

import numpy as np
import pytest

from testkit.cluster.api import path_for
from testkit.cluster.objects import pod_ready
from tests.e2e.pools import Pools, cpu_pool, pool_ready
from tests.kind.incluster import (MOUNT, RESTRICTED, UID, ClientPod, refuses_a_bare_pod, run_to_completion,
                                  script_pod)
from tests.kind.volumes import claim, fill

pytestmark = pytest.mark.kind

NAME = "vllm-encoder"
CLAIM = "ec-shared"
CONSUMER_PATH = "/shared/ec"  # the consumers' shared_storage_path (docs/vllm.md), not the pods' mount path
CONSUMER_UID = UID + 1  # a vLLM pod is not the encoder's uid: the files must be readable by others
FILE_NAME = "encoder_cache.safetensors"
READY_SECONDS = 420.0
MERGE_UNIT = 4  # qwen2_vl merges 2x2 patches of image_grid_thw into one row


def encoder_container(spec: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in spec["containers"] if c["name"] == "encoder")


def storage_mount(spec: dict[str, Any]) -> tuple[str | None, dict[str, Any] | None, dict[str, Any] | None]:
    """(ENCODER_VLLM_STORAGE_PATH, the volume from the claim, its mount in the encoder) of a pod spec."""
    container = encoder_container(spec)
    path = next((e.get("value") for e in container.get("env") or [] if e["name"] == "ENCODER_VLLM_STORAGE_PATH"), None)
    volume = next((v for v in spec.get("volumes") or []
                   if (v.get("persistentVolumeClaim") or {}).get("claimName") == CLAIM), None)
    mount = next((m for m in container.get("volumeMounts") or [] if volume and m["name"] == volume["name"]), None)
    return path, volume, mount


def floats(data: str, shape: list[int]) -> np.ndarray:
    return np.frombuffer(base64.b64decode(data), dtype="<f4").reshape(shape)


def check_answer(answer: dict[str, Any], hidden: int) -> dict[str, dict[str, Any]]:
    """tests/kind/scripts/vllm_chat.py's output checked: the chat answer is 200 with one
    ec_transfer_params entry per item (the uuid verbatim, a digest for the other) and the /encode
    rows agree with the reported grids. Per identifier (the uuid's first), /encode's embedding."""
    brief = {k: v for k, v in answer.items() if k != "encode"}
    assert answer.get("chat_status") == 200, brief
    chat = answer["chat"]
    assert chat["object"] == "chat.completion" and chat["choices"][0]["message"]["content"] == "", brief
    params = chat["ec_transfer_params"]
    uuid = answer["uuid"]
    assert len(params) == 2 and uuid in params, params
    [other] = [identifier for identifier in params if identifier != uuid]
    assert re.fullmatch(r"[0-9a-f]{64}", other), other  # vLLM's mm_hash (blake3) of the image and the model id
    assert params[uuid]["item_indices"] == [0] and params[other]["item_indices"] == [1], params
    assert all(entry["modality"] == "image" for entry in params.values()), params
    direct = answer["encode"]
    assert [d["status"] for d in direct] == [200, 200], [d.get("body") for d in direct]
    expected = {uuid: direct[0], other: direct[1]}
    for identifier, encoded in expected.items():
        rows, width = encoded["shape"]
        t, h, w = params[identifier]["metadata"]["image_grid_thw"]
        assert t * h * w == rows * MERGE_UNIT and width == hidden and encoded["dtype"] == "float32", \
            (identifier, encoded["shape"], params[identifier], hidden)
    assert direct[0]["shape"][0] != direct[1]["shape"][0], "two sizes: a file under the wrong name would show"
    return expected


def check_read(read: dict[str, Any], expected: dict[str, dict[str, Any]], root: str) -> None:
    """tests/kind/scripts/ec_consumer.py's output checked: every identifier's file is where vLLM's
    connector looks under ``root``, holds one float32 tensor ``ec_cache`` of /encode's shape and values."""
    assert set(expected) <= set(read["listing"]), read["listing"]
    assert [found["identifier"] for found in read["items"]] == list(expected)
    for found in read["items"]:
        identifier = found["identifier"]
        encoded = expected[identifier]
        assert found["exists"] and found["path"] == f"{root}/{identifier}/{FILE_NAME}", found
        assert found["names"] == ["ec_cache"] and found["dtype"] == "float32", {k: found.get(k) for k in ("names", "dtype")}
        assert found["shape"] == encoded["shape"], (identifier, found["shape"], encoded["shape"])
        np.testing.assert_allclose(floats(found["data"], found["shape"]), floats(encoded["data"], encoded["shape"]),
                                   rtol=1e-4, atol=1e-5)


def test_a_vllm_pool_stores_what_a_consumer_of_its_claim_loads(pools: Pools) -> None:
    claim(pools, CLAIM)
    fill(pools, CLAIM, f"chown {UID}:{UID} /data")
    pools.api.patch(path_for("v1", "namespaces", name=pools.namespace), {"metadata": {"labels": RESTRICTED}})
    refuses_a_bare_pod(pools)

    manifest = cpu_pool(NAME, vllmStorage={"claimName": CLAIM})
    with ClientPod(pools) as client:
        pools.apply(manifest)
        seen: list[dict[str, Any]] = []
        pools.wait(NAME, pool_ready, READY_SECONDS, "Ready, serving vLLM's face", seen=seen)
        assert any((p.get("status") or {}).get("reason") == "Starting" for p in seen), "it was Starting before Ready"

        # What the operator rendered, and what the kubelet runs: the claim mounted where the pods store.
        sts = pools.child("StatefulSet", NAME)
        assert sts is not None
        [pod] = pools.pods(NAME)
        for spec in (sts["spec"]["template"]["spec"], pod["spec"]):
            path, volume, mount = storage_mount(spec)
            assert path == "/vllm-ec", encoder_container(spec).get("env")
            assert volume is not None, spec.get("volumes")
            assert mount is not None and mount["mountPath"] == path and not mount.get("readOnly"), mount
        pvc = pools.api.get(path_for("v1", "persistentvolumeclaims", pools.namespace, CLAIM))
        assert pvc["status"]["phase"] == "Bound" and pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
        assert pod_ready(pod)
        status = next(s for s in pod["status"]["containerStatuses"] if s["name"] == "encoder")
        assert status["ready"] and status["started"] and status["restartCount"] == 0, status
        pod_name = pod["metadata"]["name"]
        config = json.loads(pools.kubectl("exec", pod_name, "-c", "encoder", "--", "cat",
                                          f"{manifest['spec']['model']}/config.json").stdout)
        hidden = config["hidden_size"]  # the tower's merger output: the language model's width

        # The proxy's request, through the Service's DNS name; the pod's own /encode of each image.
        answer = client.run("vllm_chat.py", f"http://{NAME}.{pools.namespace}.svc:30000")
        assert answer.get("addresses") == [pod["status"]["podIP"]], answer.get("error")  # DNS names the pod
        expected = check_answer(answer, hidden)
        uuid, other = expected

        # A prefill instance's read: the claim read-only at its own path, as another uid (torch, imported
        # by safetensors.torch, gets a writable HOME=/cache as in the pools' pods).
        consumer = script_pod("prefill-consumer", ["python", f"{MOUNT}/ec_consumer.py", CONSUMER_PATH, uuid, other],
                              volumes=[{"name": "ec", "persistentVolumeClaim": {"claimName": CLAIM, "readOnly": True}},
                                       {"name": "cache", "emptyDir": {}}],
                              mounts=[{"name": "ec", "mountPath": CONSUMER_PATH, "readOnly": True},
                                      {"name": "cache", "mountPath": "/cache"}], memory="1Gi")
        consumer["spec"]["securityContext"].update(runAsUser=CONSUMER_UID, runAsGroup=CONSUMER_UID)
        read = run_to_completion(pools, consumer)
        assert read["write"] == "Read-only file system", read["write"]
        check_read(read, expected, CONSUMER_PATH)
        print(f"\nvLLM consumer read {len(read['items'])} files from {CLAIM}: "
              + ", ".join(f"{f['identifier'][:12]}… {f['shape']}" for f in read["items"]))
