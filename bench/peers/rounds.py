"""Pure helpers of the peer comparison: the order of alternating rounds and their summary."""

from __future__ import annotations

import statistics
from typing import Any, Sequence, TypeVar

T = TypeVar("T")

METRICS = ("images_per_s", "p50_ms", "p99_ms")


def rotated(items: Sequence[T], shift: int) -> list[T]:
    """``items`` rotated left by ``shift``: who goes first changes from one point to the next."""
    if not items:
        return []
    k = shift % len(items)
    return [*items[k:], *items[:k]]


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and [min, max] of each metric over the rounds of one (stack, concurrency) point.

    Each metric's median is taken on its own (the median throughput and the median p50 may come
    from different rounds); the rounds are kept as measured.
    """
    if not runs:
        raise ValueError("no rounds to summarize")
    out: dict[str, Any] = {"concurrency": runs[0]["concurrency"], "rounds": runs}
    for metric in METRICS:
        values = [float(r[metric]) for r in runs if metric in r]
        if values:
            out[metric] = statistics.median(values)
            out[f"{metric}_range"] = [min(values), max(values)]
    for extra in ("cpu_s_per_image", "background_cpu_cores", "loadavg_1m"):
        values = [float(r[extra]) for r in runs if r.get(extra) is not None]
        if values:
            out[extra] = statistics.median(values)
    out["errors"] = sum(int(r.get("errors", 0)) for r in runs)
    return out


def ratio_table(points: dict[str, dict[int, dict[str, Any]]], base: str) -> dict[str, dict[int, float]]:
    """``{stack: {concurrency: median img/s of stack / median img/s of base}}`` for every other stack."""
    out: dict[str, dict[int, float]] = {}
    for stack, by_c in points.items():
        if stack == base:
            continue
        out[stack] = {c: by_c[c]["images_per_s"] / points[base][c]["images_per_s"]
                      for c in by_c if c in points[base] and points[base][c]["images_per_s"] > 0}
    return out
