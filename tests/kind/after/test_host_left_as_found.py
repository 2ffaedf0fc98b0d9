"""After the kind tier (hack/kind-e2e.sh runs this last, after its teardown): the host is as the
run found it. The kubelet's writes to host sysctls are undone, no container, network, volume or
network interface of the run is left, and a Docker engine the run started is stopped again."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.kind.hoststate import record

pytestmark = pytest.mark.kind

BEFORE_ENV = "ENCODERPOOL_HOST_BEFORE"


@pytest.fixture(scope="module")
def before_after() -> tuple[dict, dict]:
    where = os.environ.get(BEFORE_ENV)
    if not where:
        pytest.fail(f"runs after the kind tier's teardown, with {BEFORE_ENV} naming what hack/kind-e2e.sh recorded "
                    "first: run `make kind-e2e`", pytrace=False)
    return json.loads((Path(where) / "host.json").read_text()), record()


def test_host_sysctls_are_as_before(before_after: tuple[dict, dict]) -> None:
    before, after = (state["sysctls"] for state in before_after)
    changed = {k: (before[k], after.get(k)) for k in before if after.get(k, before[k]) != before[k]}
    assert changed == {}, f"host sysctls changed by the run (before, after): {changed}"


@pytest.mark.parametrize("what", ["containers", "networks", "volumes", "links"])
def test_nothing_of_the_run_is_left(before_after: tuple[dict, dict], what: str) -> None:
    before, after = (state[what] for state in before_after)
    left = sorted(set(after or []) - set(before or []))
    assert left == [], f"{what} left behind: {left}"
    if before is None:  # no engine answered before the run: none answers after it
        assert after is None, f"the Docker engine the run started still runs ({what} listed)"
