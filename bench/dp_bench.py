"""Data-parallel benchmark: N worker processes behind the front against one process, same machine.

On CPU (default): dp=2 with one torch thread per worker against dp=1 with two threads: the same
two cores, split by process instead of by intra-op threads. On a GPU machine (``--device cuda``):
dp=1 on one GPU, and dp=N on N GPUs when more are visible. Same model, same closed-loop load;
the configurations alternate per concurrency level so a noisy neighbour hits both alike.
Run with ``make bench`` (or ``python -m bench.dp_bench``); writes bench/results/dp_<device>.json
and .png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.common import RESULTS, checkpoint, machine, write_json
from testkit.load import run_load
from testkit.media import jpeg_uri

CONCURRENCY = (1, 4, 16, 64)


def configs(device: str) -> list[dict[str, Any]]:
    """The server configurations compared on ``device``."""
    if device == "cpu":
        return [
            {"name": "dp=1, 2 threads", "dp": 1, "env": {"ENCODER_NUM_THREADS": "2"}},
            {"name": "dp=2, 1 thread each", "dp": 2, "env": {"ENCODER_NUM_THREADS": "1"}},
        ]
    from encoder_pod.parallel.placement import visible_gpus

    gpus = len(visible_gpus(os.environ))
    found = [{"name": "dp=1, 1 GPU", "dp": 1, "env": {}}]
    if gpus > 1:
        found.append({"name": f"dp={gpus}, {gpus} GPUs", "dp": gpus, "env": {}})
    return found


def routed(server: Any, dp: int) -> list[float]:
    """Requests the front sent to each rank so far (empty for dp=1, which has no front)."""
    return [server.metric("encoder_dp_routed_requests_total", f'rank="{r}"') for r in range(dp)] if dp > 1 else []


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_cpu(server: Any, dp: int) -> tuple[float, float]:
    """(front or single process, all processes) CPU seconds of a running server."""
    import httpx

    front = cpu_seconds(server.proc.pid)
    if dp == 1:
        return front, front
    workers = httpx.get(server.base_url + "/server_info", timeout=10).json()["workers"]
    return front, front + sum(cpu_seconds(w["pid"]) for w in workers)


def measure(server: Any, dp: int, body: Any, concurrency: int, total: int) -> dict[str, Any]:
    """One closed-loop run, with the CPU it cost and how the front spread it."""
    before, cpu_before = routed(server, dp), process_cpu(server, dp)
    result = asyncio.run(run_load(server.base_url, body, concurrency, total))
    front, everything = (after - b for after, b in zip(process_cpu(server, dp), cpu_before))
    images = max(1, result["requests"])
    result["routed_per_rank"] = [after - b for after, b in zip(routed(server, dp), before)]
    result["front_cpu_ms_per_image"] = 1000 * front / images if dp > 1 else None
    result["cpu_ms_per_image"] = 1000 * everything / images
    # Other tenants of a small machine move these numbers; the load average says how much.
    result["loadavg_1m"] = os.getloadavg()[0]
    return result


def combine(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each number over the rounds; the rounds themselves are kept."""
    keys = ("images_per_s", "p50_ms", "p99_ms", "mean_ms", "cpu_ms_per_image", "front_cpu_ms_per_image", "loadavg_1m")
    out: dict[str, Any] = {"concurrency": rounds[0]["concurrency"], "rounds": rounds}
    for key in keys:
        values = [r[key] for r in rounds if r.get(key) is not None]
        out[key] = statistics.median(values) if values else None
    out["errors"] = sum(r["errors"] for r in rounds)
    return out


