"""Encoder-core benchmark: the HTTP server under load against the in-process ceiling.

The ceiling is the same model doing the same per-image work (decode, processor, forward,
slicing) in batches of min(concurrency, MAX_BATCH_SIZE), with no server: the best the server could
do on this machine. It warms the model up as the server does and runs on a thread of its own, as
the server's model thread does.

The server is measured the way its callers use it, each request done when the embedding is a
tensor in the client's hands:

- ``json``: the default inline answer, decoded from JSON and base64;
- ``binary``: ``Accept: application/octet-stream`` (the wire format in one body);
- ``push``: a prefill-style request, the embedding pushed over ZMQ (``WIRE_FORMAT=encoderpool``)
  to the receiver library in this process; done when both the ``null`` answer and the embedding came.

Every round runs each concurrency level for the ceiling and every server mode back to back, the
order rotating from one point to the next, and the median round is reported (a noisy neighbour
on a shared machine hits all sides alike).
``--baseline-tree DIR`` adds the same runs against another source tree (the code before a
change), ``before-<mode>``, and the change itself as a paired comparison: per round, the server's
p50 at concurrency 1 minus the baseline's in the same mode, and the server process's CPU time per
request (from /proc) minus the baseline's. A short A/B of a change at concurrency 1 is
``--concurrency 1 --min-requests 20 --rounds 32 --restarts 8``: with ``--restarts`` the rounds
are spread over fresh pairs of server processes, started in alternating order (a pair that lives
for the whole run lets one process's speed pass for the change's). The ceiling too runs in a fresh
process per session (:class:`CeilingProcess`). ``--lockstep STEPS`` adds, per session, concurrency
1 measured one request of each side at a time (:mod:`bench.paired`): the reading that a machine
whose speed drifts from second to second cannot move. Run with ``make bench`` (or ``python -m
bench.core_bench``); writes bench/results/core_<device>.json and .png.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from bench.common import checkpoint, machine, write_json
from bench.paired import lockstep, summarize_lockstep
from bench.peers.rounds import rotated
from testkit.load import ACCEPT, Answer, image_bodies, run_load, summary
from testkit.media import jpeg_uri

CONCURRENCY = (1, 4, 16, 64)
MAX_BATCH = 8
class Ceiling:
    """The model in this process, on a thread of its own, running fixed batches back to back."""

    def __init__(self, model: Path, device: str, max_batch: int = MAX_BATCH) -> None:
        from encoder_pod.allocator import tune_host_allocator
        from encoder_pod.models.registry import load_adapter
        from encoder_pod.settings import load_settings

        tune_host_allocator()  # as every server process does: the same allocator on both sides

        self._adapter = load_adapter(load_settings(env={"ENCODER_MODEL_PATH": str(model), "ENCODER_DEVICE": device}).model)
        # As the server does before serving; without it, forwards here ran up to 10x slower under load.
        self._adapter.warmup()
        self._raw = [base64.b64decode(jpeg_uri(seed=i).split(",", 1)[1]) for i in range(8)]
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="ceiling-model")
        self._max_batch = max_batch

    def _one_batch(self, start: int, batch: int) -> None:
        from encoder_pod.media.images import decode_image
        from encoder_pod.models.base import MediaItem
        from encoder_pod.modality import Modality

        items = [[MediaItem(Modality.IMAGE, decode_image(self._raw[(start + k) % 8], 40_000_000))] for k in range(batch)]
        for [item] in items:
            self._adapter.measure(item)
        prepared = self._adapter.preprocess(items)
        self._adapter.postprocess(self._adapter.forward(prepared), prepared)

    def _run(self, concurrency: int, images: int) -> dict[str, Any]:
        batch = min(concurrency, self._max_batch)
        self._one_batch(0, batch)
        latencies: list[float] = []
        begin = time.perf_counter()
        done = 0
        while done < images:
            t = time.perf_counter()
            self._one_batch(done, batch)
            latencies.append(time.perf_counter() - t)
            done += batch
        result = summary(latencies, done, time.perf_counter() - begin)
        result.update({"concurrency": concurrency, "batch": batch, "mean_batch": float(batch)})
        return result

    def run(self, concurrency: int, images: int) -> dict[str, Any]:
        """Throughput with batches of min(concurrency, MAX_BATCH) images; p50 is per batch."""
        return self._thread.submit(self._run, concurrency, images).result()

    def one(self, index: int) -> float:
        """Seconds to encode test image ``index`` alone (on the model thread, as :meth:`run`)."""
        def timed() -> float:
            start = time.perf_counter()
            self._one_batch(index, 1)
            return time.perf_counter() - start

        return self._thread.submit(timed).result()


def ceiling(model: Path, concurrency: int, images: int, max_batch: int, device: str) -> dict[str, Any]:
    """In-process throughput with batches of min(concurrency, max_batch) images (a :class:`Ceiling` run)."""
    return Ceiling(model, device, max_batch).run(concurrency, images)


class CeilingProcess:
    """A :class:`Ceiling` in a fresh process of its own, started with each session's servers.

    A process runs the same forward up to 1-2 ms faster or slower than another for its whole life.
    A ceiling kept in the bench process for the whole run is one such draw, and it shifted every
    overhead of the run alike; a ceiling per session is drawn as often as the servers are.
    """

    def __init__(self, model: Path, device: str, threads: int) -> None:
        cmd = [sys.executable, "-m", "bench.core_bench", "--ceiling-worker", str(model), "--device", device,
               "--threads", str(threads)]
        self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._call({"ready": True})

    def _call(self, message: dict[str, Any]) -> dict[str, Any]:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(json.dumps(message) + "\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the ceiling process exited with {self._proc.wait()}")
        return json.loads(line)

    def run(self, concurrency: int, images: int) -> dict[str, Any]:
        """As :meth:`Ceiling.run`, in the ceiling's process."""
        return self._call({"concurrency": concurrency, "images": images})

    def one(self, index: int) -> float:
        """Seconds to encode test image ``index`` alone, timed in the ceiling's process (bench.paired)."""
        return float(self._call({"one": index})["seconds"])

    def stop(self) -> None:
        """End the process (its stdin closes)."""
        assert self._proc.stdin is not None
        self._proc.stdin.close()
        self._proc.wait(timeout=60)


