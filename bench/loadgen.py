"""A closed-loop load generator: ``concurrency`` clients, each sending its next request when answered.

The client is aiohttp, the HTTP client SGLang's prefill servers send ``/encode`` with, so the
pod is measured the way its callers reach it. A request counts as done when its answer is in the
client's hands: with ``finish`` that is after ``finish(n, answer)`` returned (decoding an inline
answer into a tensor, or waiting for the pushed embedding), else when the response body was read.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import aiohttp
import orjson

from bench.common import summary

BodyFor = Callable[[int], dict[str, Any]]


@dataclass(frozen=True)
class Answer:
    """One HTTP answer as read by the load generator."""

    status: int
    content_type: str | None
    body: bytes


Finish = Callable[[int, Answer], Awaitable[None]]

ACCEPT = {"json": None, "binary": "application/octet-stream", "push": None}
"""The ``Accept`` header of each way of asking the pod for an embedding (push: answered ``null``)."""


def image_bodies(uris: list[str], prefix: str, push_port: int | None = None) -> BodyFor:
    """Request ``n``'s ``/encode`` body: one IMAGE item (``uris`` in turn), ``req_id`` ``{prefix}-{n}``;
    with ``push_port`` the embedding is pushed to a receiver on this host's port."""

    def body(n: int) -> dict[str, Any]:
        out: dict[str, Any] = {"req_id": f"{prefix}-{n}", "modality": "IMAGE", "mm_items": [uris[n % len(uris)]]}
        if push_port is not None:
            out.update(prefill_host="127.0.0.1", embedding_port=push_port)
        return out

    return body


async def _client(session: aiohttp.ClientSession, url: str, body_for: BodyFor, count: list[int], total: int,
                  out: list[float], errors: list[int], deadline: float, headers: dict[str, str], finish: Finish | None) -> None:
    while True:
        n = count[0]
        if n >= total or time.perf_counter() >= deadline:
            return
        count[0] = n + 1
        start = time.perf_counter()
        async with session.post(url, data=orjson.dumps(body_for(n)), headers=headers) as resp:
            answer = Answer(resp.status, resp.headers.get("content-type"), await resp.read())
        if answer.status != 200:
            errors.append(answer.status)
            continue
        if finish is not None:
            await finish(n, answer)
        out.append(time.perf_counter() - start)


async def run_load(base_url: str, body_for: BodyFor, concurrency: int, total: int, items_per_request: int = 1, *,
                   path: str = "/encode", duration: float | None = None, headers: dict[str, str] | None = None,
                   finish: Finish | None = None) -> dict[str, Any]:
    """Send ``total`` requests with ``concurrency`` in flight; throughput counts images.

    With ``duration`` (seconds), clients stop sending after that long even if fewer than
    ``total`` requests went out (answers still in flight are waited for and counted).
    ``headers`` go with every request; ``finish`` completes each answered one (see the module).
    """
    latencies: list[float] = []
    errors: list[int] = []
    count = [0]
    sent_headers = {"content-type": "application/json", **(headers or {})}
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:
        start = time.perf_counter()
        deadline = start + duration if duration is not None else float("inf")
        await asyncio.gather(*[
            _client(session, base_url + path, body_for, count, total, latencies, errors, deadline, sent_headers, finish)
            for _ in range(concurrency)
        ])
        wall = time.perf_counter() - start
    result: dict[str, Any] = dict(summary(latencies, len(latencies) * items_per_request, wall))
    result.update({"concurrency": concurrency, "errors": len(errors), "client": f"aiohttp {aiohttp.__version__}"})
    return result
