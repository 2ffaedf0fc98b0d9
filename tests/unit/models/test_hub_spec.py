"""Hub ids as model paths: how ``--model-path`` / ``--revision`` are read (no hub, no cache needed)."""

from __future__ import annotations

import pytest

from encoder_pod.models.hub import BadHubSpec, HubRef, hub_origin, looks_like_a_path, parse_spec, resolve_model_dir
from encoder_pod.settings import ModelPathError, ModelSettings


def _no_keys(model_dir, keys):
    raise AssertionError("a local path never consults the key plan")

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "spec, revision, expected",
    [
        ("Qwen/Qwen2.5-VL-7B-Instruct", None, HubRef("Qwen/Qwen2.5-VL-7B-Instruct")),
        ("hf://Qwen/Qwen2.5-VL-7B-Instruct@v1.0", None, HubRef("Qwen/Qwen2.5-VL-7B-Instruct", "v1.0")),
        ("llava-hf/llava-1.5-7b-hf@" + "a" * 40, None, HubRef("llava-hf/llava-1.5-7b-hf", "a" * 40)),
        ("google/gemma-3-4b-it", "main", HubRef("google/gemma-3-4b-it", "main")),
        ("google/gemma-3-4b-it@main", "main", HubRef("google/gemma-3-4b-it", "main")),
    ],
)
def test_hub_ids_and_revisions(spec, revision, expected):
    assert parse_spec(spec, revision) == expected


@pytest.mark.parametrize("spec", ["qwen2-vl", "a/b/c", "org/name@", "../x/y", "org /name", "hf://org/../name"])
def test_what_is_no_hub_id(spec):
    with pytest.raises(BadHubSpec, match="neither a directory nor a hub id"):
        parse_spec(spec)


def test_a_revision_setting_that_disagrees_with_the_path_is_refused():
    with pytest.raises(BadHubSpec, match="ENCODER_REVISION / --revision: 'v2' disagrees"):
        parse_spec("org/name@v1", "v2")


def test_paths_are_never_taken_for_hub_ids(tmp_path):
    assert looks_like_a_path("/models/qwen") and looks_like_a_path("./qwen") and looks_like_a_path("data/org/name")
    assert not looks_like_a_path("org/name") and not looks_like_a_path("hf://org/name@v1")
    with pytest.raises(ModelPathError, match="no config.json"):
        resolve_model_dir(ModelSettings(model_path=str(tmp_path / "missing" / "model")), _no_keys)
    with pytest.raises(ModelPathError, match="no config.json"):
        resolve_model_dir(ModelSettings(model_path=str(tmp_path)), _no_keys)


def test_a_snapshot_folder_says_which_model_and_commit_it_is(tmp_path):
    snapshot = tmp_path / "hub" / "models--Qwen--Qwen2-VL-7B-Instruct" / "snapshots" / ("c" * 40)
    assert hub_origin(snapshot) == {"repo_id": "Qwen/Qwen2-VL-7B-Instruct", "commit": "c" * 40}
    assert hub_origin(tmp_path) is None
