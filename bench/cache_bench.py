"""Embedding-cache benchmark: a repeat trace with the cache on and off, one pod and a 3-pod pool.

The trace: requests of one image each, drawn from a Zipf distribution over 1,000 images with the
exponent chosen so that about half of the requests repeat an image seen earlier in the trace.
Every run draws its images afresh (a new image set per run, the same trace shape), so no run
starts with a cache warmed by another.

Configurations, alternated within each round (medians over rounds are reported):

- single pod, cache off (``ENCODER_CACHE_SIZE_MB=0``) vs on;
- a 3-pod pool, cache on, requests routed by cache affinity (the receiver library's rendezvous
  rule over the pods) vs uniformly at random;
- a no-repeat trace (every image new): cache size 0 vs the pre-cache code (``--baseline-tree``, a
  checkout of the revision before the cache, when given) vs the cache on (the cost of hashing
  and copying rows when nothing ever hits).

Run ``python -m bench.cache_bench`` (writes bench/results/cache_cpu.json and .png).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable

import httpx
import numpy as np

from bench.common import RESULTS, checkpoint, machine, write_json
from testkit.load import run_load
from testkit.media import jpeg_uri

N_IMAGES = 1000
REPEAT_TARGET = 0.5


def zipf_exponent(n: int, length: int, repeat: float) -> float:
    """The Zipf exponent over ``n`` items whose trace of ``length`` draws repeats ``repeat`` of them (expected)."""
    ranks = np.arange(1, n + 1, dtype=np.float64)

    def repeats(s: float) -> float:
        p = ranks**-s
        p /= p.sum()
        distinct = float(np.sum(1 - (1 - p) ** length))
        return 1 - distinct / length

    lo, hi = 0.0, 3.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if repeats(mid) < repeat else (lo, mid)
    return (lo + hi) / 2


def trace(length: int, exponent: float, seed: int) -> list[int]:
    """Image indices of one trace (Zipf over :data:`N_IMAGES`)."""
    ranks = np.arange(1, N_IMAGES + 1, dtype=np.float64)
    p = ranks**-exponent
    p /= p.sum()
    return np.random.default_rng(seed).choice(N_IMAGES, size=length, p=p).tolist()


def repeat_ratio(indices: list[int]) -> float:
    """Share of requests whose image appeared earlier in the trace."""
    return 1 - len(set(indices)) / len(indices)


def images(indices: list[int], run: int) -> dict[int, str]:
    """The JPEGs of one run: image i of run r is seeded by (r, i), so runs never share images."""
    return {i: jpeg_uri(seed=run * 100_000 + i) for i in set(indices)}


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of these processes (all their threads) so far."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def scrape(urls: list[str], name: str) -> float:
    """Sum of a metric over pods."""
    total = 0.0
    for url in urls:
        for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                total += float(line.rsplit(" ", 1)[1])
    return total


async def replay(pick: Callable[[int, str], str], indices: list[int], uris: dict[int, str], concurrency: int) -> dict[str, Any]:
    """Replay the trace in order with ``concurrency`` closed-loop clients; ``pick(n, item)`` is the pod URL."""
    run = time.monotonic_ns()

    def body(n: int) -> dict[str, Any]:
        return {"req_id": f"cache-bench-{run}-{n}", "modality": "IMAGE", "mm_items": [uris[indices[n]]]}

    return await run_load(lambda n: pick(n, uris[indices[n]]), body, concurrency, len(indices))


def round_robin(urls: list[str]) -> Callable[[int, str], str]:
    """Request n goes to pod n mod len(urls) (warm-up)."""
    return lambda n, item: urls[n % len(urls)]


def run_config(
    name: str, pods: list[Any], routing: str, indices: list[int], run: int, concurrency: int
) -> dict[str, Any]:
    """One run of one configuration on a fresh image set; hit ratio from the pods' own counters,
    CPU time from the pods' own processes (steadier than wall time on a shared machine)."""
    from encoder_pod.rendezvous import affinity_key, choose

    urls = [pod.base_url for pod in pods]
    pids = [pod.proc.pid for pod in pods]
    uris = images(indices, run)
    rng = random.Random(run)
    if routing == "affinity":
        owner = {item: urls[choose(affinity_key(item), urls)] for item in uris.values()}
        pick: Callable[[int, str], str] = lambda n, item: owner[item]  # noqa: E731
    elif routing == "random":
        pick = lambda n, item: rng.choice(urls)  # noqa: E731
    else:
        pick = lambda n, item: urls[0]  # noqa: E731
    hits0, cpu0 = scrape(urls, "encoder_cache_hits_total"), cpu_seconds(pids)
    result = asyncio.run(replay(pick, indices, uris, concurrency))
    cpu = cpu_seconds(pids) - cpu0
    hits = scrape(urls, "encoder_cache_hits_total") - hits0
    result.update({"config": name, "hit_ratio": hits / len(indices), "repeat_ratio": repeat_ratio(indices),
                   "cpu_ms_per_image": 1000 * cpu / max(result["requests"], 1), "loadavg_1m": os.getloadavg()[0]})
    print(f"run {run:3d} {name:28s} {result['images_per_s']:6.1f} img/s  p50 {result['p50_ms']:7.1f} ms  "
          f"cpu {result['cpu_ms_per_image']:6.1f} ms/img  hits {result['hit_ratio']:.2f}  load {result['loadavg_1m']:.1f}", flush=True)
    return result


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per metric median over rounds, with the range."""
    out: dict[str, Any] = {"config": runs[0]["config"], "rounds": runs}
    for key in ("images_per_s", "p50_ms", "p99_ms", "cpu_ms_per_image", "hit_ratio", "repeat_ratio", "loadavg_1m"):
        values = sorted(r[key] for r in runs)
        out[key] = float(np.median(values))
        out[key + "_range"] = [values[0], values[-1]]
    return out


def plot(data: dict[str, Any], path: Path) -> None:
    """Throughput and p50 per configuration (median over rounds, range as error bars)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = data["results"]
    names = [r["config"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    panels = ((axes[0], "images_per_s", "images/s"), (axes[1], "p50_ms", "p50 ms"), (axes[2], "cpu_ms_per_image", "pod CPU ms per image"))
    for ax, key, label in panels:
        values = [r[key] for r in rows]
        low = [r[key] - r[key + "_range"][0] for r in rows]
        high = [r[key + "_range"][1] - r[key] for r in rows]
        ax.barh(names, values, xerr=[low, high], color=["#8aa" if "off" in n or "size 0" in n or "pre-cache" in n else "#49c" for n in names])
        ax.set(xlabel=label)
        ax.invert_yaxis()
        ax.grid(True, axis="x", alpha=0.3)
    axes[1].set_yticklabels([])
    axes[2].set_yticklabels([])
    fig.suptitle(f"embedding cache, {data['model']}, trace of {data['trace_length']} requests "
                 f"(Zipf s={data['zipf_exponent']:.2f} over {N_IMAGES} images, {data['repeat_ratio']:.0%} repeats), "
                 f"median of {data['rounds']} rounds")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--arch", default="clip")
    parser.add_argument("--length", type=int, default=400, help="requests per trace")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--cache-mb", type=int, default=1024)
    parser.add_argument("--baseline-tree", type=Path, default=None, help="source tree of the revision before the cache")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the pods on the way out
    from testkit.server import EncoderServer

    model = checkpoint(args.arch)
    exponent = zipf_exponent(N_IMAGES, args.length, REPEAT_TARGET)
    shape = trace(args.length, exponent, seed=14)
    fresh = list(range(args.length))  # the no-repeat trace
    base_env = {"ENCODER_MAX_BATCH_SIZE": "8", "ENCODER_MAX_QUEUE": "4096", "ENCODER_DEVICE": "cpu"}
    on = {**base_env, "ENCODER_CACHE_SIZE_MB": str(args.cache_mb)}
    off = {**base_env, "ENCODER_CACHE_SIZE_MB": "0"}
    pool_env = {**on, "ENCODER_NUM_THREADS": "1"}
    servers = {
        "off": EncoderServer(model, env=off),
        "on": EncoderServer(model, env=on),
        **{f"pool{i}": EncoderServer(model, env=pool_env) for i in range(3)},
    }
    if args.baseline_tree is not None:
        tree = str(args.baseline_tree.resolve())
        servers["baseline"] = EncoderServer(model, env={**base_env, "PYTHONPATH": tree})
    configs: list[tuple[str, list[Any], str, list[int]]] = []
    try:
        for server in servers.values():
            server.start(wait_ready=False)
        for server in servers.values():
            server.wait_status("/health", 200, 300)
        pool = [servers[f"pool{i}"] for i in range(3)]
        configs = [
            ("single pod, cache off", [servers["off"]], "single", shape),
            ("single pod, cache on", [servers["on"]], "single", shape),
            ("3 pods, cache on, random", pool, "random", shape),
            ("3 pods, cache on, affinity", pool, "affinity", shape),
            ("no repeats, cache size 0", [servers["off"]], "single", fresh),
            ("no repeats, cache on", [servers["on"]], "single", fresh),
        ]
        if "baseline" in servers:
            configs.insert(5, ("no repeats, pre-cache code", [servers["baseline"]], "single", fresh))
        warm = images(list(range(16)), run=999)
        for _, pods, _, _ in configs:
            asyncio.run(replay(round_robin([p.base_url for p in pods]), list(range(16)), warm, 4))
        runs: dict[str, list[dict[str, Any]]] = {}
        for r in range(args.rounds):
            shift = r % len(configs)  # each round starts elsewhere, so load drift spreads over configurations
            for k, (name, pods, routing, indices) in enumerate(configs[shift:] + configs[:shift]):
                runs.setdefault(name, []).append(run_config(name, pods, routing, indices, 1 + r * 100 + k, args.concurrency))
    finally:
        for server in servers.values():
            server.stop()
    results = [median_of(runs[name]) for name, *_ in configs]
    by = {r["config"]: r for r in results}
    summary = {
        "speedup_single": by["single pod, cache on"]["images_per_s"] / by["single pod, cache off"]["images_per_s"],
        "p50_ratio_single": by["single pod, cache on"]["p50_ms"] / by["single pod, cache off"]["p50_ms"],
        "speedup_pool_affinity_vs_random": by["3 pods, cache on, affinity"]["images_per_s"] / by["3 pods, cache on, random"]["images_per_s"],
        "cpu_per_image_ratio_single": by["single pod, cache on"]["cpu_ms_per_image"] / by["single pod, cache off"]["cpu_ms_per_image"],
        "size0_vs_on_no_repeat": by["no repeats, cache size 0"]["images_per_s"] / by["no repeats, cache on"]["images_per_s"],
        "cpu_size0_vs_on_no_repeat": by["no repeats, cache size 0"]["cpu_ms_per_image"] / by["no repeats, cache on"]["cpu_ms_per_image"],
    }
    if "no repeats, pre-cache code" in by:
        size0, pre = by["no repeats, cache size 0"], by["no repeats, pre-cache code"]
        summary["size0_vs_pre_cache_no_repeat"] = size0["images_per_s"] / pre["images_per_s"]
        summary["cpu_size0_vs_pre_cache_no_repeat"] = size0["cpu_ms_per_image"] / pre["cpu_ms_per_image"]
    baseline = args.baseline_tree / "REVISION" if args.baseline_tree is not None else None
    data = {
        "baseline_revision": baseline.read_text().strip() if baseline is not None and baseline.is_file() else None,
        "model": f"{args.arch}-moderate", "device": "cpu", "machine": machine(), "trace_length": args.length,
        "zipf_exponent": exponent, "repeat_ratio": repeat_ratio(shape), "images": N_IMAGES, "rounds": args.rounds,
        "concurrency": args.concurrency, "cache_mb": args.cache_mb, "results": results, "summary": summary,
    }
    print({k: round(v, 3) for k, v in summary.items()})
    write_json("cache_cpu", data)
    plot(data, RESULTS / "cache_cpu.png")


if __name__ == "__main__":
    main()