def _ceiling_worker(model: Path, device: str, threads: int) -> None:
    """The :class:`CeilingProcess` side: one JSON request a line on stdin, one JSON answer a line on stdout."""
    if threads:
        import torch

        torch.set_num_threads(threads)
    ceiling = Ceiling(model, device)
    for line in sys.stdin:
        message = json.loads(line)
        if message.get("ready"):
            answer: dict[str, Any] = {"ready": True}
        elif "one" in message:
            answer = {"seconds": ceiling.one(message["one"])}
        else:
            answer = ceiling.run(message["concurrency"], message["images"])
        print(json.dumps(answer), flush=True)


async def _server_run(base_url: str, mode: str, uris: list[str], concurrency: int, total: int) -> dict[str, Any]:
    from encoder_pod.receiver import AsyncEmbeddingReceiver, decode_answer

    prefix = f"{mode}-{time.monotonic_ns()}"
    if mode == "push":
        async with AsyncEmbeddingReceiver("127.0.0.1", 0) as rx:
            async def received(n: int, answer: Answer) -> None:
                (await rx.wait(f"{prefix}-{n}", timeout=120)).embedding()

            return await run_load(base_url, image_bodies(uris, prefix, rx.port), concurrency, total, finish=received)

    async def decoded(n: int, answer: Answer) -> None:
        decode_answer(answer.content_type, answer.body)

    accept = ACCEPT[mode]
    return await run_load(
        base_url, image_bodies(uris, prefix), concurrency, total,
        headers={"accept": accept} if accept else None, finish=decoded,
    )


COMPUTE_STAGES = ("encoder_decode_seconds_sum", "encoder_preprocess_seconds_sum", "encoder_forward_seconds_sum")
"""The server's timed compute (decode and measure, processor, forward and slicing): what the ceiling does."""


def _batch_stats(server: Any) -> tuple[float, float, float]:
    """(batch size sum, batches, compute seconds) so far."""
    return (server.metric("encoder_batch_size_sum"), server.metric("encoder_batch_size_count"),
            sum(server.metric(name) for name in COMPUTE_STAGES))


def _cpu_seconds(pid: int) -> float:
    """CPU time of process ``pid``, all its threads, in nanosecond steps (Linux /proc schedstat;
    /proc/<pid>/stat counts 10 ms ticks, too coarse for a 20-request run)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):  # a thread that just ended
            pass
    return total / 1e9


def server_run(server: Any, mode: str, uris: list[str], concurrency: int, total: int) -> dict[str, Any]:
    """One closed-loop run against ``server``; adds the mean batch size the server formed meanwhile,
    the server process's CPU time per request and its compute time per batch (its stage metrics)."""
    before = _batch_stats(server)
    cpu = _cpu_seconds(server.proc.pid)
    result = asyncio.run(_server_run(server.base_url, mode, uris, concurrency, total))
    result["server_cpu_ms_per_request"] = (_cpu_seconds(server.proc.pid) - cpu) / max(result["requests"], 1) * 1e3
    after = _batch_stats(server)
    batches = after[1] - before[1]
    result["mean_batch"] = (after[0] - before[0]) / batches if batches else float("nan")
    result["compute_ms_per_batch"] = (after[2] - before[2]) / batches * 1e3 if batches else float("nan")
    return result


