"""Continuous /encode load against a pool's headless Service, the way a router uses it.

``tests.support.server.jpeg_uri`` makes a photo-like JPEG item; requests of several large items
keep a tiny CPU model busy for a noticeable time, so a pod holds queued work when it is stopped.

Each worker thread sends one request at a time to the next ready address of the Service's
EndpointSlices (re-read every 100 ms by a thread of its own, as a router watching them would).
Every answer is classified:

- ``ok``: 200 with an embedding;
- ``refused_draining``: 503 with ``Retry-After`` from a pod that says it is draining; the request
  is then retried at once on another ready address of the Service, and that retry is recorded;
- ``lost``: anything else: a connection refused or reset, a timeout, a 5xx, a 503 that is not a
  drain's, or a failed retry. A lossless drain has none.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections import Counter
from typing import Any

import httpx

from tests.e2e.cluster.api import ApiError
from tests.e2e.pools import Pools

PNG_B64 = ("iVBORw0KGgoAAAANSUhEUgAAACAAAAAgCAIAAAD8GO2jAAAAKklEQVR42u3NMQEAAAQAMATRP4pYSvBtBZbTHZ8q"
           "ngkEAoFAIBAIBIIrC+AFAUQz669uAAAAAElFTkSuQmCC")
REQUEST_TIMEOUT = 60.0


@dataclasses.dataclass
class Tally:
    """What the load saw."""

    ok: int = 0
    refused_draining: int = 0
    retried_ok: int = 0
    lost: int = 0
    lost_details: list[str] = dataclasses.field(default_factory=list)
    by_pod: Counter[str] = dataclasses.field(default_factory=Counter)

    @property
    def sent(self) -> int:
        """Requests sent (a retry is part of the request it retries)."""
        return self.ok + self.refused_draining + self.lost - (self.refused_draining - self.retried_ok)

    def line(self) -> str:
        """The numbers, for the test output."""
        return (f"{self.sent} requests: {self.ok} answered 200 at once, "
                f"{self.refused_draining} refused by a draining pod (503 + Retry-After) of which "
                f"{self.retried_ok} succeeded on retry to the Service; lost: {self.lost}; per pod {dict(self.by_pod)}")


def is_draining_refusal(response: httpx.Response) -> bool:
    """503 with Retry-After and a message saying the pod is draining (the pod's drain contract)."""
    if response.status_code != 503 or "retry-after" not in response.headers:
        return False
    try:
        message = str(response.json().get("message", ""))
    except ValueError:
        return False
    return "drain" in message.lower()


class ServiceLoad:
    """``with ServiceLoad(pools, service): ...`` keeps ``workers`` requests in flight meanwhile."""

    def __init__(self, pools: Pools, service: str, workers: int = 4, items: list[str] | None = None) -> None:
        self._cluster = pools.cluster
        self._namespace = pools.namespace
        self._service = service
        self._workers = workers
        self._items = items or [f"data:image/png;base64,{PNG_B64}"]
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._addresses: list[tuple[str, str, int]] = []
        self._counter = itertools.count()
        self._threads: list[threading.Thread] = []
        self.tally = Tally()

    def __enter__(self) -> ServiceLoad:
        watcher = threading.Thread(target=self._watch, name="endpointslices", daemon=True)
        watcher.start()
        self._threads.append(watcher)
        for i in range(self._workers):
            thread = threading.Thread(target=self._work, name=f"load-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=REQUEST_TIMEOUT + 10)

    def _watch(self) -> None:
        pools = Pools(self._cluster, self._namespace)  # a REST client of its own: clients are per thread
        try:
            while not self._stop.wait(0.1):
                try:
                    found = pools.ready_addresses(self._service)
                except (ApiError, httpx.HTTPError, StopIteration):
                    continue
                with self._lock:
                    self._addresses = found
        finally:
            pools.close()

    def _pick(self, avoid: str | None = None) -> tuple[str, str, int] | None:
        with self._lock:
            choices = [a for a in self._addresses if a[0] != avoid] or ([] if avoid else list(self._addresses))
        if not choices:
            return None
        return choices[next(self._counter) % len(choices)]

    def _send(self, client: httpx.Client, target: tuple[str, str, int], n: int) -> httpx.Response | str:
        address, _, port = target
        body = {"req_id": f"load-{n}", "modality": "IMAGE", "mm_items": self._items}
        try:
            return client.post(f"http://{address}:{port}/encode", json=body, timeout=REQUEST_TIMEOUT)
        except httpx.HTTPError as err:
            return f"{type(err).__name__}: {err}"

    def _record(self, ok: bool, kind: str, target: tuple[str, str, int], detail: str = "") -> None:
        with self._lock:
            if ok:
                self.tally.by_pod[target[1]] += 1
            if kind == "ok":
                self.tally.ok += 1
            elif kind == "refused":
                self.tally.refused_draining += 1
            elif kind == "retried_ok":
                self.tally.retried_ok += 1
            else:
                self.tally.lost += 1
                if len(self.tally.lost_details) < 20:
                    self.tally.lost_details.append(f"{target[1]} ({target[0]}): {detail}")

    def _work(self) -> None:
        with httpx.Client() as client:
            while not self._stop.is_set():
                target = self._pick()
                if target is None:
                    time.sleep(0.05)
                    continue
                n = next(self._counter)
                answer = self._send(client, target, n)
                if isinstance(answer, httpx.Response) and answer.status_code == 200:
                    self._record(True, "ok", target)
                elif isinstance(answer, httpx.Response) and is_draining_refusal(answer):
                    self._record(False, "refused", target)
                    self._retry(client, target, n)
                else:
                    detail = answer if isinstance(answer, str) else f"HTTP {answer.status_code}: {answer.text[:200]}"
                    self._record(False, "lost", target, detail)

    def _retry(self, client: httpx.Client, refused_by: tuple[str, str, int], n: int) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            target = self._pick(avoid=refused_by[0])
            if target is None:
                time.sleep(0.05)  # the Service has no other ready pod yet: the router waits
                continue
            answer = self._send(client, target, n)
            if isinstance(answer, httpx.Response) and answer.status_code == 200:
                self._record(True, "retried_ok", target)
                return
            if isinstance(answer, httpx.Response) and is_draining_refusal(answer):
                continue  # that one drains too: try the next
            detail = answer if isinstance(answer, str) else f"HTTP {answer.status_code}: {answer.text[:200]}"
            self._record(False, "lost", target, f"retry: {detail}")
            return
        self._record(False, "lost", refused_by, "retry: no other ready pod within 10 s")
