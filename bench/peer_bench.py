"""Peer comparison: the encoder pod, infinity-emb, Ray Serve and the in-process ceiling, one run.

Same CLIP tower (the ``clip`` moderate checkpoint of bench.common.checkpoint), same 640x480
JPEGs, same closed-loop client (testkit.load), concurrency 1, 4 and 16, batches of at most 8
everywhere. The three servers are up together; each round visits every concurrency level and,
at each level, every stack in an order that rotates from one level and round to the next, so a
noisy neighbour on a shared machine hits all stacks alike; the median round is reported with the
range. infinity-emb and Ray Serve run from their own virtual environments under
``$ENCODERPOOL_CACHE/peers/`` (created with uv when missing, with the project's torch and no
torchvision). Before timing, one image's answer from each stack is compared with Hugging Face's
own model output (bench/peers/reference.py).

    .venv/bin/python -m bench.peer_bench                  # writes bench/results/peers_cpu.json/.png
    .venv/bin/python -m bench.peer_bench --device cuda    # the GPU variant: peers_cuda.json/.png
"""

from __future__ import annotations

import argparse
import asyncio
import os
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.common import CACHE, RESULTS, checkpoint, machine, write_json
from bench.core_bench import ceiling
from bench.peers import reference, stacks, venvs
from bench.peers.rounds import ratio_table, rotated, summarize
from testkit.load import run_load
from testkit.media import jpeg_uri

CONCURRENCY = (1, 4, 16)
MAX_BATCH = 8
CEILING = "ceiling"
PEERS = ("encoder-pod", "infinity-emb", "ray-serve")


def keep_layers(tower: Path) -> int:
    """Encoder layers the pod computes for CLIP (up to LLaVA's penultimate hidden state)."""
    import json

    from encoder_pod.models.clip import CLIP_FEATURE_LAYER

    return int(json.loads((tower / "config.json").read_text())["num_hidden_layers"]) + 1 + CLIP_FEATURE_LAYER


def full_checkpoint(python: Path, tower: Path, layers: int) -> Path:
    """The CLIPModel checkpoint infinity-emb loads, built once by its own interpreter."""
    import subprocess

    out = CACHE / "peers" / "models" / f"{tower.name}-full-{layers}"
    if not (out / "config.json").is_file():
        script = Path(__file__).resolve().parent / "peers" / "clip_full.py"
        subprocess.run([str(python), str(script), "--tower", str(tower), "--out", str(out),
                        "--keep-layers", str(layers)], check=True)
    return out


def check_outputs(running: dict[str, stacks.Running], tower: Path, full: Path | None, device: str,
                  uri: str) -> list[dict[str, Any]]:
    """Each stack's answer for image 0 against the reference (fp32 CPU Hugging Face)."""
    ref = reference.reference_outputs(tower, full, uri)
    rel = 5e-2 if device == "cuda" else 1e-4  # bf16 on a GPU, fp32 on the CPU
    checks = []
    for name, run in running.items():
        body = stacks.fetch_one(run)
        if name == "infinity-emb":
            got, want, what = reference.decode_infinity(body), ref["pooled"], (
                "normalised visual projection of post_layernorm(CLS of hidden_states[-2]), 1 image")
        else:
            got, want, what = reference.decode_rows(body), ref["rows"], "patch rows hidden_states[-2][:, 1:], 1 image"
        tol = rel * max(1.0, float(abs(want).max()))
        checks.append(reference.compare(name, what, got, want, tol))
    checks.append(reference.compare(CEILING, "patch rows from the pod's adapter called in-process, 1 image",
                                    ceiling_rows(tower, device, uri), ref["rows"],
                                    rel * max(1.0, float(abs(ref["rows"]).max()))))
    return checks


def ceiling_rows(tower: Path, device: str, uri: str) -> Any:
    """The rows the ceiling computes for ``uri`` (the pod's adapter, no server)."""
    import base64

    import numpy as np

    from encoder_pod.media.images import decode_image
    from encoder_pod.modality import Modality
    from encoder_pod.models.base import MediaItem
    from encoder_pod.models.registry import load_adapter
    from encoder_pod.settings import load_settings

    adapter = load_adapter(load_settings(env={"ENCODER_MODEL_PATH": str(tower), "ENCODER_DEVICE": device}).model)
    item = MediaItem(Modality.IMAGE, decode_image(base64.b64decode(uri.split(",", 1)[1]), 40_000_000))
    adapter.measure(item)
    rows = adapter.forward(adapter.preprocess([[item]]))
    return np.asarray(rows.float().cpu().numpy(), dtype=np.float32)


