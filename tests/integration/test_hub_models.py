"""Hub ids as model paths: resolved from a real Hugging Face cache layout, downloaded from a hub.

No hub is reachable here. The offline path runs against a cache laid out file by file as
``huggingface_hub`` lays it out; the download path runs the real ``huggingface_hub`` client (in the
real ``encoder-pod fetch-model``) against :class:`~tests.support.fake_hub.FakeHub`, a loopback
server that speaks the hub's file endpoint, and checks which files were asked for.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.fake_hub import FakeHub, write_hf_cache
from testkit.server import EncoderServer

pytestmark = pytest.mark.integration

REPO = "Qwen/Qwen2.5-VL-7B-Instruct"
COMMIT = "cc594898137f460bfe9f0759e9844b3ce807cfb5"


def _tower_files(ckpt: Path) -> tuple[set[str], set[str]]:
    """(shards holding visual.* tensors, every shard), from the index."""
    weight_map = json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"]
    return {s for k, s in weight_map.items() if k.startswith("visual.")}, set(weight_map.values())


def _cli(args: list[str], hf_home: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    full_env.update({"HF_HOME": str(hf_home), "HF_HUB_DISABLE_TELEMETRY": "1", **env})
    return subprocess.run([sys.executable, "-m", "encoder_pod.cli", *args], env=full_env, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def checkpoint(tiny_full_model) -> Path:
    return tiny_full_model("qwen2_5_vl")


def test_fetch_downloads_config_processor_files_and_only_the_tower_shards(checkpoint, tmp_path):
    tower_shards, all_shards = _tower_files(checkpoint)
    assert tower_shards < all_shards  # the tiny checkpoint has shards holding only the language model
    with FakeHub(checkpoint, REPO, COMMIT, token="hf_secret") as hub:
        refused = _cli(["fetch-model", f"hf://{REPO}"], tmp_path, HF_ENDPOINT=hub.url)
        assert refused.returncode == 3, refused.stderr
        assert "not authorised (HF_TOKEN)" in refused.stderr
        done = _cli(["fetch-model", f"hf://{REPO}"], tmp_path, HF_ENDPOINT=hub.url, HF_TOKEN="hf_secret")
        assert done.returncode == 0, done.stderr
        fetched = hub.downloaded()
        asked = len(hub.requested)
        again = _cli(["fetch-model", REPO], tmp_path, HF_ENDPOINT=hub.url, HF_TOKEN="hf_secret")
        assert again.returncode == 0, again.stderr
        assert len(hub.requested) == asked, "a cached model must not ask the hub again"
    meta = {p.name for p in checkpoint.iterdir() if not p.name.endswith(".safetensors")}
    assert fetched == meta | tower_shards
    snapshot = Path(done.stdout.strip())
    assert snapshot == tmp_path / "hub" / f"models--{REPO.replace('/', '--')}" / "snapshots" / COMMIT
    assert {p.name for p in snapshot.iterdir()} == meta | tower_shards
    assert again.stdout.strip() == done.stdout.strip()


def test_fetch_refuses_unknown_models_and_bad_ids(checkpoint, tmp_path):
    with FakeHub(checkpoint, REPO, COMMIT) as hub:
        unknown = _cli(["fetch-model", "someone/nothing-here"], tmp_path, HF_ENDPOINT=hub.url)
        assert unknown.returncode == 3 and "no such model" in unknown.stderr, unknown.stderr
    bad = _cli(["fetch-model", "not a model id"], tmp_path)
    assert bad.returncode == 2 and "neither a directory nor a hub id" in bad.stderr, bad.stderr


_RESOLVE = """
import json, sys
from encoder_pod.models.hub import ModelNotFound, fetch, parse_spec
from encoder_pod.models.registry import encoder_weight_keys
out = {}
for spec in sys.argv[1:]:
    try:
        out[spec] = str(fetch(parse_spec(spec), encoder_weight_keys))
    except ModelNotFound as exc:
        out[spec] = "ModelNotFound: " + str(exc)
print(json.dumps(out))
"""


def test_offline_cache_resolves_by_branch_and_commit_and_names_a_missing_shard(checkpoint, tmp_path):
    tower_shards, _ = _tower_files(checkpoint)
    meta = [p.name for p in checkpoint.iterdir() if not p.name.endswith(".safetensors")]
    hub_cache = tmp_path / "hub"
    snapshot = write_hf_cache(checkpoint, hub_cache, REPO, COMMIT, files=meta + sorted(tower_shards))
    missing = sorted(tower_shards)[0]
    write_hf_cache(checkpoint, hub_cache, REPO, "f" * 40, branch="broken", files=meta + sorted(tower_shards - {missing}))
    done = _cli(["fetch-model", REPO], tmp_path, HF_HUB_OFFLINE="1")
    assert (done.returncode, done.stdout.strip()) == (0, str(snapshot)), done.stderr
    failed = _cli(["fetch-model", f"{REPO}@broken"], tmp_path, HF_HUB_OFFLINE="1")
    assert failed.returncode == 3 and f"{missing} is not in the local cache" in failed.stderr, failed.stderr
    # The library itself, in one fresh process (its settings are read at import): more spellings.
    specs = [f"{REPO}@main", f"hf://{REPO}@{COMMIT}", f"{REPO}@v9", "Qwen/Nope"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HOME=str(tmp_path), HF_HUB_OFFLINE="1")
    run = subprocess.run([sys.executable, "-c", _RESOLVE, *specs], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout.strip().splitlines()[-1])
    assert found[specs[0]] == found[specs[1]] == str(snapshot)
    assert found[specs[2]].startswith("ModelNotFound") and "offline mode" in found[specs[2]]
    assert found[specs[3]].startswith("ModelNotFound")


def test_serve_a_hub_id_from_the_cache_offline(checkpoint, tmp_path):
    tower_shards, _ = _tower_files(checkpoint)
    meta = [p.name for p in checkpoint.iterdir() if not p.name.endswith(".safetensors")]
    snapshot = write_hf_cache(checkpoint, tmp_path / "hub", REPO, COMMIT, files=meta + sorted(tower_shards))
    env = {"HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1", "ENCODER_DEVICE": "cpu"}
    with EncoderServer(REPO, env=env) as server:
        model = httpx.get(server.base_url + "/server_info", timeout=10).json()["model"]
    assert model["model_dir"] == str(snapshot)
    assert model["hub"] == {"repo_id": REPO, "commit": COMMIT}
    assert (model["family"], model["layout"]) == ("qwen2_5_vl", "full")
