"""The cache's Prometheus families, on the replica's registry (merged with ``rank`` in data parallel)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from encoder_pod.cache.store import EmbeddingStore


class CacheMetrics:
    """Hits, misses, single-flight waits, evictions, bytes, entries and the budget."""

    def __init__(self, registry: CollectorRegistry, store: EmbeddingStore) -> None:
        r, p = registry, "encoder_cache"
        self.counts = {"hits": 0, "misses": 0, "single_flight_waits": 0}
        """The counters' values, for /server_info."""
        self._counters = {
            "hits": Counter(f"{p}_hits", "Items served from the embedding cache (no decode, preprocess or forward).", registry=r),
            "misses": Counter(f"{p}_misses", "Items computed because the cache did not hold them.", registry=r),
            "single_flight_waits": Counter(
                f"{p}_single_flight_waits", "Items that waited for the same item's computation already under way.", registry=r
            ),
        }
        self._evictions = Counter(f"{p}_evictions", "Entries evicted to stay within the byte budget.", registry=r)
        self._seen_evictions = 0
        self._store = store
        Gauge(f"{p}_bytes", "Bytes the cache holds (rows plus a fixed overhead per entry).", registry=r).set_function(
            lambda: float(store.bytes)
        )
        Gauge(f"{p}_entries", "Items the cache holds.", registry=r).set_function(lambda: float(len(store)))
        Gauge(f"{p}_budget_bytes", "The cache's byte budget (ENCODER_CACHE_SIZE_MB; 0 = off).", registry=r).set_function(
            lambda: float(store.budget_bytes)
        )

    def count(self, name: str) -> None:
        """One more of ``hits``, ``misses`` or ``single_flight_waits``."""
        self.counts[name] += 1
        self._counters[name].inc()

    def sync(self) -> None:
        """Carry the store's eviction count over to its counter (call after puts)."""
        new = self._store.stats.evictions - self._seen_evictions
        if new > 0:
            self._evictions.inc(new)
            self._seen_evictions += new
