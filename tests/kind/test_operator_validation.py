"""Issue 4, test 6: invalid pools are refused by the API server itself (openAPIV3Schema bounds and
CEL rules), with the message kubectl shows, and nothing is stored.

The cases are tests/unit/operator/data/invalid-pools.yaml, shared with the unit tier (which checks
each against the schema alone): every document names the message it expects.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from tests.e2e.pools import INVALID_POOLS, Pools

pytestmark = pytest.mark.kind

EXPECT = "test.encoderpool.io/expect"
ISSUE_CASES = {  # the four the issue names, by their document names
    "zero-tensor": "tensor 0",
    "negative-batch-size": "negative batch size",
    "batch-over-queue": "maxBatchSize > maxQueue",
    "unknown-transfer-backend": "unknown backend",
}


def invalid_pools() -> list[dict[str, Any]]:
    """The refused pools, as documents."""
    return list(yaml.safe_load_all(INVALID_POOLS.read_text()))


def test_invalid_pools_are_rejected_by_the_api_server_with_its_message(pools: Pools) -> None:
    docs = invalid_pools()
    assert set(ISSUE_CASES) <= {d["metadata"]["name"] for d in docs}
    # One kubectl run for the whole file: kubectl reports each refused document on its own line.
    result = pools.kubectl("apply", "-f", str(INVALID_POOLS), check=False)
    assert result.returncode != 0
    errors = result.stderr
    for doc in docs:
        name = doc["metadata"]["name"]
        lines = [line for line in errors.splitlines() if f'"{name}" is invalid' in line]
        assert len(lines) == 1, f"{name}: kubectl said nothing about it:\n{errors}"
        assert doc["metadata"]["annotations"][EXPECT] in lines[0], f"{name}: {lines[0]}"
    assert not re.search(r"\bcreated\b", result.stdout), result.stdout
    stored = pools.kubectl("get", "encpool", "-o", "name").stdout.split()
    assert stored == []
