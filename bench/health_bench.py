"""/health latency while the pod is saturated: what SGLang's bootstrap eviction probe sees.

SGLang's ``EncoderBootstrapServer`` probes each registered encoder's ``/health`` every 10 s with a
2 s timeout and evicts it after three misses in a row. This drives a pod with 64 concurrent
closed-loop clients for a while and probes ``/health`` four times a second the way the bootstrap
does (a fresh connection, a 2 s timeout), before, during and after the load.
Run with ``make bench`` (or ``python -m bench.health_bench``); writes bench/results/health_<device>.json and .png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common import RESULTS, checkpoint, machine, write_json
from testkit.load import percentile, run_load
from testkit.media import jpeg_uri

PROBE_TIMEOUT_S = 2.0  # SGLANG_ENCODER_BOOTSTRAP_HEALTH_CHECK_TIMEOUT's default
PROBE_EVERY_S = 0.25


async def _probe(base_url: str, started: float, out: list[dict[str, Any]], stop: asyncio.Event) -> None:
    while not stop.is_set():
        t0 = time.perf_counter()
        try:
            async with httpx.AsyncClient(timeout=PROBE_TIMEOUT_S) as client:  # the bootstrap opens a session per round
                code: int | None = (await client.get(base_url + "/health")).status_code
        except httpx.HTTPError:
            code = None
        out.append({"at_s": round(t0 - started, 3), "ms": round((time.perf_counter() - t0) * 1000, 2), "status": code})
        await asyncio.sleep(PROBE_EVERY_S)


async def measure(base_url: str, concurrency: int, total: int, idle_s: float = 3.0) -> dict[str, Any]:
    """Probe through an idle phase, a load phase of ``total`` requests at ``concurrency``, and an idle phase."""
    image = jpeg_uri()
    probes: list[dict[str, Any]] = []
    stop = asyncio.Event()
    started = time.perf_counter()
    prober = asyncio.ensure_future(_probe(base_url, started, probes, stop))
    await asyncio.sleep(idle_s)
    load_from = time.perf_counter() - started
    load = await run_load(base_url, lambda n: {"req_id": f"h-{n}", "modality": "IMAGE", "mm_items": [image]}, concurrency, total)
    load_to = time.perf_counter() - started
    await asyncio.sleep(idle_s)
    stop.set()
    await prober
    under = [p for p in probes if load_from <= p["at_s"] <= load_to]
    ok = [p["ms"] for p in under if p["status"] == 200]
    return {
        "load": load,
        "load_window_s": [round(load_from, 2), round(load_to, 2)],
        "probes_under_load": len(under),
        "missed_under_load": len(under) - len(ok),
        "health_ms_under_load": {"p50": percentile(ok, 50), "p99": percentile(ok, 99), "max": max(ok, default=float("nan"))},
        "probes": probes,
    }


def plot(data: dict[str, Any], path: Path) -> None:
    """Probe latency over time, the load window shaded, the 2 s timeout drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    probes = data["result"]["probes"]
    ax.plot([p["at_s"] for p in probes], [p["ms"] for p in probes], ".-", lw=0.8, label="GET /health")
    lo, hi = data["result"]["load_window_s"]
    ax.axvspan(lo, hi, alpha=0.15, label=f"{data['concurrency']} concurrent /encode clients")
    ax.axhline(PROBE_TIMEOUT_S * 1000, color="r", ls="--", lw=1, label="SGLang probe timeout (2 s)")
    ax.set_yscale("log")
    ax.set_xlabel("seconds")
    ax.set_ylabel("ms")
    ax.set_title(f"/health under load ({data['model']})")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="clip")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--total", type=int, default=640)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    from testkit.server import EncoderServer

    model = checkpoint(args.arch)
    with EncoderServer(model, env={"ENCODER_DEVICE": args.device, "ENCODER_MAX_QUEUE": "4096"}) as pod:
        result = asyncio.run(measure(pod.base_url, args.concurrency, args.total))
    name = f"health_{args.device}"
    data = {"machine": machine(), "model": f"{args.arch} moderate", "concurrency": args.concurrency, "result": result}
    write_json(name, data)
    plot(json.loads((RESULTS / f"{name}.json").read_text()), RESULTS / f"{name}.png")
    summary = {k: v for k, v in result.items() if k != "probes"}
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