def measure_server(run: stacks.Running, others: list[stacks.Running], concurrency: int, duration: float) -> dict[str, Any]:
    """One closed-loop point against ``run``; CPU of the server, of the idle others, of the client."""
    mine, rest, client = run.cpu_seconds(), sum(o.cpu_seconds() for o in others), os.times()
    res = asyncio.run(run_load(run.base_url, run.body_for, concurrency, 10**9, path=run.path, duration=duration))
    wall = res["requests"] / res["images_per_s"] if res["images_per_s"] else duration
    after_client = os.times()
    res["cpu_s_per_image"] = (run.cpu_seconds() - mine) / max(1, res["requests"])
    res["background_cpu_cores"] = (sum(o.cpu_seconds() for o in others) - rest) / wall
    res["client_cpu_cores"] = (after_client.user + after_client.system - client.user - client.system) / wall
    res["loadavg_1m"] = os.getloadavg()[0]
    return res


def measure_ceiling(tower: Path, others: list[stacks.Running], concurrency: int, duration: float,
                    rate: float, device: str) -> dict[str, Any]:
    """core_bench's ceiling for about ``duration`` seconds at the last measured ``rate``."""
    images = max(2 * min(concurrency, MAX_BATCH), int(duration * rate))
    rest = sum(o.cpu_seconds() for o in others)
    res = ceiling(tower, concurrency, images, MAX_BATCH, device)
    wall = res["requests"] * res["batch"] / res["images_per_s"]  # "requests" counts batches here
    res["background_cpu_cores"] = (sum(o.cpu_seconds() for o in others) - rest) / wall
    res["loadavg_1m"] = os.getloadavg()[0]
    return res


def start_all(stack: ExitStack, wanted: list[str], tower: Path, device: str, args_threads: int, uris: list[str],
              notes: dict[str, Any]) -> tuple[dict[str, stacks.Running], Path | None]:
    """Start the wanted servers (peers' venvs and checkpoint first); a peer that cannot is noted."""
    from testkit.server import free_port

    layers, threads = keep_layers(tower), args_threads
    envs = venvs.peer_envs()
    running: dict[str, stacks.Running] = {}
    full: Path | None = None
    if "encoder-pod" in wanted:
        running["encoder-pod"] = stacks.start_pod(stack, tower, device, MAX_BATCH, threads, uris)
    for name, env_name in (("infinity-emb", "infinity"), ("ray-serve", "ray")):
        if name not in wanted:
            continue
        try:
            python = venvs.ensure(envs[env_name])
            notes.setdefault("versions", {})[name] = venvs.installed_versions(
                python, ("infinity-emb", "ray", "torch", "transformers", "torchvision", "numpy", "pillow"))
            if name == "infinity-emb":
                full = full_checkpoint(python, tower, layers)
                running[name] = stacks.start_infinity(stack, python, full, free_port(), device, MAX_BATCH, threads,
                                                       uris)
            else:
                running[name] = stacks.start_ray(stack, python, tower, free_port(), device, MAX_BATCH, threads,
                                                 layers, uris)
        except Exception as exc:  # a peer that cannot run here is reported, not faked
            notes.setdefault("unavailable", {})[name] = f"{type(exc).__name__}: {str(exc)[-2000:]}"
            print(f"!! {name} unavailable: {exc}", flush=True)
    return running, full


def run_rounds(running: dict[str, stacks.Running], tower: Path, wanted: list[str], args: argparse.Namespace
               ) -> dict[str, dict[int, list[dict[str, Any]]]]:
    """Every round: each concurrency level, each stack in a rotating order."""
    order = [s for s in (*PEERS, CEILING) if s in running or (s == CEILING and CEILING in wanted)]
    rounds: dict[str, dict[int, list[dict[str, Any]]]] = {s: {} for s in order}
    rate = {c: 40.0 for c in args.concurrency}
    servers = list(running.values())
    for run in servers:  # warm-up: a few batches each
        asyncio.run(run_load(run.base_url, run.body_for, 4, 16, path=run.path))
    for r in range(args.rounds):
        for i, c in enumerate(args.concurrency):
            for name in rotated(order, r * len(args.concurrency) + i):
                if name == CEILING:
                    res = measure_ceiling(tower, servers, c, args.duration, rate[c], args.device)
                    rate[c] = res["images_per_s"]
                else:
                    res = measure_server(running[name], [s for s in servers if s.name != name], c, args.duration)
                rounds[name].setdefault(c, []).append(res)
                print(f"round {r} {name:13s} c={c:3d} {res['images_per_s']:6.1f} img/s p50 {res['p50_ms']:7.1f} ms "
                      f"p99 {res['p99_ms']:7.1f} ms errors {res.get('errors', 0)} load {res['loadavg_1m']:.1f}",
                      flush=True)
    return rounds


