"""gRPC vs HTTP: the same pod, model, image and receiver, through either face, side by side.

One ``encoder-pod serve`` with ``ENCODER_GRPC_PORT`` set serves both faces from one engine. Each
request asks for one image's embedding to be pushed to a ZMQ receiver on this host (SGLang's
zmq_to_tokenizer flow: the pod answers once the push completed), so both sides do the same work
and differ only in the face: ``http`` posts ``/encode`` with aiohttp (the client SGLang's prefill
servers use), ``grpc`` calls ``Encode`` with grpc.aio on smg-grpc-proto's own stubs (what
SGLang's gRPC client and gateways use). Closed loops at concurrency 1 and 16; every round runs
both sides back to back, the one that goes first alternating, and the median over rounds is
reported with the per-round differences (gRPC minus HTTP p50, gRPC over HTTP throughput), so a
machine whose speed drifts moves both sides alike.

Run with ``python -m bench.grpc_bench`` (``--rounds``, ``--requests``); writes
bench/results/grpc_<device>.json and .png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import zmq
from smg_grpc_proto import sglang_encoder_pb2 as pb
from smg_grpc_proto import sglang_encoder_pb2_grpc as pb_grpc

from bench.common import RESULTS, checkpoint, machine, write_json
from bench.peers.rounds import rotated
from testkit.load import image_bodies, run_load, summary
from testkit.media import jpeg_uri
from testkit.server import EncoderServer, free_port

SIDES = ("http", "grpc")
CONCURRENCY = (1, 16)


class Sink:
    """A PULL socket drained by a thread: where both faces push (the pod answers after the push)."""

    def __init__(self) -> None:
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.PULL)
        self.port = self._sock.bind_to_random_port("tcp://127.0.0.1")
        self.received = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while not self._stop.is_set():
            if self._sock.poll(100):
                self._sock.recv_multipart(copy=False)
                self.received += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close(0)
        self._ctx.term()


async def grpc_load(port: int, uri: str, push_port: int, concurrency: int, total: int, prefix: str) -> dict[str, Any]:
    """``total`` Encode calls, ``concurrency`` in flight, each client calling again when answered."""
    latencies: list[float] = []
    errors: list[str] = []
    count = [0]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.SglangEncoderStub(channel)

        async def client() -> None:
            while count[0] < total:
                n = count[0]
                count[0] += 1
                request = pb.EncodeRequest(mm_items=[uri], req_id=f"{prefix}-{n}", num_parts=1, part_idx=0,
                                           prefill_host="127.0.0.1", embedding_port=[push_port])
                start = time.perf_counter()
                try:
                    await stub.Encode(request, timeout=120)
                except grpc.aio.AioRpcError as exc:
                    errors.append(exc.code().name)
                    continue
                latencies.append(time.perf_counter() - start)

        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    result: dict[str, Any] = dict(summary(latencies, len(latencies), wall))
    result.update({"concurrency": concurrency, "errors": len(errors), "client": f"grpc.aio {grpc.__version__}"})
    return result


async def one_run(side: str, pod: EncoderServer, grpc_port: int, uri: str, sink: Sink, concurrency: int, total: int,
                  prefix: str) -> dict[str, Any]:
    """One closed loop of ``side`` at ``concurrency``."""
    if side == "grpc":
        return await grpc_load(grpc_port, uri, sink.port, concurrency, total, prefix)
    return await run_load(pod.base_url, image_bodies([uri], prefix, push_port=sink.port), concurrency, total)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _quartiles(values: list[float]) -> list[float]:
    if len(values) < 2:
        return [values[0], values[0]] if values else []
    q = statistics.quantiles(values, n=4)
    return [q[0], q[2]]


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per concurrency: each side's median p50 and throughput, and the per-round paired comparison."""
    out: dict[str, Any] = {}
    for c in CONCURRENCY:
        runs = [r for r in rounds if r["concurrency"] == c]
        point: dict[str, Any] = {}
        for side in SIDES:
            p50 = [r[side]["p50_ms"] for r in runs]
            ips = [r[side]["images_per_s"] for r in runs]
            point[side] = {"p50_ms": _median(p50), "p50_ms_iqr": _quartiles(p50), "images_per_s": _median(ips),
                           "images_per_s_iqr": _quartiles(ips), "errors": sum(r[side]["errors"] for r in runs)}
        diff = [r["grpc"]["p50_ms"] - r["http"]["p50_ms"] for r in runs]
        ratio = [r["grpc"]["images_per_s"] / r["http"]["images_per_s"] for r in runs]
        point["grpc_minus_http_p50_ms"] = {"median": _median(diff), "iqr": _quartiles(diff)}
        point["grpc_over_http_throughput"] = {"median": _median(ratio), "iqr": _quartiles(ratio)}
        out[str(c)] = point
    return out


