"""Concurrency 1 measured in lockstep: one request of each side in turn, paired step by step.

core_bench's rounds run each side for a few seconds, one after the other. On a shared machine the
speed moves from one second to the next (the ceiling's p50 ranged 45-59 ms within one A/B), and a
round's overhead, the server's p50 minus the ceiling's taken seconds apart, carries that drift:
its quartiles spanned 2.5-11.6 ms in one run. Here every step sends one request to each server
side and has the ceiling encode one image, in an order that rotates from step to step, so the
samples of all sides come from the same moments. A step's overhead is the server's latency minus
the ceiling's in that step; the median over steps is the reading.

Each side idles while the others run (about 50 ms per side at a time), which is concurrency 1 as
sporadic callers make it, not a closed loop that sends the next request the moment the last one
is answered.
"""

from __future__ import annotations

import statistics
import time
from contextlib import AsyncExitStack
from typing import Any, Awaitable, Callable, Protocol

import aiohttp
import orjson

from bench.peers.rounds import rotated
from testkit.load import ACCEPT, image_bodies

Side = tuple[str, str]
"""(server name, mode): a server process asked in one way (json, binary or push)."""


class OneImage(Protocol):
    """The ceiling, one image at a time (core_bench's :class:`~bench.core_bench.CeilingProcess`)."""

    def one(self, index: int) -> float:
        """Seconds to encode image ``index`` in the ceiling's process."""


async def _request_fn(stack: AsyncExitStack, base_url: str, mode: str, uris: list[str],
                      prefix: str) -> Callable[[int], Awaitable[float]]:
    """One timed request of ``mode`` against ``base_url`` (a kept-alive connection), done when the
    embedding is a tensor here, as in core_bench's closed loop."""
    from encoder_pod.receiver import AsyncEmbeddingReceiver, decode_answer

    session = await stack.enter_async_context(aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)))
    rx = await stack.enter_async_context(AsyncEmbeddingReceiver("127.0.0.1", 0)) if mode == "push" else None
    headers = {"content-type": "application/json"}
    if accept := ACCEPT[mode]:
        headers["accept"] = accept
    body_for = image_bodies(uris, prefix, rx.port if rx is not None else None)

    async def one(n: int) -> float:
        body = body_for(n)
        start = time.perf_counter()
        async with session.post(base_url + "/encode", data=orjson.dumps(body), headers=headers) as resp:
            status, content_type, data = resp.status, resp.headers.get("content-type"), await resp.read()
        if status != 200:
            raise RuntimeError(f"{prefix}: request {n} answered {status}: {data[:200]!r}")
        if rx is not None:
            (await rx.wait(body["req_id"], timeout=120)).embedding()
        else:
            decode_answer(content_type, data)
        return time.perf_counter() - start

    return one


async def lockstep(base_urls: dict[str, str], modes: list[str], ceiling: OneImage, uris: list[str],
                   steps: int, first: int = 0) -> dict[str, list[float]]:
    """``steps`` steps of one request per (server, mode) and one ceiling image, the order rotating
    from step to step (starting at ``first``); latencies in ms per side, aligned by step."""
    pairs: list[Side] = [(name, mode) for name in base_urls for mode in modes]
    order: list[Side | None] = [None, *pairs]  # None: the ceiling
    out: dict[str, list[float]] = {"ceiling": [], **{f"{name}-{mode}": [] for name, mode in pairs}}
    async with AsyncExitStack() as stack:
        prefix = f"paired-{time.monotonic_ns()}"
        calls = {side: await _request_fn(stack, base_urls[side[0]], side[1], uris, f"{prefix}-{side[0]}-{side[1]}")
                 for side in pairs}
        for call in calls.values():  # the connection and the receiver set up, outside the timing
            await call(0)
        for step in range(steps):
            for side in rotated(order, first + step):
                if side is None:  # the same image as the servers' requests of this step
                    out["ceiling"].append(ceiling.one(step + 1) * 1e3)
                else:
                    out[f"{side[0]}-{side[1]}"].append(await calls[side](step + 1) * 1e3)
    return out


def summarize_lockstep(sessions: list[dict[str, list[float]]]) -> dict[str, Any]:
    """Per server side: the median over all steps of (its latency minus the ceiling's in the same
    step), with quartiles, and each side's p50 over all steps."""
    merged: dict[str, list[float]] = {}
    for session in sessions:
        for side, values in session.items():
            merged.setdefault(side, []).extend(values)
    ceiling = merged["ceiling"]
    out: dict[str, Any] = {"steps": len(ceiling), "p50_ms": {side: statistics.median(v) for side, v in merged.items()}}
    for side, values in merged.items():
        if side == "ceiling":
            continue
        if len(values) != len(ceiling):
            raise ValueError(f"{side} has {len(values)} steps, the ceiling {len(ceiling)}: they cannot be paired")
        diffs = [s - c for s, c in zip(values, ceiling)]
        q1, _, q3 = statistics.quantiles(diffs, n=4)
        out[f"{side}_overhead_ms"] = {"median": statistics.median(diffs), "q1": q1, "q3": q3}
    return out
