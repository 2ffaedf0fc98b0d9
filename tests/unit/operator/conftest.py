"""Fixtures of the operator's unit tests: the CRD, operator settings, pools and pods.

This folder has no __init__.py on purpose: as a package it would be named "operator" like the
stdlib module. Test modules are therefore named test_operator_* to stay unique.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from encoderpool_operator.settings import OperatorSettings
from encoderpool_operator.spec import Pool, parse_pool

REPO = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def repo() -> Path:
    """The repository root."""
    return REPO


@pytest.fixture(scope="session")
def crd() -> dict[str, Any]:
    """The EncoderPool CRD, as committed."""
    return yaml.safe_load((REPO / "crds" / "encoderpools.encoderpool.io.yaml").read_text())


@pytest.fixture(scope="session")
def openapi(crd: dict[str, Any]) -> dict[str, Any]:
    """The v1alpha1 openAPIV3Schema."""
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


@pytest.fixture(scope="session")
def invalid_pools() -> list[dict[str, Any]]:
    """Pools the API server must refuse, each annotated with the layer and the expected message."""
    return list(yaml.safe_load_all((HERE / "data" / "invalid-pools.yaml").read_text()))


@pytest.fixture
def settings() -> OperatorSettings:
    """Default operator settings, independent of the test process's environment."""
    return OperatorSettings.model_validate({})


@pytest.fixture
def pool_body() -> Callable[..., dict[str, Any]]:
    """``pool_body(spec, name=..., ...)`` -> an EncoderPool body as the API server returns it."""

    def build(spec: dict[str, Any], name: str = "enc", namespace: str = "ml", uid: str = "uid-1",
              generation: int = 1, status: dict[str, Any] | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "apiVersion": "encoderpool.io/v1alpha1",
            "kind": "EncoderPool",
            "metadata": {"name": name, "namespace": namespace, "uid": uid, "generation": generation},
            "spec": copy.deepcopy(spec),
        }
        if status is not None:
            body["status"] = copy.deepcopy(status)
        return body

    return build


@pytest.fixture
def make_pool(pool_body: Callable[..., dict[str, Any]]) -> Callable[..., Pool]:
    """``make_pool(spec, **meta)`` -> a parsed :class:`Pool`."""

    def build(spec: dict[str, Any], **meta: Any) -> Pool:
        return parse_pool(pool_body(spec, **meta))

    return build


@pytest.fixture
def pod() -> Callable[..., dict[str, Any]]:
    """``pod(ordinal, ...)`` -> a pod of pool "enc" in the shape the kubelet reports."""

    def build(ordinal: int, *, ready: bool = True, revision: str = "enc-rev2", scheduled: bool = True,
              unschedulable_message: str = "", container: dict[str, Any] | None = None,
              ready_since: str = "2026-01-01T00:00:00Z", deleting: bool = False) -> dict[str, Any]:
        conditions = [
            {"type": "PodScheduled", "status": "True"} if scheduled else
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": unschedulable_message},
            {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": ready_since},
        ]
        status: dict[str, Any] = {"phase": "Running" if scheduled else "Pending", "conditions": conditions}
        if container is not None:
            status["containerStatuses"] = [{"name": "encoder", **container}]
        elif scheduled:
            status["containerStatuses"] = [{
                "name": "encoder", "ready": ready, "started": True, "restartCount": 0,
                "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
            }]
        meta: dict[str, Any] = {"name": f"enc-{ordinal}", "namespace": "ml",
                                "labels": {"encoderpool.io/pool": "enc", "controller-revision-hash": revision}}
        if deleting:
            meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        return {"metadata": meta, "status": status}

    return build


@pytest.fixture
def statefulset() -> Callable[..., dict[str, Any]]:
    """``statefulset(...)`` -> the observed StatefulSet of pool "enc"."""

    def build(*, generation: int = 2, observed: int = 2, update_revision: str = "enc-rev2",
              current_revision: str = "enc-rev2") -> dict[str, Any]:
        return {
            "metadata": {"name": "enc", "namespace": "ml", "generation": generation},
            "status": {"observedGeneration": observed, "updateRevision": update_revision,
                       "currentRevision": current_revision},
        }

    return build
