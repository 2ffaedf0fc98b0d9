"""The one closed-loop load generator of the tests and the benchmarks.

``clients`` clients share one aiohttp session (a keep-alive pool of at most ``clients``
connections); each sends its next request as soon as its previous one was answered. aiohttp is
the HTTP client SGLang's prefill servers send ``/encode`` with, so the pod is loaded the way its
callers reach it. Every request becomes an :class:`Outcome`: its HTTP status, or the name of the
exception when no HTTP answer came (a refused or reset connection, a timeout).

- Benchmarks: ``await run_load(...)`` returns throughput and latency percentiles. With
  ``finish(n, answer)`` a request counts as done once ``finish`` returned (decoding an inline
  answer into a tensor, or waiting for the pushed embedding), else once its body was read.
- Tests: ``ClosedLoop(...).start()`` runs the same clients on a thread of their own while the
  test drains, stops or hangs the server; ``stop_new()`` sends nothing more, ``stop()`` waits for
  what is in flight and returns every outcome. ``stop_after`` ends one client's loop after a given
  outcome (a real client that was refused by a draining pod retries on another pod).

Times are ``time.monotonic()`` (CLOCK_MONOTONIC, as ``perf_counter`` on Linux), so a test can
compare them with the moment it sent a signal.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import aiohttp
import numpy as np
import orjson

BodyOf = Callable[[int], "dict[str, Any] | bytes"]
"""Request ``n``'s body (``n`` counts every request of the run, from 0): a JSON object, or bytes sent as they are."""


@dataclass(frozen=True)
class Answer:
    """One HTTP answer as read by the load generator (what ``finish`` gets)."""

    status: int
    content_type: str | None
    body: bytes


Finish = Callable[[int, Answer], Awaitable[None]]
"""Completes request ``n``'s answer before the request counts as done (benchmarks)."""


@dataclass(frozen=True)
class Outcome:
    """One request as its client saw it."""

    client: int
    n: int
    sent: float
    """When the client began the request (monotonic seconds)."""
    done: float
    """When its answer was read (and, with ``finish``, finished)."""
    status: int | str
    """The HTTP status, or the name of the exception when no HTTP answer came."""
    retry_after: str | None
    message: str
    """The error body's ``message`` (or the start of a body that is not one, or the exception's
    text); empty for a 200."""
    unreachable: bool = False
    """The connection could not be made: nothing of the request was sent."""
    connection: str | None = None
    """The answer's ``Connection`` header (``close`` from a draining pod), None without one."""

    @property
    def latency(self) -> float:
        """Seconds from the start of the request to its answer."""
        return self.done - self.sent

    @property
    def draining_refusal(self) -> bool:
        """A 503 that says the pod drains and carries ``Retry-After``."""
        return self.status == 503 and self.retry_after is not None and self.message.startswith("draining")


StopAfter = Callable[[Outcome], bool]


def refused_or_unreachable(outcome: Outcome) -> bool:
    """Stop a client after a draining refusal (a real client would retry on another pod) or when it
    cannot connect (the server is gone)."""
    return outcome.draining_refusal or outcome.unreachable


ACCEPT = {"json": None, "binary": "application/octet-stream", "push": None}
"""The ``Accept`` header of each way of asking the pod for an embedding (push: answered ``null``)."""


def image_bodies(uris: list[str], prefix: str = "load", push_port: int | None = None) -> Callable[[int], dict[str, Any]]:
    """Request ``n``'s ``/encode`` body: one IMAGE item (``uris`` in turn), ``req_id`` ``{prefix}-{n}``;
    with ``push_port`` the embedding is pushed to a receiver on this host's port."""

    def body(n: int) -> dict[str, Any]:
        out: dict[str, Any] = {"req_id": f"{prefix}-{n}", "modality": "IMAGE", "mm_items": [uris[n % len(uris)]]}
        if push_port is not None:
            out.update(prefill_host="127.0.0.1", embedding_port=push_port)
        return out

    return body


def _message(status: int, body: bytes) -> str:
    if status == 200:
        return ""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body[:300].decode(errors="replace")
    return str(parsed.get("message", "")) if isinstance(parsed, dict) else body[:300].decode(errors="replace")


