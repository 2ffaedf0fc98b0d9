"""A closed-loop load generator: ``concurrency`` clients, each sending its next request when answered.

A request counts as done when its answer is in the client's hands: with ``finish`` that is after
``finish(n, response)`` returned (decoding an inline answer into a tensor, or waiting for the
pushed embedding), else when the response body was read.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable

import httpx

from bench.common import summary

BodyFor = Callable[[int], dict[str, Any]]
Finish = Callable[[int, httpx.Response], Awaitable[None]]


async def _client(client: httpx.AsyncClient, url: str, body_for: BodyFor, count: list[int], total: int, out: list[float],
                  errors: list[int], deadline: float, headers: dict[str, str] | None, finish: Finish | None) -> None:
    while True:
        n = count[0]
        if n >= total or time.perf_counter() >= deadline:
            return
        count[0] = n + 1
        start = time.perf_counter()
        resp = await client.post(url, json=body_for(n), headers=headers)
        if resp.status_code != 200:
            errors.append(resp.status_code)
            continue
        if finish is not None:
            await finish(n, resp)
        out.append(time.perf_counter() - start)


async def run_load(base_url: str, body_for: BodyFor, concurrency: int, total: int, items_per_request: int = 1, *,
                   path: str = "/encode", duration: float | None = None, headers: dict[str, str] | None = None,
                   finish: Finish | None = None) -> dict[str, Any]:
    """Send ``total`` requests with ``concurrency`` in flight; throughput counts images.

    With ``duration`` (seconds), clients stop sending after that long even if fewer than
    ``total`` requests went out (answers still in flight are waited for and counted).
    ``headers`` go with every request; ``finish`` completes each answered one (see the module).
    """
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    latencies: list[float] = []
    errors: list[int] = []
    count = [0]
    async with httpx.AsyncClient(limits=limits, timeout=600) as client:
        start = time.perf_counter()
        deadline = start + duration if duration is not None else float("inf")
        await asyncio.gather(*[
            _client(client, base_url + path, body_for, count, total, latencies, errors, deadline, headers, finish)
            for _ in range(concurrency)
        ])
        wall = time.perf_counter() - start
    result = summary(latencies, len(latencies) * items_per_request, wall)
    result.update({"concurrency": concurrency, "errors": len(errors)})
    return result
