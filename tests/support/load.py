"""Closed-loop /encode clients that record every outcome (status, timing, Retry-After), for the
drain, probe and hang tests and benchmarks."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

import httpx


@dataclass(frozen=True)
class Answer:
    """One request as its client saw it."""

    client: int
    sent: float
    """When the client started sending it (monotonic)."""
    done: float
    status: int | str
    """The HTTP status, or the name of the httpx exception (no HTTP answer)."""
    retry_after: str | None
    message: str

    @property
    def draining_refusal(self) -> bool:
        """A 503 that says the pod drains and carries ``Retry-After``."""
        return self.status == 503 and self.retry_after is not None and self.message.startswith("draining")


def one_image_body(image: str) -> Callable[[int, int], bytes]:
    """Pre-encoded bodies with the same item for every request, unique req_ids."""
    head, tail = b'{"req_id": "load-', b'", "modality": "IMAGE", "mm_items": [' + json.dumps(image).encode() + b"]}"
    return lambda client, n: head + f"{client}-{n}".encode() + tail


class ClosedLoop:
    """``clients`` threads, each with its own keep-alive connection pool, one request at a time.

    A client stops after a draining refusal (a real client retries on another pod), when it cannot
    connect (the server is gone), or when :meth:`stop_new` / :meth:`stop` is called; requests
    already sent are always waited for.
    """

    def __init__(
        self, base_url: str, clients: int, body_of: Callable[[int, int], dict[str, Any] | bytes], timeout: float = 120
    ) -> None:
        self.base_url, self.timeout, self._body_of = base_url, timeout, body_of
        self.answers: list[Answer] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(clients)
        self._futures = [self._pool.submit(self._client, i) for i in range(clients)]

    def _client(self, index: int) -> None:
        n = 0
        with httpx.Client(timeout=self.timeout) as client:
            while not self._stop.is_set():
                answer = self._post(client, index, n)
                with self._lock:
                    self.answers.append(answer)
                n += 1
                if answer.draining_refusal or answer.status == "ConnectError":
                    return

    def _post(self, client: httpx.Client, index: int, n: int) -> Answer:
        body = self._body_of(index, n)
        sent = time.monotonic()
        try:
            if isinstance(body, bytes):  # pre-encoded: the client's own CPU stays off the measurement
                r = client.post(self.base_url + "/encode", content=body, headers={"content-type": "application/json"})
            else:
                r = client.post(self.base_url + "/encode", json=body)
        except httpx.HTTPError as exc:
            return Answer(index, sent, time.monotonic(), type(exc).__name__, None, str(exc))
        try:
            message = r.json().get("message", "") if r.status_code != 200 else ""
        except ValueError:
            message = r.text[:300]
        return Answer(index, sent, time.monotonic(), r.status_code, r.headers.get("retry-after"), message)

    def ok(self) -> int:
        """Answers with 200 so far."""
        with self._lock:
            return sum(1 for a in self.answers if a.status == 200)

    def wait_ok(self, n: int, timeout: float) -> None:
        """Wait until ``n`` requests were answered 200."""
        deadline = time.monotonic() + timeout
        while self.ok() < n:
            assert time.monotonic() < deadline, f"only {self.ok()} of {n} requests answered 200 in {timeout}s"
            time.sleep(0.05)

    def stop_new(self) -> None:
        """Send no new request; those in flight go on."""
        self._stop.set()

    def stop(self) -> list[Answer]:
        """Stop, wait for every client, return every answer."""
        self._stop.set()
        for future in self._futures:
            future.result()
        self._pool.shutdown()
        return list(self.answers)
