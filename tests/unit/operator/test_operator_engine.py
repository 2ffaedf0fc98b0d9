"""The engine: one reconcile at a time per pool, bursts coalesced, a resync that visits every pool.

The client here is a stand-in that only counts and sleeps (no API server in this tier); the
reconcile it drives is the real one.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from encoderpool_operator import errors
from encoderpool_operator.engine import Engine
from encoderpool_operator.settings import OperatorSettings
from encoderpool_operator.status import Event

pytestmark = pytest.mark.unit


class CountingClient:
    """Reads take ``delay`` seconds; pools never exist, so each reconcile is just one read."""

    def __init__(self, delay: float = 0.05, pools: dict[str | None, list[str]] | None = None) -> None:
        self.delay = delay
        self.pools = pools or {}
        self.reads: list[tuple[str, str]] = []
        self.active: dict[str, int] = {}
        self.peak: dict[str, int] = {}
        self.fail: set[str] = set()
        self._lock = threading.Lock()

    def get_pool(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            self.reads.append((namespace, name))
            self.active[name] = self.active.get(name, 0) + 1
            self.peak[name] = max(self.peak.get(name, 0), self.active[name])
        time.sleep(self.delay)
        with self._lock:
            self.active[name] -= 1
        if name in self.fail:
            raise errors.UnavailableError("api server down")
        return None

    def list_pools(self, namespace: str | None) -> list[dict[str, Any]]:
        return [{"metadata": {"namespace": namespace or "ns", "name": n}} for n in self.pools.get(namespace, [])]

    def patch_pool_status(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        raise AssertionError("not reached")

    def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        raise AssertionError("not reached")

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        raise AssertionError("not reached")

    def delete(self, kind: str, namespace: str, name: str, uid: str) -> None:
        raise AssertionError("not reached")

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        raise AssertionError("not reached")

    def post_event(self, obj: dict[str, Any], event: Event) -> None:
        raise AssertionError("not reached")


def settings(**values: Any) -> OperatorSettings:
    return OperatorSettings.model_validate(values)


def test_one_reconcile_at_a_time_per_pool_but_pools_in_parallel() -> None:
    client = CountingClient()
    engine = Engine(client, settings())

    async def main() -> None:
        await asyncio.gather(*(engine.reconcile("ml", name) for name in ["a", "a", "a", "b", "b"]))

    started = time.monotonic()
    asyncio.run(main())
    assert client.peak == {"a": 1, "b": 1}
    assert len(client.reads) == 5
    assert time.monotonic() - started < 0.05 * 5, "different pools must not wait for each other"


def test_a_burst_of_nudges_becomes_one_running_and_one_queued_reconcile() -> None:
    client = CountingClient(delay=0.1)
    engine = Engine(client, settings())

    async def main() -> None:
        first = asyncio.create_task(engine.reconcile("ml", "a"))
        await asyncio.sleep(0.02)  # the first one is running now
        await asyncio.gather(*(engine.nudge("ml", "a") for _ in range(10)))
        await first

    asyncio.run(main())
    assert len(client.reads) == 2


def test_slots_are_dropped_when_idle() -> None:
    engine = Engine(CountingClient(delay=0), settings())
    asyncio.run(engine.reconcile("ml", "a"))
    assert engine._slots == {}


def test_a_failing_nudge_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    client = CountingClient(delay=0)
    client.fail.add("a")
    engine = Engine(client, settings())
    asyncio.run(engine.nudge("ml", "a"))
    assert "api server down" in caplog.text
    with pytest.raises(errors.UnavailableError):
        asyncio.run(engine.reconcile("ml", "a"))


def test_resync_visits_every_pool_of_every_watched_namespace() -> None:
    client = CountingClient(delay=0, pools={"ml": ["a", "b"], "cv": ["c"]})
    engine = Engine(client, settings(namespaces="ml,cv"))
    assert asyncio.run(engine.resync_once()) == 3
    assert sorted(client.reads) == [("cv", "c"), ("ml", "a"), ("ml", "b")]


def test_resync_of_all_namespaces_lists_cluster_wide() -> None:
    client = CountingClient(delay=0, pools={None: ["a"]})
    assert asyncio.run(Engine(client, settings()).resync_once()) == 1


def test_the_resync_task_runs_periodically_and_stops() -> None:
    client = CountingClient(delay=0, pools={None: ["a"]})
    engine = Engine(client, settings(resync_seconds=5, coalesce_seconds=0))

    # resync_seconds has a floor of 5 s; model_copy skips validation to keep this test short.
    engine.settings = engine.settings.model_copy(update={"resync_seconds": 0.01})

    async def main() -> None:
        engine.start()
        await asyncio.sleep(0.1)
        assert client.reads == [], "no resync before the watch cache has been filled"
        engine.cache_ready()
        await asyncio.sleep(0.1)
        await engine.stop()

    asyncio.run(main())
    assert len(client.reads) >= 3


def test_the_resync_outlives_a_round_that_crashes(caplog: pytest.LogCaptureFixture) -> None:
    class CrashingOnce(CountingClient):
        listed = 0

        def list_pools(self, namespace: str | None) -> list[dict[str, Any]]:
            self.listed += 1
            if self.listed == 1:
                raise RuntimeError("not an OperatorError")
            return super().list_pools(namespace)

    client = CrashingOnce(delay=0, pools={None: ["a"]})
    engine = Engine(client, settings(resync_seconds=5, coalesce_seconds=0))
    engine.settings = engine.settings.model_copy(update={"resync_seconds": 0.01})

    async def main() -> None:
        engine.cache_ready()
        engine.start()
        await asyncio.sleep(0.1)
        await engine.stop()

    asyncio.run(main())
    assert "resync failed" in caplog.text
    assert client.reads, "the rounds after the crash visit the pool"


def test_coalesced_nudges_are_counted() -> None:
    client = CountingClient(delay=0.05)
    engine = Engine(client, settings(coalesce_seconds=0.05))

    async def main() -> None:
        await asyncio.gather(*(engine.nudge("ml", "a") for _ in range(20)))

    asyncio.run(main())
    assert len(client.reads) == 1, "a burst within the coalescing window is one reconcile"
    samples = {s.labels["outcome"]: s.value for m in engine.metrics.registry.collect()
               if m.name == "encoderpool_operator_nudges" for s in m.samples if s.name.endswith("_total")}
    assert samples == {"ran": 1.0, "coalesced": 19.0}
