"""kopf wiring: the error mapping, the registry, kopf's settings."""

from __future__ import annotations

import logging

import kopf
import pytest

from encoderpool_operator import errors, names
from encoderpool_operator.engine import Engine
from encoderpool_operator.handlers import (
    WATCHED,
    WatchCache,
    build_registry,
    index_name,
    kopf_settings,
    raise_for,
    to_kopf,
)
from encoderpool_operator.reconcile import Outcome
from encoderpool_operator.settings import OperatorSettings

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("error", "kind", "delay"),
    [
        (errors.InvalidSpecError("bad"), kopf.PermanentError, None),
        (errors.RejectedError("422", status=422), kopf.PermanentError, None),
        (errors.ForbiddenError("403", status=403), kopf.TemporaryError, 60.0),
        (errors.ConflictError("409", status=409), kopf.TemporaryError, 5.0),
        (errors.UnavailableError("down"), kopf.TemporaryError, 5.0),
        (errors.NotFoundError("404", status=404), kopf.TemporaryError, 5.0),
    ],
)
def test_errors_map_to_kopf_retries(error: errors.OperatorError, kind: type, delay: float | None,
                                    settings: OperatorSettings) -> None:
    mapped = to_kopf(error, settings)
    assert type(mapped) is kind
    if delay is not None:
        assert mapped.delay == delay  # type: ignore[attr-defined]


def test_outcomes_map_to_kopf(settings: OperatorSettings) -> None:
    raise_for(Outcome(True, {"reason": "Ready"}), settings)
    with pytest.raises(kopf.PermanentError, match="spec.port"):
        raise_for(Outcome(True, failed="spec.port: too small"), settings)
    # Waiting for the StatefulSet controller: its watch event nudges the pool, no kopf retry.
    raise_for(Outcome(True, waiting="not yet observed"), settings)


def test_registry_handles_pools_and_watches_children_without_finalizers(settings: OperatorSettings) -> None:
    registry = build_registry(Engine(client=None, settings=settings), WatchCache())  # type: ignore[arg-type]
    # The registry's handler lists are kopf internals; read only here, to pin what is registered.
    changing = registry._changing.get_all_handlers()
    watching = registry._watching.get_all_handlers()
    assert {h.reason for h in changing} == {"create", "update", None}  # None: resume
    assert all(h.selector.group == names.GROUP and h.selector.any_name == names.PLURAL for h in changing)
    assert not any(h.requires_finalizer for h in changing), "GC deletes children; no finalizer needed"
    assert registry._spawning.get_all_handlers() == [], "a kopf timer would put a finalizer on every pool"
    watched = {(h.selector.group, h.selector.version, h.selector.any_name) for h in watching}
    assert watched == set(WATCHED.values())
    assert all(dict(h.labels) == {names.MANAGED_BY_LABEL: names.OPERATOR_NAME} for h in watching)
    # The watch cache: one kopf index per watched kind, on the same selector (kopf holds every
    # handler back until each index has been listed, so no reconcile sees a half-filled cache).
    indexing = registry._indexing.get_all_handlers()
    assert {h.id for h in indexing} == {index_name(kind) for kind in WATCHED}
    assert {(h.selector.group, h.selector.version, h.selector.any_name) for h in indexing} == set(WATCHED.values())
    assert all(dict(h.labels) == {names.MANAGED_BY_LABEL: names.OPERATOR_NAME} for h in indexing)


def test_the_watch_cache_serves_a_pools_children_and_pods() -> None:
    cache = WatchCache()
    sts = {"kind": "StatefulSet", "metadata": {"name": "enc"}}
    pods = [{"metadata": {"name": "enc-0"}}, {"metadata": {"name": "enc-1"}}]
    # kopf's Index is a mapping of key -> an iterable store of values.
    cache.indices.update({index_name(kind): {} for kind in WATCHED})
    cache.indices[index_name("StatefulSet")][("ml", "enc")] = [sts]
    cache.indices[index_name("Pod")][("ml", "enc")] = pods
    snap = cache.snapshot("ml", "enc")
    assert snap.children["StatefulSet"] == sts and snap.children["Service"] is None
    assert snap.pods == pods
    assert cache.snapshot("ml", "other").pods == []


def test_kopf_does_not_scan_the_cluster(settings: OperatorSettings) -> None:
    """No CRD or namespace watches: a namespaced install needs no cluster-wide permission."""
    assert kopf_settings(settings).scanning.disabled is True


def test_kopf_keeps_its_state_under_our_prefix(settings: OperatorSettings) -> None:
    ks = kopf_settings(settings)
    assert isinstance(ks.persistence.progress_storage, kopf.AnnotationsProgressStorage)
    assert ks.persistence.progress_storage.prefix == names.GROUP
    assert ks.persistence.diffbase_storage.prefix == names.GROUP
    assert ks.posting.level == logging.WARNING
