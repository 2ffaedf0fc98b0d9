"""Fixtures shared by the integration tests: SGLang's own receiver code, one process per release."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from encoder_pod.settings import SGLANG_RELEASES
from tests.support.sglang_harness import SglangHarness, install_releases


@pytest.fixture(scope="session")
def sglang_sites() -> dict[str, Path]:
    """Every supported release's source, unpacked from its wheel (fetched --no-deps into the cache once)."""
    return install_releases()


@pytest.fixture(scope="session", params=SGLANG_RELEASES)
def sglang(request: pytest.FixtureRequest, sglang_sites: dict[str, Path]) -> Iterator[SglangHarness]:
    """One long-lived process running ``request.param``'s receiver code (tests run once per release)."""
    harness = SglangHarness(sglang_sites[request.param], request.param)
    try:
        yield harness
    finally:
        harness.close()


@pytest.fixture(scope="session")
def sglang_newest(sglang_sites: dict[str, Path]) -> Iterator[SglangHarness]:
    """The newest release alone, for tests whose subject is not the differences between releases."""
    harness = SglangHarness(sglang_sites[SGLANG_RELEASES[-1]], SGLANG_RELEASES[-1])
    try:
        yield harness
    finally:
        harness.close()
