"""A closed-loop load generator: ``concurrency`` clients, each sending its next request when answered."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from bench.common import summary


async def _client(client: httpx.AsyncClient, url: str, body_for, count: list[int], total: int, out: list[float], errors: list[int]) -> None:
    while True:
        n = count[0]
        if n >= total:
            return
        count[0] = n + 1
        start = time.perf_counter()
        resp = await client.post(url, json=body_for(n))
        if resp.status_code == 200:
            out.append(time.perf_counter() - start)
        else:
            errors.append(resp.status_code)


async def run_load(base_url: str, body_for, concurrency: int, total: int, items_per_request: int = 1) -> dict[str, Any]:
    """Send ``total`` requests with ``concurrency`` in flight; throughput counts images."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    latencies: list[float] = []
    errors: list[int] = []
    count = [0]
    async with httpx.AsyncClient(limits=limits, timeout=600) as client:
        start = time.perf_counter()
        await asyncio.gather(*[
            _client(client, base_url + "/encode", body_for, count, total, latencies, errors) for _ in range(concurrency)
        ])
        wall = time.perf_counter() - start
    result = summary(latencies, len(latencies) * items_per_request, wall)
    result.update({"concurrency": concurrency, "errors": len(errors)})
    return result