async def measure(model: Path, rounds: int, requests: dict[int, int], env: dict[str, str]) -> dict[str, Any]:
    grpc_port = free_port()
    pod = EncoderServer(model, env={**env, "ENCODER_GRPC_PORT": str(grpc_port)})
    sink = Sink()
    uri = jpeg_uri()
    pod.start(timeout=600)
    try:
        for side in SIDES:  # warm both paths (connections, first batches)
            await one_run(side, pod, grpc_port, uri, sink, 4, 16, f"warm-{side}")
        out: list[dict[str, Any]] = []
        for r in range(rounds):
            for i, c in enumerate(CONCURRENCY):
                point: dict[str, Any] = {"round": r, "concurrency": c}
                for side in rotated(SIDES, r + i):
                    point[side] = await one_run(side, pod, grpc_port, uri, sink, c, requests[c], f"r{r}-c{c}-{side}")
                point["order"] = rotated(SIDES, r + i)
                point["loadavg_1m"] = os.getloadavg()[0]
                out.append(point)
                print(f"round {r} c={c}: http p50 {point['http']['p50_ms']:.2f} ms {point['http']['images_per_s']:.1f}/s, "
                      f"grpc p50 {point['grpc']['p50_ms']:.2f} ms {point['grpc']['images_per_s']:.1f}/s", flush=True)
    finally:
        pod.stop()
        sink.close()
    return {"rounds": out, "summary": summarize(out), "pushed": sink.received}


def plot(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, (metric, label, c) in zip(axes, (("p50_ms", "p50 latency at concurrency 1 (ms)", "1"),
                                             ("images_per_s", "throughput at concurrency 16 (images/s)", "16"))):
        point = data["summary"][c]
        values = [point[side][metric] for side in SIDES]
        spans = [point[side][f"{metric}_iqr"] for side in SIDES]
        err = [[v - s[0] for v, s in zip(values, spans)], [s[1] - v for v, s in zip(values, spans)]]
        ax.bar(SIDES, values, yerr=err, capsize=6, color=["#4c72b0", "#dd8452"])
        ax.set_title(label, fontsize=10)
        for x, v in enumerate(values):
            ax.text(x, v, f"{v:.2f}", ha="center", va="bottom", fontsize=9)
    c1, c16 = data["summary"]["1"], data["summary"]["16"]
    fig.suptitle(f"same pod, both faces, {data['config']['rounds']} alternating rounds: gRPC - HTTP p50 at c=1 "
                 f"{c1['grpc_minus_http_p50_ms']['median']:+.2f} ms, gRPC / HTTP throughput at c=16 "
                 f"{c16['grpc_over_http_throughput']['median']:.3f}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="qwen2_vl")
    parser.add_argument("--preset", default="tiny", help="tiny (the transport's cost stands out) or moderate")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--requests", type=int, default=40, help="requests per round at concurrency 1 (x4 at 16)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="ENCODER_NUM_THREADS of the pod")
    args = parser.parse_args()
    model = checkpoint(args.arch, args.preset)
    env = {"ENCODER_DEVICE": args.device, "ENCODER_NUM_THREADS": str(args.threads), "ENCODER_LOG_LEVEL": "warning"}
    data = asyncio.run(measure(model, args.rounds, {1: args.requests, 16: 4 * args.requests}, env))
    data["config"] = {"model": f"{args.arch}-{args.preset}", "rounds": args.rounds, "requests_c1": args.requests,
                      "requests_c16": 4 * args.requests, "image": "jpeg_uri() 640x480", "transfer": "zmq_to_tokenizer push",
                      "pod_env": env, "note": "both faces of one pod in one run, side by side; shared machine"}
    data["machine"] = machine()
    name = f"grpc_{args.device}"
    write_json(name, data)
    plot(json.loads((RESULTS / f"{name}.json").read_text()), RESULTS / f"{name}.png")
    print(json.dumps(data["summary"], indent=2))


if __name__ == "__main__":
    main()
