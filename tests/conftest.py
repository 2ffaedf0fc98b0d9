"""Fixtures shared by every test tier: tiny random-weight checkpoints, built once per session."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import pytest

# No model hub is reachable from these machines: anything that tries it should fail at once,
# not hang on a connect timeout. Set before any test imports transformers/huggingface_hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``tiny_model(arch, preset="tiny")`` -> that checkpoint's directory (built on first use).

    ``preset="moderate"`` gives the benchmark sizes (slower forwards, e.g. to hold a batch busy).
    Shared by the session: tests that need to damage a checkpoint must copy it first.
    """
    root = tmp_path_factory.mktemp("tiny-models")

    def build(arch: str, preset: str = "tiny") -> Path:
        out = root / preset / arch
        # config.json is written last, so its presence means the checkpoint is complete.
        if not (out / "config.json").is_file():
            # Imported here: torch/transformers load only for the tests that build models.
            from encoder_pod.models.registry import make_tiny_model

            make_tiny_model(arch, out, preset)
        return out

    return build


@pytest.fixture(scope="session")
def tiny_full_model(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``tiny_full_model(arch)`` -> a tiny whole (sharded, indexed) checkpoint of that family, built once."""
    root = tmp_path_factory.mktemp("tiny-full-models")

    def build(arch: str) -> Path:
        out = root / arch
        if not (out / "config.json").is_file():
            from encoder_pod.models.family import Layout
            from encoder_pod.models.registry import make_tiny_model

            make_tiny_model(arch, out, layout=Layout.FULL)
        return out

    return build


TIERS = ("unit", "integration", "e2e", "kind", "gpu")
"""The tier markers; each is also the directory under tests/ that holds that tier's tests."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that names no tier gets its directory's, so ``-m unit`` (``make test-unit``) and the
    other tier targets select every test of their tier; a test outside the tier directories that
    names none is a collection error, not a test that no tier target runs."""
    root = Path(__file__).resolve().parent
    unplaced = []
    for item in items:
        if any(item.get_closest_marker(tier) for tier in TIERS):
            continue
        try:
            tier = item.path.resolve().relative_to(root).parts[0]
        except ValueError:
            tier = ""
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))
        else:
            unplaced.append(item.nodeid)
    if unplaced:
        raise pytest.UsageError(f"tests without a tier marker ({', '.join(TIERS)}): {unplaced[:10]}")