class ClosedLoop:
    """``clients`` closed-loop clients against ``target`` (a base URL, or ``target(n)`` per request).

    Sends until ``total`` requests went out, ``duration`` seconds passed, or :meth:`stop_new` is
    called (whichever comes first; ``None`` = no such bound); requests in flight are always
    waited for. Run it with ``await loop.run()`` or on a thread of its own with :meth:`start`.
    """

    def __init__(self, target: str | Callable[[int], str], clients: int, body_of: BodyOf, *,
                 path: str = "/encode", headers: dict[str, str] | None = None, total: int | None = None,
                 duration: float | None = None, timeout: float = 120.0, finish: Finish | None = None,
                 stop_after: StopAfter | None = None) -> None:
        self._target = target
        self.clients, self.path, self.timeout = clients, path, timeout
        self._body_of, self._total, self._duration = body_of, total, duration
        self._finish, self._stop_after = finish, stop_after
        self._headers = {"content-type": "application/json", **(headers or {})}
        self.outcomes: list[Outcome] = []
        self.wall = 0.0
        """Seconds from the first request to the last answer of :meth:`run`."""
        self._lock = threading.Lock()  # outcomes are appended on the loop's thread, read from others
        self._stop = threading.Event()
        self._next = 0
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def _url(self, n: int) -> str:
        base = self._target if isinstance(self._target, str) else self._target(n)
        return base + self.path

    async def _client(self, session: aiohttp.ClientSession, index: int, deadline: float) -> None:
        while not self._stop.is_set() and time.monotonic() < deadline:
            n = self._next
            if self._total is not None and n >= self._total:
                return
            self._next = n + 1
            outcome = await self._request(session, index, n)
            with self._lock:
                self.outcomes.append(outcome)
            if self._stop_after is not None and self._stop_after(outcome):
                return

    async def _request(self, session: aiohttp.ClientSession, index: int, n: int) -> Outcome:
        sent = time.monotonic()
        body = self._body_of(n)
        data = body if isinstance(body, bytes) else orjson.dumps(body)
        try:
            async with session.post(self._url(n), data=data, headers=self._headers) as resp:
                answer = Answer(resp.status, resp.headers.get("content-type"), await resp.read())
                retry_after, connection = resp.headers.get("retry-after"), resp.headers.get("connection")
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            unreachable = isinstance(exc, aiohttp.ClientConnectorError)
            return Outcome(index, n, sent, time.monotonic(), type(exc).__name__, None, str(exc), unreachable)
        if answer.status == 200 and self._finish is not None:
            await self._finish(n, answer)
        return Outcome(index, n, sent, time.monotonic(), answer.status, retry_after, _message(answer.status, answer.body),
                       connection=connection)

    async def run(self) -> list[Outcome]:
        """Run the clients to the end; every outcome, in the order answers came."""
        connector = aiohttp.TCPConnector(limit=self.clients)
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            start = time.monotonic()
            deadline = start + self._duration if self._duration is not None else float("inf")
            await asyncio.gather(*(self._client(session, i, deadline) for i in range(self.clients)))
            self.wall = time.monotonic() - start
        return self.answers()

    def answers(self) -> list[Outcome]:
        """Every outcome so far."""
        with self._lock:
            return list(self.outcomes)

    # -- on a thread of its own (tests) --

    def start(self) -> ClosedLoop:
        """Run :meth:`run` on a thread of its own; returns at once."""

        def main() -> None:
            try:
                asyncio.run(self.run())
            except BaseException as exc:  # re-raised by stop(): a broken load must fail the test
                self._error = exc

        self._thread = threading.Thread(target=main, name="closed-loop", daemon=True)
        self._thread.start()
        return self

    def ok(self) -> int:
        """Answers with 200 so far."""
        with self._lock:
            return sum(1 for a in self.outcomes if a.status == 200)

    def wait_ok(self, n: int, timeout: float) -> None:
        """Wait until ``n`` requests were answered 200."""
        deadline = time.monotonic() + timeout
        while self.ok() < n:
            assert time.monotonic() < deadline, f"only {self.ok()} of {n} requests answered 200 in {timeout}s"
            assert self._thread is None or self._thread.is_alive() or self.ok() >= n, \
                f"the load stopped after {self.ok()} of {n} answers 200: {self.answers()[-3:]}"
            time.sleep(0.05)

    def stop_new(self) -> None:
        """Send no new request; those in flight go on."""
        self._stop.set()

    def stop(self) -> list[Outcome]:
        """Stop sending, wait for every request in flight, return every outcome."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timeout + 30)
            assert not self._thread.is_alive(), "the load's clients did not finish"
        if self._error is not None:
            raise self._error
        return self.answers()


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) of ``values``."""
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def summary(latencies: list[float], images: int, wall: float) -> dict[str, float]:
    """Throughput and latency percentiles in milliseconds."""
    return {
        "images_per_s": images / wall,
        "p50_ms": percentile(latencies, 50) * 1000,
        "p99_ms": percentile(latencies, 99) * 1000,
        "mean_ms": statistics.fmean(latencies) * 1000 if latencies else float("nan"),
        "requests": len(latencies),
    }


async def run_load(target: str | Callable[[int], str], body_for: BodyOf, concurrency: int, total: int,
                   items_per_request: int = 1, *, path: str = "/encode", duration: float | None = None,
                   headers: dict[str, str] | None = None, finish: Finish | None = None,
                   timeout: float = 600.0) -> dict[str, Any]:
    """Send ``total`` requests with ``concurrency`` in flight (or fewer, when ``duration`` seconds
    ran out first); throughput counts images, latencies count the requests answered 200, and
    ``errors`` every other outcome."""
    loop = ClosedLoop(target, concurrency, body_for, path=path, headers=headers, total=total,
                      duration=duration, timeout=timeout, finish=finish)
    outcomes = await loop.run()
    latencies = [o.latency for o in outcomes if o.status == 200]
    result: dict[str, Any] = dict(summary(latencies, len(latencies) * items_per_request, loop.wall))
    result.update({"concurrency": concurrency, "errors": len(outcomes) - len(latencies),
                   "client": f"aiohttp {aiohttp.__version__}"})
    return result
