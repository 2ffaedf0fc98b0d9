"""Cache-aware routing over data-parallel workers: a repeated item goes where it was computed.

Each worker has its own embedding cache. The front remembers, per item affinity key
(:func:`~encoder_pod.rendezvous.affinity_key`), the rank it last sent that item to, in a
bounded LRU of keys only (no rows). A request goes to the rank that holds most of its items
(ties: the one holding the earliest item) when that rank is ready and has a free slot; otherwise
(nothing known, the rank full or down) it is routed by load as before, and its items are
remembered for the rank it got. New items thus spread by load, repeats follow their rows.

Why a directory in the front and not one shared cache there: the workers deliver embeddings
themselves (ZMQ pushes to prefill), so rows in the front would have to cross to a worker anyway,
and the front would hold every rank's bytes in one process; a directory of keys costs a few dozen
bytes per item and no copy. Why not rendezvous hashing as across pods: one front sees every
request, so it can remember exactly, and keep routing misses by load.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Sequence

from prometheus_client import CollectorRegistry, Counter

from encoder_pod.facts import CacheFacts
from encoder_pod.protocol import EncodeRequest
from encoder_pod.rendezvous import affinity_key

DIRECTORY_LIMIT = 1 << 18
"""Keys remembered (about 150 bytes each); the least recently routed go first."""


def request_keys(request: EncodeRequest) -> list[bytes]:
    """The affinity key of every item of ``request``, in order (runs on the front's offload thread)."""
    return [affinity_key(spec.source, spec.content_hash) for spec in request.items]


class KeyRouting:
    """The front's key -> rank directory and its routing counter."""

    def __init__(self, registry: CollectorRegistry, limit: int = DIRECTORY_LIMIT) -> None:
        self._limit = limit
        self._ranks: OrderedDict[bytes, int] = OrderedDict()
        self.routed = Counter(
            "encoder_dp_cache_routed_requests",
            "Requests routed by the data-parallel front with the cache on: to the rank holding their items (key) or by load.",
            ["by"],
            registry=registry,
        )

    def __len__(self) -> int:
        return len(self._ranks)

    def prefer(self, keys: Sequence[bytes]) -> int | None:
        """The rank that was sent most of ``keys`` (ties: the earliest key's), or None if none is known."""
        votes: dict[int, int] = {}
        first: dict[int, int] = {}
        for position, key in enumerate(keys):
            rank = self._ranks.get(key)
            if rank is not None:
                votes[rank] = votes.get(rank, 0) + 1
                first.setdefault(rank, position)
        if not votes:
            return None
        return max(votes, key=lambda rank: (votes[rank], -first[rank]))

    def record(self, keys: Sequence[bytes], rank: int, by_key: bool) -> None:
        """``keys`` went to ``rank`` (``by_key``: because it held them)."""
        self.routed.labels(by="key" if by_key else "load").inc()
        for key in keys:
            self._ranks[key] = rank
            self._ranks.move_to_end(key)
        while len(self._ranks) > self._limit:
            self._ranks.popitem(last=False)


def pod_cache_info(caches: Sequence[CacheFacts], routing: KeyRouting | None) -> dict[str, Any]:
    """/server_info's pod-wide cache: every reporting worker's budget, fill and counters summed, and the directory size."""
    budget, held = sum(c.budget_bytes for c in caches), sum(c.bytes for c in caches)
    return {
        "enabled": routing is not None,
        "budget_bytes": budget,
        "bytes": held,
        "entries": sum(c.entries for c in caches),
        "hits": sum(c.hits for c in caches),
        "misses": sum(c.misses for c in caches),
        "fill": round(held / budget, 4) if budget else 0.0,
        "workers_reporting": len(caches),
        "routing_keys": len(routing) if routing is not None else 0,
    }
