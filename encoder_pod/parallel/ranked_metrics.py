"""Metrics in data-parallel mode: the front's own, plus every worker's labelled ``rank="N"``.

Ownership is split so no family is counted twice: the HTTP edge's families
(:class:`~encoder_pod.metrics.EdgeMetrics`) and the ``encoder_dp_*`` families live on the front's
registry; every per-replica family (:class:`~encoder_pod.metrics.ReplicaMetrics`: batches, queue,
forward time, ...) lives in the workers and is merged in with a rank label.
"""

from __future__ import annotations

from typing import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge


class DataParallelMetrics:
    """The ``encoder_dp_*`` families, on the front's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.deaths = Counter(
            "encoder_dp_worker_deaths", "Worker process exits not asked for, by rank and reason.", ["rank", "reason"], registry=r
        )
        self.restarts = Counter("encoder_dp_worker_restarts", "Worker processes started again after a death.", ["rank"], registry=r)
        self.up = Gauge("encoder_dp_worker_up", "1 while the rank takes traffic, else 0.", ["rank"], registry=r)
        self.pending = Gauge(
            "encoder_dp_pending_requests", "Requests sent to the rank and not yet answered.", ["rank"], registry=r
        )
        self.routed = Counter("encoder_dp_routed_requests", "Requests sent to the rank.", ["rank"], registry=r)
        self.waiting = Gauge(
            "encoder_dp_waiting_requests", "Requests waiting at the front for a worker slot (every rank full).", registry=r
        )


def _with_rank(line: str, rank: int) -> str:
    """``name{a="b"} 1`` -> ``name{rank="0",a="b"} 1``; ``name 1`` -> ``name{rank="0"} 1``."""
    space = line.find(" ")
    brace = line.find("{")
    if brace != -1 and (space == -1 or brace < space):
        return f'{line[: brace + 1]}rank="{rank}",{line[brace + 1 :]}'
    return f'{line[:space]}{{rank="{rank}"}}{line[space:]}'


def _families(text: str) -> dict[str, tuple[list[str], list[str]]]:
    """Prometheus text -> {family: (HELP/TYPE lines, sample lines)}, in order."""
    families: dict[str, tuple[list[str], list[str]]] = {}
    current: tuple[list[str], list[str]] | None = None
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            name = line.split(" ", 3)[2]
            current = families.setdefault(name, ([], []))
            current[0].append(line)
        elif line.startswith("#"):
            continue
        elif current is not None:
            current[1].append(line)
    return families


def merge(front: bytes, ranks: Iterable[tuple[int, bytes]]) -> bytes:
    """One exposition: the front's families as they are, then each worker family with a rank label.

    A family the front already has is never taken from a worker (the front owns it).
    """
    out = [front.decode().rstrip("\n")]
    owned = set(_families(out[0]))
    merged: dict[str, tuple[list[str], list[str]]] = {}
    for rank, text in sorted(ranks):
        for name, (head, samples) in _families(text.decode(errors="replace")).items():
            if name in owned:
                continue
            family = merged.setdefault(name, (head, []))
            family[1].extend(_with_rank(s, rank) for s in samples)
    for head, samples in merged.values():
        out.extend(head)
        out.extend(samples)
    return ("\n".join(line for line in out if line) + "\n").encode()