def plot(data: dict[str, Any], path: Path) -> None:
    """Images/s and p50 per stack against concurrency; bars show the range over rounds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from matplotlib.ticker import ScalarFormatter

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    levels: set[int] = set()
    names = list(data["points"])
    for k, (name, points) in enumerate(data["points"].items()):
        pts = sorted(points.values(), key=lambda p: p["concurrency"])
        levels.update(p["concurrency"] for p in pts)
        dodge = 1 + 0.04 * (k - (len(names) - 1) / 2)  # side by side, so the range bars do not hide each other
        conc = [p["concurrency"] * dodge for p in pts]
        for ax, metric in ((a, "images_per_s"), (b, "p50_ms")):
            mid = [p[metric] for p in pts]
            err = [[m - p[f"{metric}_range"][0] for m, p in zip(mid, pts)],
                   [p[f"{metric}_range"][1] - m for m, p in zip(mid, pts)]]
            ax.errorbar(conc, mid, yerr=err, marker="o", capsize=3,
                        linestyle="--" if name == CEILING else "-",
                        label=name + (" (p50 per batch)" if name == CEILING and metric == "p50_ms" else ""))
    a.set(xscale="log", xlabel="concurrency", ylabel="images/s", title="throughput (median of rounds, range)")
    b.set(xscale="log", yscale="log", xlabel="concurrency", ylabel="ms", title="p50 latency")
    for ax in (a, b):
        ax.set_xticks(sorted(levels), [str(c) for c in sorted(levels)])
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"peers: {data['model']} on {data['device']}, {data['rounds']} alternating rounds, "
                 f"load avg {data['machine']['loadavg_start'][0]:.1f}-{data['machine']['loadavg_end'][0]:.1f}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def machine_facts() -> dict[str, Any]:
    """bench.common.machine() plus the CPU model and the load average now."""
    facts = machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if line.startswith("model name")]
        facts["cpu_model"] = names[0] if names else None
    facts["loadavg_start"] = list(os.getloadavg())
    return facts


def replot(name: str) -> None:
    """Redraw ``bench/results/<name>.png`` from its JSON."""
    import json

    plot(json.loads((RESULTS / f"{name}.json").read_text()), RESULTS / f"{name}.png")


def main() -> None:
    """Command line: see --help."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of closed-loop load per point")
    parser.add_argument("--concurrency", type=int, nargs="+", default=list(CONCURRENCY))
    parser.add_argument("--stacks", nargs="+", default=[*PEERS, CEILING], choices=[*PEERS, CEILING])
    parser.add_argument("--out", default=None, help="results name (default peers_<device>)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads of every stack, the ceiling too (default 1 on cpu, 0 = each stack's "
                             "own default on cuda): on a shared 2-core machine a 2-thread OpenMP pool stalls "
                             "at every barrier when another process holds a core")
    parser.add_argument("--replot", metavar="NAME", help="only redraw results/NAME.png from results/NAME.json")
    args = parser.parse_args()
    if args.replot:
        replot(args.replot)
        return
    if args.threads is None:
        args.threads = 1 if args.device == "cpu" else 0
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)  # the ceiling and the reference run in this process
    tower = checkpoint("clip")
    uris = [jpeg_uri(seed=i) for i in range(8)]
    data: dict[str, Any] = {"model": "clip-moderate", "device": args.device, "machine": machine_facts(),
                            "max_batch_size": MAX_BATCH, "torch_threads_per_stack": args.threads or "default",
                            "rounds": args.rounds, "seconds_per_point": args.duration,
                            "images": "8 photo-like 640x480 JPEGs (bench.common.jpeg_uri seeds 0-7), one per request",
                            "client": "testkit.load closed loop, aiohttp, one kept-alive connection per client"}
    with ExitStack() as stack:
        running, full = start_all(stack, args.stacks, tower, args.device, args.threads, uris, data)
        data["configs"] = {name: run.config for name, run in running.items()}
        data["output_checks"] = check_outputs(running, tower, full, args.device, uris[0])
        for check in data["output_checks"]:
            print(f"check {check['stack']:13s} max abs diff {check['max_abs_diff']:.2e} equal={check['equal']}")
        rounds = run_rounds(running, tower, args.stacks, args)
    data["machine"]["loadavg_end"] = list(os.getloadavg())
    data["points"] = {name: {c: summarize(runs) for c, runs in by_c.items()} for name, by_c in rounds.items()}
    if "encoder-pod" in data["points"]:
        data["img_per_s_vs_encoder_pod"] = ratio_table(data["points"], "encoder-pod")
    name = args.out or f"peers_{args.device}"
    write_json(name, data)
    plot(data, RESULTS / f"{name}.png")
    print(f"wrote {RESULTS / name}.json and .png")


if __name__ == "__main__":
    main()
