"""Every face's answers in the edge's two counters, under the HTTP code /encode's error table gives.

``encoder_requests_total{code}`` and ``encoder_request_errors_total{code,kind}`` (and the
``encoder_request_seconds`` histogram) count an encode request whichever way it came: HTTP
``/encode``, vLLM's ``/v1/chat/completions``, gRPC ``Encode``. A gRPC refusal is counted under the
HTTP status of its error kind (both faces answer from the same :class:`~encoder_pod.errors.ErrorKind`,
so the code is exact, no label needed), a cancelled call as 499 ``client_gone``, as an HTTP client
that disconnects. One series set per pod, so the dashboard's error panels and the 429-ratio and
latency alerts see every face's traffic without a query changing; the gRPC status codes themselves
stay in ``encoder_grpc_calls_total{method,code}``.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager
from typing import AsyncIterator

from starlette.requests import ClientDisconnect

from encoder_pod.api.disconnects import CLIENT_GONE
from encoder_pod.errors import EncoderError
from encoder_pod.metrics import EdgeMetrics

OK = 200


def answer_labels(exc: BaseException | None) -> tuple[int, str]:
    """The ``code`` and ``kind`` labels of an answer: (200, "") for none, (499, "client_gone") for a
    caller that went away, the error kind's HTTP status for an :class:`EncoderError`, else 500."""
    if exc is None:
        return OK, ""
    if isinstance(exc, (ClientDisconnect, asyncio.CancelledError)):
        return CLIENT_GONE, "client_gone"
    if isinstance(exc, EncoderError):
        return exc.http_status, exc.kind.value
    return 500, "internal"


def count_answer(metrics: EdgeMetrics, exc: BaseException | None, started: float) -> None:
    """One answered request (``exc`` is what it failed with, None on success), begun at ``started``."""
    code, kind = answer_labels(exc)
    metrics.requests.labels(code=str(code)).inc()
    if kind:
        metrics.errors.labels(code=str(code), kind=kind).inc()
    metrics.request_latency.observe(time.perf_counter() - started)


@asynccontextmanager
async def counted(metrics: EdgeMetrics) -> AsyncIterator[None]:
    """Count the request answered inside: a success, or what it raised (re-raised for the error table)."""
    started = time.perf_counter()
    failed: BaseException | None = None
    try:
        yield
    except BaseException as exc:
        failed = exc
        raise
    finally:
        count_answer(metrics, failed, started)