def plot(data: dict[str, Any], path: Path) -> None:
    """Throughput, p50/p99 latency and CPU per image against concurrency, per configuration.

    Bars span the rounds (min to max): on a shared machine the spread is part of the result.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 4))

    def spread(runs: list[dict[str, Any]], key: str) -> tuple[list[float], list[list[float]]]:
        mid = [r[key] for r in runs]
        low = [m - min(x[key] for x in r["rounds"]) for m, r in zip(mid, runs)]
        high = [max(x[key] for x in r["rounds"]) - m for m, r in zip(mid, runs)]
        return mid, [low, high]

    for name, runs in data["runs"].items():
        conc = [r["concurrency"] for r in runs]
        mid, err = spread(runs, "images_per_s")
        color = a.errorbar(conc, mid, yerr=err, fmt="o-", capsize=3, label=name)[0].get_color()
        b.plot(conc, [r["p50_ms"] for r in runs], "o-", color=color, label=f"{name} p50")
        b.plot(conc, [r["p99_ms"] for r in runs], "^:", color=color, label=f"{name} p99")
        mid, err = spread(runs, "cpu_ms_per_image")
        c.errorbar(conc, mid, yerr=err, fmt="o-", capsize=3, color=color, label=f"{name}, all processes")
        if any(r.get("front_cpu_ms_per_image") for r in runs):
            c.plot(conc, [r["front_cpu_ms_per_image"] for r in runs], "s--", color=color, label=f"{name}, front only")
    a.set(xscale="log", xlabel="concurrency", ylabel="images/s", title=f"throughput (median of {data['rounds']} rounds)")
    b.set(xscale="log", yscale="log", xlabel="concurrency", ylabel="ms", title="latency (median of rounds)")
    c.set(xscale="log", xlabel="concurrency", ylabel="CPU ms per image", title="CPU cost", ylim=(0, None))
    for ax in (a, b, c):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"data-parallel, {data['model']} on {data['device']} ({data['machine']['cpu_count']} CPUs)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--arch", default="clip")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--requests-per-client", type=int, default=6)
    parser.add_argument("--min-requests", type=int, default=48)
    parser.add_argument("--concurrency", type=int, nargs="+", default=list(CONCURRENCY))
    parser.add_argument("--rounds", type=int, default=3, help="runs per level and configuration (median kept)")
    parser.add_argument("--replot", action="store_true", help="only redraw the PNG from the existing JSON")
    args = parser.parse_args()
    name = f"dp_{args.device}"
    if args.replot:
        plot(json.loads((RESULTS / f"{name}.json").read_text()), RESULTS / f"{name}.png")
        return
    from testkit.server import EncoderServer

    model = checkpoint(args.arch)
    max_batch = 8
    uris = [jpeg_uri(seed=i) for i in range(8)]
    chosen = configs(args.device)
    data: dict[str, Any] = {
        "model": f"{args.arch}-moderate", "device": args.device, "machine": machine(), "max_batch_size": max_batch,
        "configs": [{"name": c["name"], "dp_size": c["dp"], "env": c["env"]} for c in chosen],
        "rounds": args.rounds,
        "runs": {c["name"]: [] for c in chosen},
    }
    base_env = {"ENCODER_MAX_BATCH_SIZE": str(max_batch), "ENCODER_DEVICE": args.device, "ENCODER_MAX_QUEUE": "4096"}

    def body(n: int) -> dict[str, Any]:
        return {"req_id": f"bench-{time.monotonic_ns()}-{n}", "modality": "IMAGE", "mm_items": [uris[n % 8]]}

    with ExitStack() as stack:
        # Every server is up before the first measurement (an idle server costs ~nothing), so
        # the configurations can alternate per level.
        servers = [
            stack.enter_context(EncoderServer(model, env={**base_env, **c["env"]}, args=["--dp-size", str(c["dp"])]))
            for c in chosen
        ]
        for server in servers:
            asyncio.run(run_load(server.base_url, body, 4, 16))  # warm-up
        for c in args.concurrency:
            total = max(args.min_requests, c * args.requests_per_client)
            per_config: dict[str, list[dict[str, Any]]] = {config["name"]: [] for config in chosen}
            for round_ in range(args.rounds):
                # Alternate the order per round, so neither configuration always runs second.
                order = list(zip(chosen, servers))[:: 1 if round_ % 2 == 0 else -1]
                for config, server in order:
                    result = measure(server, config["dp"], body, c, total)
                    per_config[config["name"]].append(result)
                    print(f"{config['name']:22s} c={c:3d} {result['images_per_s']:7.1f} img/s "
                          f"p50 {result['p50_ms']:8.1f} ms p99 {result['p99_ms']:8.1f} ms "
                          f"cpu {result['cpu_ms_per_image']:6.1f} ms/img errors {result['errors']} "
                          f"routed {result['routed_per_rank']}", flush=True)
            for name, rounds in per_config.items():
                data["runs"][name].append(combine(rounds))
    if args.device == "cpu":
        one, two = (data["runs"][c["name"]] for c in chosen)
        data["dp2_over_dp1_throughput"] = {str(a["concurrency"]): b["images_per_s"] / a["images_per_s"] for a, b in zip(one, two)}
        print("dp=2 / dp=1 throughput (median of rounds):", {k: round(v, 2) for k, v in data["dp2_over_dp1_throughput"].items()})
    write_json(name, data)
    plot(data, RESULTS / f"{name}.png")


if __name__ == "__main__":
    main()
