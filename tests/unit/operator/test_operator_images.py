"""The Dockerfiles agree with what the operator, the chart and the examples assume about them.

The images themselves are built and run by the kind tier (tests/kind/test_images.py); these checks
are the ones that need no Docker engine.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from encoderpool_operator.podparts import RUN_AS_USER

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]
ENCODER = (REPO / "docker" / "Dockerfile.encoder-pod").read_text()
OPERATOR = (REPO / "docker" / "Dockerfile.operator").read_text()
OPERATOR_REQUIREMENTS = REPO / "docker" / "operator-requirements.in"


def dependencies() -> dict[str, str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pairs = (re.match(r"^([A-Za-z0-9_.-]+)(.*)$", d) for d in project["dependencies"])
    return {m.group(1).lower(): m.group(2) for m in pairs if m}


def operator_requirements() -> dict[str, str]:
    lines = [ln.strip() for ln in OPERATOR_REQUIREMENTS.read_text().splitlines() if ln.strip() and ln[0] != "#"]
    pairs = (re.match(r"^([A-Za-z0-9_.-]+)(.*)$", ln) for ln in lines)
    return {m.group(1).lower(): m.group(2) for m in pairs if m}


@pytest.mark.parametrize("dockerfile", [ENCODER, OPERATOR], ids=["encoder-pod", "operator"])
def test_no_dockerfile_makes_buildkit_pull_a_frontend(dockerfile: str) -> None:
    # A `# syntax=` directive makes BuildKit pull a frontend image: impossible without a registry.
    assert not re.search(r"^#\s*syntax\s*=", dockerfile, re.MULTILINE | re.IGNORECASE)


def test_the_encoder_image_installs_torch_as_pyproject_pins_it() -> None:
    # No second pin or index of its own: the pinned set (or pyproject itself) is what it installs.
    assert "torch==" not in ENCODER and "download.pytorch.org" not in ENCODER
    assert dependencies()["torch"].startswith("==")


def test_the_cpu_variant_leaves_out_only_the_gpu_kernel_compiler() -> None:
    assert "ARG VARIANT=cpu" in ENCODER
    assert re.search(r"grep -v -E '\^\(triton\)=='", ENCODER), "the CPU variant drops triton from the pinned set"
    assert "uninstall -y triton" in ENCODER, "and from an install from the index"


def test_images_run_as_the_uid_the_pods_expect() -> None:
    assert f"USER {RUN_AS_USER}:{RUN_AS_USER}" in ENCODER
    deployment = (REPO / "charts" / "encoderpool-operator" / "templates" / "deployment.yaml").read_text()
    uid = re.search(r"runAsUser: (\d+)", deployment)
    assert uid is not None and f"USER {uid.group(1)}:{uid.group(1)}" in OPERATOR


def test_the_baked_checkpoint_is_the_one_the_examples_use() -> None:
    baked = re.search(r"--out (\S+);", ENCODER)
    assert baked is not None
    for name in ("encoderpool.yaml", "encoderpool-cpu.yaml"):
        pool = yaml.safe_load((REPO / "examples" / name).read_text())
        assert pool["spec"]["model"] == baked.group(1)


def test_operator_requirements_are_pyproject_dependencies_as_pinned() -> None:
    deps = operator_requirements()
    for name, spec in deps.items():
        assert dependencies().get(name) == spec, f"{name}: operator-requirements.in {spec} != pyproject"
    assert "torch" not in deps and "--no-deps" in OPERATOR, "no torch in the operator image"


def test_every_import_of_the_operator_is_installed_in_its_image() -> None:
    # The image installs operator-requirements.in and nothing else: a new import of a third-party
    # package in operator/ must be listed there, or the image fails at start.
    imported: set[str] = set()
    for path in (REPO / "operator").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                imported.add(node.module.split(".")[0])
    third_party = {m for m in imported if m not in sys.stdlib_module_names and m != "encoderpool_operator"}
    providers = importlib.metadata.packages_distributions()
    installed = installed_closure(operator_requirements())
    for module in sorted(third_party):
        dists = {normalize(d) for d in providers.get(module, [])}
        assert dists & installed, f"operator/ imports {module} (from {dists or 'no distribution'}), which " \
                                  "neither docker/operator-requirements.in nor its dependencies install"


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_closure(names: dict[str, str]) -> set[str]:
    """The listed distributions and, transitively, what they require (extras left out)."""
    seen: set[str] = set()
    todo = [normalize(n) for n in names]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:  # a marker excludes it here (python_version)
            continue
        for requirement in requires:
            if "extra ==" not in requirement:
                match = re.match(r"[A-Za-z0-9_.-]+", requirement)
                if match:
                    todo.append(normalize(match.group(0)))
    return seen
