"""Prometheus metrics of one encoder process, on a registry of its own (no global state).

Two owners, two classes: :class:`ReplicaMetrics` are what one model replica records (queue,
batches, latencies of its stages); :class:`EdgeMetrics` are what the edge records (answers by
status, request latency) for every face's encode requests, :class:`GrpcMetrics` the gRPC face's
calls by method and gRPC status. A single-process pod registers both on one registry; in data
parallel the front holds the edge's and each worker a replica's (merged with a ``rank`` label),
so no family is recorded twice and none is registered where nobody renders it.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from encoder_pod.errors import HTTP_STATUS, ErrorKind

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 180)
_SIZE_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128)
_TOKEN_BUCKETS = (16, 64, 256, 1024, 4096, 16384, 65536, 262144)
_DELIVERY_FAILURE_KINDS = (ErrorKind.TRANSFER_FAILED.value, ErrorKind.TIMEOUT.value)
"""What a delivery to the prefill side fails with: the receiver refused or vanished, or no rank came in time."""


class EdgeMetrics:
    """The edge's families: answered encode requests by status and error kind, their latency, and the
    admission bound they are refused beyond (429). One instance per pod process, shared by the
    faces: HTTP ``/encode``, vLLM's ``/v1/chat/completions`` and gRPC ``Encode`` (a gRPC call under
    the HTTP status of its error kind, a cancelled one as 499; ``encoder_pod.api.answer_counts``)."""

    def __init__(self, registry: CollectorRegistry, max_queue: int | None = None) -> None:
        r = registry
        self.requests = Counter(
            "encoder_requests", "Answered encode requests (/encode, /v1/chat/completions, gRPC Encode) by HTTP status.",
            ["code"], registry=r,
        )
        self.errors = Counter(
            "encoder_request_errors",
            "Answered encode errors (every face) by HTTP status and error kind (overloaded, timeout, worker_died, transfer_failed, "
            "client_gone, ...: what the error message says, in a bounded set of words).",
            ["code", "kind"],
            registry=r,
        )
        self.request_latency = Histogram(
            "encoder_request_seconds", "Total time of an encode request (every face).", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.max_queue = Gauge(
            "encoder_max_queue",
            "ENCODER_MAX_QUEUE: requests admitted and not yet answered beyond which /encode answers 429.",
            registry=r,
        )
        if max_queue is not None:
            self.max_queue.set(max_queue)
        # Every answer code and error kind is exported at 0 from the start, so rate() and increase()
        # count the first 504 or 499 of a pod too (a series born at its first increment shows none).
        # 499/client_gone is the API layer's code for a caller that went away (api.disconnects).
        for code, kind in [(status, kind.value) for kind, status in HTTP_STATUS.items()] + [(499, "client_gone")]:
            self.requests.labels(code=str(code))
            self.errors.labels(code=str(code), kind=kind)
        self.requests.labels(code="200")


class GrpcMetrics:
    """The gRPC face's families: answered calls by method and status code, and their latency."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.calls = Counter(
            "encoder_grpc_calls", "Answered gRPC calls of sglang.grpc.encoder.SglangEncoder by method and status code.",
            ["method", "code"], registry=r,
        )
        self.call_latency = Histogram(
            "encoder_grpc_call_seconds", "Total time of a gRPC call by method.", ["method"], buckets=_LATENCY_BUCKETS, registry=r
        )


class ReplicaMetrics:
    """Every family one model replica records (runtime and batcher)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r, p = self.registry, "encoder"
        self.queue_depth = Gauge(f"{p}_queue_depth", "Requests admitted and not yet in a batch.", registry=r)
        self.inflight = Gauge(f"{p}_inflight_requests", "Requests admitted and not yet answered.", registry=r)
        self.batch_size = Histogram(f"{p}_batch_size", "Requests per batch.", buckets=_SIZE_BUCKETS, registry=r)
        self.batch_items = Histogram(f"{p}_batch_items", "Media items per batch.", buckets=_SIZE_BUCKETS, registry=r)
        self.batch_tokens = Histogram(
            f"{p}_batch_tokens", "Encoder output tokens per batch.", buckets=_TOKEN_BUCKETS, registry=r
        )
        self.queue_wait = Histogram(
            f"{p}_queue_wait_seconds", "Time from admission to joining a batch.", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.decode_latency = Histogram(
            f"{p}_decode_seconds", "Fetch and decode of a request's items.", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.preprocess_latency = Histogram(
            f"{p}_preprocess_seconds", "Processor call per batch.", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.forward_latency = Histogram(
            f"{p}_forward_seconds", "Encoder forward per batch.", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.batch_failures = Counter(
            f"{p}_batch_failures", "Batches that failed and were retried one request at a time.", ["stage"], registry=r
        )
        self.slice_mismatches = Counter(
            f"{p}_slice_mismatch", "Batches whose output rows did not add up to the promised tokens.", registry=r
        )
        self.dropped = Counter(
            f"{p}_dropped_requests", "Requests dropped before compute (caller gone or timed out).", ["reason"], registry=r
        )
        self.items = Counter(
            f"{p}_items", "Media items encoded (cache hits included), by modality.", ["modality"], registry=r
        )
        self.audio_seconds = Counter(
            f"{p}_audio_seconds", "Seconds of audio decoded for encoding (cache hits are not decoded again).", registry=r
        )
        self.delivery_latency = Histogram(
            f"{p}_delivery_seconds",
            "Delivery of one request's embedding, by transfer backend (inline: building the answer; a push or a "
            "pull: until the prefill side has it or the delivery failed).",
            ["backend"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.delivery_failures = Counter(
            f"{p}_delivery_failures",
            "Deliveries to the prefill side that failed, by transfer backend and error kind.",
            ["backend", "kind"],
            registry=r,
        )

    def declare(self, modalities: Iterable[str], backends: Iterable[str]) -> None:
        """Export ``encoder_items_total`` of every modality the model takes and the delivery failures
        of every backend in use at 0 from the start, as the edge does for its answers: a pod's first
        failed push is then visible to rate() and increase() (a series born at 1 shows none)."""
        for modality in modalities:
            self.items.labels(modality=modality)
        for backend in backends:
            for kind in _DELIVERY_FAILURE_KINDS:
                self.delivery_failures.labels(backend=backend, kind=kind)

    def render(self) -> bytes:
        """Prometheus text exposition of this registry."""
        return render(self.registry)


def render(registry: CollectorRegistry) -> bytes:
    """Prometheus text exposition of ``registry``."""
    return generate_latest(registry)