def _spread(values: list[float]) -> dict[str, float]:
    """Median, range and (from two values on) quartiles."""
    out = {"median": statistics.median(values), "min": min(values), "max": max(values)}
    if len(values) >= 2:
        out["q1"], _, out["q3"] = statistics.quantiles(values, n=4)
    return out


def _median(runs: list[dict[str, Any]], key: str) -> dict[str, float]:
    return _spread([r[key] for r in runs])


def _change(runs: dict[str, dict[int, list[dict[str, Any]]]]) -> dict[str, Any]:
    """Per mode, the server minus the baseline at concurrency 1, paired round by round."""
    out: dict[str, Any] = {}
    for side, levels in runs.items():
        if not side.startswith("server-") or f"before-{side[7:]}" not in runs:
            continue
        paired = list(zip(levels.get(1, []), runs[f"before-{side[7:]}"].get(1, [])))
        if len(paired) < 2:
            continue
        p50 = [s["p50_ms"] - b["p50_ms"] for s, b in paired]
        cpu = [s["server_cpu_ms_per_request"] - b["server_cpu_ms_per_request"] for s, b in paired]
        out[side[7:]] = {"p50_ms_c1": _spread(p50),
                         "server_cpu_ms_per_request_c1": _spread(cpu), "rounds": len(paired)}
    return out


def summarize(runs: dict[str, dict[int, list[dict[str, Any]]]]) -> dict[str, Any]:
    """Medians and ranges per side and level, and the goals as medians of per-round comparisons."""
    table: dict[str, dict[str, Any]] = {}
    for side, levels in runs.items():
        table[side] = {str(c): {k: _median(rs, k) for k in ("images_per_s", "p50_ms", "p99_ms", "mean_batch")}
                       for c, rs in levels.items()}
    ceiling = runs["ceiling"]
    goals: dict[str, Any] = {}
    for side, levels in runs.items():
        if side == "ceiling":
            continue
        paired = list(zip(levels.get(1, []), ceiling.get(1, [])))
        if paired:
            goals[f"{side}_p50_overhead_ms_c1"] = _spread([s["p50_ms"] - c["p50_ms"] for s, c in paired])
            # The same overhead with each side's own compute taken out: the server's p50 minus its
            # mean compute per request (its stage metrics), against the ceiling's p50 minus its mean
            # batch. What the serving adds, whichever process happens to run the forward faster.
            timed = [(s, c) for s, c in paired if "compute_ms_per_batch" in s]
            if timed:
                goals[f"{side}_p50_over_own_compute_ms_c1"] = _spread(
                    [(s["p50_ms"] - s["compute_ms_per_batch"]) - (c["p50_ms"] - c["mean_ms"]) for s, c in timed])
                goals[f"{side}_compute_minus_ceiling_ms_c1"] = _spread(
                    [s["compute_ms_per_batch"] - c["mean_ms"] for s, c in timed])
        for c in (4, 16, 64):
            ratios = [s["images_per_s"] / q["images_per_s"] for s, q in zip(levels.get(c, []), ceiling.get(c, []))]
            if ratios:
                goals[f"{side}_throughput_ratio_c{c}"] = _spread(ratios)
    return {"table": table, "goals": goals, "change_vs_baseline": _change(runs)}


