"""The Dockerfiles agree with what the operator, the chart and the examples assume about them.

(No container engine here: the images themselves are built by users and release CI.)
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

from encoderpool_operator.podparts import RUN_AS_USER

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]
ENCODER = (REPO / "docker" / "Dockerfile.encoder-pod").read_text()
OPERATOR = (REPO / "docker" / "Dockerfile.operator").read_text()


def dependencies() -> dict[str, str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pairs = (re.match(r"^([A-Za-z0-9_.-]+)(.*)$", d) for d in project["dependencies"])
    return {m.group(1).lower(): m.group(2) for m in pairs if m}


def test_encoder_image_torch_matches_the_pin() -> None:
    assert f"ARG TORCH_VERSION={dependencies()['torch'].removeprefix('==')}" in ENCODER


def test_encoder_image_has_both_variants() -> None:
    assert "FROM base AS torch-cpu" in ENCODER and "FROM base AS torch-cuda" in ENCODER
    assert "FROM torch-${VARIANT} AS final" in ENCODER
    assert "download.pytorch.org/whl/cpu" in ENCODER


def test_images_run_as_the_uid_the_pods_expect() -> None:
    assert f"USER {RUN_AS_USER}" in ENCODER
    deployment = (REPO / "charts" / "encoderpool-operator" / "templates" / "deployment.yaml").read_text()
    uid = re.search(r"runAsUser: (\d+)", deployment)
    assert uid is not None and f"USER {uid.group(1)}" in OPERATOR


def test_the_baked_checkpoint_is_the_one_the_examples_use() -> None:
    baked = re.search(r"--out (\S+)", ENCODER)
    assert baked is not None
    for name in ("encoderpool.yaml", "encoderpool-cpu.yaml"):
        pool = yaml.safe_load((REPO / "examples" / name).read_text())
        assert pool["spec"]["model"] == baked.group(1)


def test_operator_image_installs_the_operator_dependencies_as_pinned() -> None:
    deps = dependencies()
    installed = dict(re.findall(r'"([a-z-]+)([<>=!~][^"]*)"', OPERATOR))
    assert set(installed) == {"kopf", "kubernetes", "pydantic", "pyyaml"}
    for name, spec in installed.items():
        assert deps[name] == spec, f"{name}: Dockerfile {spec} != pyproject {deps[name]}"
    assert "COPY encoder_pod" not in OPERATOR and "--no-deps" in OPERATOR, "no torch in the operator image"
