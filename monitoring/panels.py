"""Every panel of the encoder-pool dashboard, declared once: title, unit and PromQL queries.

The dashboard generator (:mod:`monitoring.dashboard`) turns these into Grafana JSON; the
Prometheus test and the pictures read the queries back from that JSON, so what they prove and
draw is what a user imports.

Labels the queries rely on, set by the scrape (the chart's encoder PodMonitor, or the scrape
config in docs/observability.md): ``pool`` (the pod's ``encoderpool.io/pool`` label),
``namespace`` and ``pod``. The operator's per-pool series carry ``pool_namespace`` and ``pool``
themselves. Grafana variables: ``$pool``, ``$pod`` and ``$__rate_interval``.
"""

from __future__ import annotations

from dataclasses import dataclass

POOL = 'pool=~"$pool"'
POD = 'pool=~"$pool", pod=~"$pod"'
RATE = "$__rate_interval"

STAGES = (
    ("queue", "encoder_queue_wait_seconds"),
    ("decode", "encoder_decode_seconds"),
    ("preprocess", "encoder_preprocess_seconds"),
    ("forward", "encoder_forward_seconds"),
    ("delivery", "encoder_delivery_seconds"),
    ("request", "encoder_request_seconds"),
)
"""Latency stages in the order a request meets them, and the histogram of each (request: end to end)."""


@dataclass(frozen=True)
class Query:
    """One PromQL query of a panel and its legend (Grafana's ``{{label}}`` template)."""

    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    """One dashboard panel."""

    title: str
    description: str
    unit: str
    queries: tuple[Query, ...]
    kind: str = "timeseries"
    """timeseries, heatmap (Prometheus ``le`` buckets) or table (instant values)."""
    width: int = 12


def _quantiles(q: float, labels: str, by: str = "") -> tuple[Query, ...]:
    group = f"{by}, le" if by else "le"
    return tuple(
        Query(f"histogram_quantile({q}, sum by ({group}) (rate({name}_bucket{{{labels}}}[{RATE}])))", stage)
        for stage, name in STAGES
    )