def plot(data: dict[str, Any], path: Path) -> None:
    """Throughput against concurrency per side, and the p50 overhead at concurrency 1."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table, goals = data["summary"]["table"], data["summary"]["goals"]
    if any(table.values()):
        fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    else:  # a lockstep-only run (--rounds 0): no throughput
        fig, b = plt.subplots(1, 1, figsize=(7, 4))
        a = None
    if a is not None:
        for side, levels in table.items():
            conc = sorted(int(c) for c in levels)
            style = "s--" if side == "ceiling" else (":" if side.startswith("before") else "-")
            a.plot(conc, [levels[str(c)]["images_per_s"]["median"] for c in conc], style if "s" in style else "o" + style, label=side)
        a.set(xscale="log", xlabel="concurrency", ylabel="images/s (median round)", title="throughput")
        a.grid(True, alpha=0.3)
        a.legend(fontsize=8)
    sides = [s for s in table if f"{s}_p50_overhead_ms_c1" in goals]
    meds = [goals[f"{s}_p50_overhead_ms_c1"]["median"] for s in sides]
    lows = [m - goals[f"{s}_p50_overhead_ms_c1"]["min"] for s, m in zip(sides, meds)]
    highs = [goals[f"{s}_p50_overhead_ms_c1"]["max"] - m for s, m in zip(sides, meds)]
    steps = data.get("lockstep", {}).get("summary", {})
    paired = [key[: -len("_overhead_ms")] for key in steps if key.endswith("_overhead_ms")]
    if not sides and not paired:  # no concurrency-1 runs
        b.set_visible(False)
    if sides:
        b.bar(sides, meds, yerr=[lows, highs], capsize=4, label="rounds: median (range)")
    if paired:
        pmeds = [steps[f"{s}_overhead_ms"]["median"] for s in paired]
        b.bar([f"{s}\nlockstep" for s in paired], pmeds, capsize=4, hatch="//", label="lockstep: median (quartiles)",
              yerr=[[m - steps[f"{s}_overhead_ms"]["q1"] for s, m in zip(paired, pmeds)],
                    [steps[f"{s}_overhead_ms"]["q3"] - m for s, m in zip(paired, pmeds)]])
        b.legend(fontsize=8)
    b.set(ylabel="ms", title="p50 at concurrency 1 minus the in-process encode")
    b.tick_params(axis="x", labelrotation=20)
    b.grid(True, axis="y", alpha=0.3)
    how = [f"{data['rounds']} rounds"] if data["rounds"] else []
    if steps:
        how.append(f"lockstep: {data['lockstep']['summary']['steps']} steps over {len(data['lockstep']['sessions'])} sessions")
    fig.suptitle(f"encoder core, {data['model']} on {data['device']} ({', '.join(how)})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--arch", default="clip")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--requests-per-client", type=int, default=6)
    parser.add_argument("--min-requests", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--modes", default="json,binary,push")
    parser.add_argument("--concurrency", type=int, nargs="+", default=list(CONCURRENCY))
    parser.add_argument("--out", default=None, help="results name (default core_<device>)")
    parser.add_argument("--baseline-tree", type=Path, default=None, help="source tree of the code to compare against")
    parser.add_argument("--restarts", type=int, default=5,
                        help="server sessions the rounds are spread over, fresh processes each, started in the "
                             "other order each time (use several for an A/B with --baseline-tree)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads of the servers and the ceiling (default 1 on cpu, 0 = torch's default): "
                             "on a shared 2-core machine a 2-thread OpenMP pool stalls whenever another job holds a core")
    parser.add_argument("--lockstep", type=int, default=40, metavar="STEPS",
                        help="also measure concurrency 1 in lockstep (bench/paired.py), STEPS steps per session (0: not)")
    parser.add_argument("--ceiling-worker", type=Path, default=None, help=argparse.SUPPRESS)  # CeilingProcess's child
    args = parser.parse_args()
    if args.ceiling_worker is not None:
        _ceiling_worker(args.ceiling_worker, args.device, args.threads or 0)
        return
    from testkit.server import EncoderServer

    if args.threads is None:
        args.threads = 1 if args.device == "cpu" else 0
    model = checkpoint(args.arch)
    uris = [jpeg_uri(seed=i) for i in range(8)]
    env = {"ENCODER_MAX_BATCH_SIZE": str(MAX_BATCH), "ENCODER_DEVICE": args.device, "ENCODER_MAX_QUEUE": "4096",
           "ENCODER_WIRE_FORMAT": "encoderpool"}
    if args.threads:
        env.update({"ENCODER_NUM_THREADS": str(args.threads), "OMP_NUM_THREADS": str(args.threads),
                    "MKL_NUM_THREADS": str(args.threads)})
    envs = {"server": env}
    if args.baseline_tree is not None:
        # PYTHONSAFEPATH: the working directory (this tree) must not come before the baseline on sys.path.
        envs["before"] = {**env, "PYTHONPATH": str(args.baseline_tree.resolve()), "PYTHONSAFEPATH": "1"}
    modes = args.modes.split(",")
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {"ceiling": {}}
    lockstep_sessions: list[dict[str, list[float]]] = []
    # Who runs first rotates from one (round, concurrency) point to the next, as in the peer
    # bench: with a fixed order a drift within a round always hit the same side.
    sides = ["ceiling", *[(name, mode) for name in envs for mode in modes]]
    for session in range(args.restarts):
        # Fresh server processes per session, started in the other order each time: one process
        # can run the same forward 1-2 ms slower than another for its whole life (seen as a
        # start-order effect in A/B runs), which a single pair of processes would pass off as
        # the change.
        order = list(envs) if session % 2 == 0 else list(reversed(envs))
        servers = {name: EncoderServer(model, env=envs[name]) for name in order}
        ceiling: CeilingProcess | None = None
        try:
            for server in servers.values():
                server.start()
            ceiling = CeilingProcess(model, args.device, args.threads)
            for server in servers.values():
                for mode in modes:
                    server_run(server, mode, uris, 4, 16)  # warm-up
            for r in range(session, args.rounds, args.restarts):
                for i, c in enumerate(args.concurrency):
                    total = max(args.min_requests, c * args.requests_per_client)
                    for side in rotated(sides, r * len(args.concurrency) + i):
                        if side == "ceiling":
                            res = ceiling.run(c, total)
                            res["loadavg_1m"] = os.getloadavg()[0]
                            res["session"] = session
                            runs["ceiling"].setdefault(c, []).append(res)
                            print(f"round {r} ceiling       c={c:3d} {res['images_per_s']:6.1f} img/s p50 {res['p50_ms']:7.1f} ms "
                                  f"(batch {res['batch']}) load {res['loadavg_1m']:.1f}", flush=True)
                            continue
                        name, mode = side
                        res = server_run(servers[name], mode, uris, c, total)
                        res["loadavg_1m"] = os.getloadavg()[0]
                        res["session"] = session
                        runs.setdefault(f"{name}-{mode}", {}).setdefault(c, []).append(res)
                        print(f"round {r} {name + '-' + mode:13s} c={c:3d} {res['images_per_s']:6.1f} img/s p50 "
                              f"{res['p50_ms']:7.1f} ms p99 {res['p99_ms']:7.1f} ms batch {res['mean_batch']:.2f} "
                              f"errors {res['errors']} load {res['loadavg_1m']:.1f}", flush=True)
            if args.lockstep:
                steps = asyncio.run(lockstep({name: server.base_url for name, server in servers.items()}, modes, ceiling,
                                             uris, args.lockstep, first=session))
                lockstep_sessions.append(steps)
                print(f"session {session} lockstep: " + ", ".join(
                    f"{side} p50 {statistics.median(v):.1f} ms" for side, v in steps.items()), flush=True)
        finally:
            if ceiling is not None:
                ceiling.stop()
            for server in servers.values():
                server.stop()
    # machine()'s torch_threads is this process's, which runs no model any more: the sides' setting instead.
    facts = {**machine(), "torch_threads": args.threads or "default"}
    data: dict[str, Any] = {"model": f"{args.arch}-moderate", "device": args.device, "machine": facts,
                            "max_batch_size": MAX_BATCH, "torch_threads": args.threads or "default",
                            "rounds": args.rounds, "restarts": args.restarts, "runs": runs}
    data["summary"] = summarize(runs)
    if lockstep_sessions:
        data["lockstep"] = {"sessions": lockstep_sessions, "summary": summarize_lockstep(lockstep_sessions)}
        for key, value in data["lockstep"]["summary"].items():
            if key.endswith("_overhead_ms"):
                print(f"lockstep {key}: {value['median']:.2f} (quartiles {value['q1']:.2f} .. {value['q3']:.2f})")
    for key, value in data["summary"]["goals"].items():
        quartiles = f", quartiles {value['q1']:.2f} .. {value['q3']:.2f}" if "q1" in value else ""
        print(f"{key}: {value['median']:.2f} ({value['min']:.2f} .. {value['max']:.2f}{quartiles})")
    for mode, change in data["summary"]["change_vs_baseline"].items():
        p50, cpu = change["p50_ms_c1"], change["server_cpu_ms_per_request_c1"]
        print(f"{mode}: server minus baseline at c=1 over {change['rounds']} rounds: p50 {p50['median']:+.2f} ms "
              f"(quartiles {p50['q1']:+.2f} .. {p50['q3']:+.2f}), server CPU per request {cpu['median']:+.2f} ms")
    name = args.out or f"core_{args.device}"
    write_json(name, data)
    plot(data, Path(__file__).resolve().parent / "results" / f"{name}.png")


if __name__ == "__main__":
    main()