ROWS: tuple[tuple[str, tuple[Panel, ...]], ...] = (
    ("Throughput", (
        Panel("Items per second by modality", "Media items encoded per second (cache hits included), per pool and modality.",
              "ops", (Query(f"sum by (pool, modality) (rate(encoder_items_total{{{POOL}}}[{RATE}]))", "{{pool}} {{modality}}"),),
              width=8),
        Panel("Audio seconds per second", "Seconds of audio decoded per second of wall time, per pool.",
              "short", (Query(f"sum by (pool) (rate(encoder_audio_seconds_total{{{POOL}}}[{RATE}]))", "{{pool}}"),), width=8),
        Panel("Items per second per pod", "The same items per second, per pod.",
              "ops", (Query(f"sum by (pool, pod) (rate(encoder_items_total{{{POD}}}[{RATE}]))", "{{pod}}"),), width=8),
    )),
    ("Latency", (
        Panel("p50 latency by stage", "Median time of each stage: waiting for a batch (queue), fetch and decode, the "
              "processor call, the forward, the delivery to the prefill side, and the whole request.",
              "s", _quantiles(0.5, POOL)),
        Panel("p99 latency by stage", "99th percentile of each stage.", "s", _quantiles(0.99, POOL)),
        Panel("p99 request latency per pod", "99th percentile of whole /encode requests, per pod.", "s",
              (Query(f"histogram_quantile(0.99, sum by (pool, pod, le) (rate(encoder_request_seconds_bucket{{{POD}}}[{RATE}])))",
                     "{{pod}}"),), width=24),
    )),
    ("Batching and admission", (
        Panel("Batch size distribution", "Requests per batch: how full the batches the batcher forms are.", "short",
              (Query(f"sum by (le) (increase(encoder_batch_size_bucket{{{POOL}}}[{RATE}]))", "{{le}}"),), kind="heatmap"),
        Panel("Queue depth and in flight against MAX_QUEUE", "Requests waiting for a batch, requests admitted and not "
              "yet answered, and the admission bound ENCODER_MAX_QUEUE beyond which a pod answers 429, per pod.", "short",
              (Query(f"sum by (pool, pod) (encoder_queue_depth{{{POD}}})", "{{pod}} queued"),
               Query(f"sum by (pool, pod) (encoder_inflight_requests{{{POD}}})", "{{pod}} in flight"),
               Query(f"max by (pool, pod) (encoder_max_queue{{{POD}}})", "{{pod}} MAX_QUEUE"))),
    )),
    ("Errors", (
        Panel("Refusals and errors per second by code", "Answers other than 200: 429 (queue full), 499 (the client "
              "left), 502 (delivery failed), 503 (not ready, draining, a worker died), 504 (REQ_TIMEOUT), per pool.",
              "reqps", (Query(f'sum by (pool, code) (rate(encoder_requests_total{{{POOL}, code!="200"}}[{RATE}]))',
                              "{{pool}} {{code}}"),)),
        Panel("Errors by code and kind", "What the error answers said, per pool: the HTTP code and the error's kind "
              "(overloaded, timeout, worker_died, transfer_failed, client_gone, ...) over the dashboard's time range.",
              "short", (Query(f"sum by (pool, code, kind) (increase(encoder_request_errors_total{{{POOL}}}[$__range]))",
                              "{{pool}} {{code}} {{kind}}"),), kind="table"),
    )),
    ("Cache", (
        Panel("Cache hit ratio", "Items served from the embedding cache over items looked up, per pool.", "percentunit",
              (Query(f"sum by (pool) (rate(encoder_cache_hits_total{{{POOL}}}[{RATE}])) / (sum by (pool) "
                     f"(rate(encoder_cache_hits_total{{{POOL}}}[{RATE}])) + sum by (pool) "
                     f"(rate(encoder_cache_misses_total{{{POOL}}}[{RATE}])))", "{{pool}}"),)),
        Panel("Cache bytes against budget", "Bytes each pod's caches hold, and their budget (ENCODER_CACHE_SIZE_MB).",
              "bytes", (Query(f"sum by (pool, pod) (encoder_cache_bytes{{{POD}}})", "{{pod}} held"),
                        Query(f"sum by (pool, pod) (encoder_cache_budget_bytes{{{POD}}})", "{{pod}} budget"))),
    )),
    ("Workers", (
        Panel("DP worker deaths by reason", "Worker processes that exited unasked (killed, crashed, hung, load_failed), "
              "per pod and rank.", "short",
              (Query(f'sum by (pool, pod, rank, reason) (increase(encoder_dp_worker_deaths_total{{{POD}, '
                     f'reason!="tp_group_down"}}[{RATE}]))', "{{pod}} rank {{rank}} {{reason}}"),), width=8),
        Panel("DP worker restarts", "Workers started again after a death, per pod and rank.", "short",
              (Query(f"sum by (pool, pod, rank) (increase(encoder_dp_worker_restarts_total{{{POD}}}[{RATE}]))",
                     "{{pod}} rank {{rank}}"),), width=8),
        Panel("TP group restarts", "Tensor-parallel groups that went down (a rank died, a collective failed or timed "
              "out) and were restarted whole, per pod and DP rank.", "short",
              (Query(f'sum by (pool, pod, rank) (increase(encoder_dp_worker_deaths_total{{{POD}, '
                     f'reason="tp_group_down"}}[{RATE}]))', "{{pod}} rank {{rank}}"),), width=8),
    )),
    ("Delivery", (
        Panel("Delivery failures by backend", "Embeddings that could not be delivered to the prefill side, per pool, "
              "transfer backend and error kind.", "ops",
              (Query(f"sum by (pool, backend, kind) (rate(encoder_delivery_failures_total{{{POOL}}}[{RATE}]))",
                     "{{pool}} {{backend}} {{kind}}"),)),
        Panel("Delivery p99 by backend", "99th percentile of a delivery, per pool and transfer backend.", "s",
              (Query(f"histogram_quantile(0.99, sum by (pool, backend, le) (rate(encoder_delivery_seconds_bucket{{{POOL}}}"
                     f"[{RATE}])))", "{{pool}} {{backend}}"),)),
    )),
    ("Operator", (
        Panel("Reconciles per second by result", "The operator's reconciles: ok, waiting (children not settled), failed "
              "(InvalidSpec, ApplyFailed) and error (an exception).", "ops",
              (Query(f"sum by (result) (rate(encoderpool_operator_reconciles_total[{RATE}]))", "{{result}}"),), width=8),
        Panel("Reconcile errors by type", "Reconciles that raised, by the operator's error type (the API server "
              "unreachable or timing out, a conflict).", "ops",
              (Query(f"sum by (error) (rate(encoderpool_operator_reconcile_errors_total[{RATE}]))", "{{error}}"),), width=8),
        Panel("Pools by status reason", "How many pools report each reason (the leader's view).", "short",
              (Query("max by (reason) (encoderpool_operator_pools)", "{{reason}}"),), width=8),
        Panel("Pool replicas: ready and desired", "Each pool's ready pods against spec.replicas.", "short",
              (Query(f"max by (pool_namespace, pool, state) (encoderpool_operator_pool_replicas{{{POOL}}})",
                     "{{pool_namespace}}/{{pool}} {{state}}"),), width=24),
    )),
)
