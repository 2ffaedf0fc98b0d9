"""The three servers of the peer comparison: how each starts, what it is sent, how it answers.

Every server gets the same batch bound (``max_batch`` images), the same torch thread count, one
model replica, and no per-request access log. The bodies carry the same data: URIs.

``threads`` 0 leaves each stack's own default (torch: one thread per core); otherwise it is set
through each stack's own knob and ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS``.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import httpx

from bench.peers.procs import PeerServer, session_cpu_seconds, tree_cpu_seconds

INFINITY_MODEL_NAME = "clip"
RAY_APP = Path(__file__).resolve().parent / "ray_app.py"
START_TIMEOUT = 600.0
"""Seconds a server may take to answer its first encode (Ray on a loaded 2-core box takes ~30-60)."""


@dataclass
class Running:
    """A started server: where to send, what to send, how to read its CPU time."""

    name: str
    base_url: str
    path: str
    body_for: Callable[[int], dict[str, Any]]
    cpu_seconds: Callable[[], float]
    pid: int
    """The server process (a peer's session leader)."""
    config: dict[str, Any] = field(default_factory=dict)


def pod_body(uris: list[str]) -> Callable[[int], dict[str, Any]]:
    """The encoder pod's /encode body for request ``n`` (the Ray replica takes the same)."""
    return lambda n: {"req_id": f"bench-{time.monotonic_ns()}-{n}", "modality": "IMAGE", "mm_items": [uris[n % len(uris)]]}


def infinity_body(uris: list[str]) -> Callable[[int], dict[str, Any]]:
    """infinity-emb's OpenAI-style /embeddings body for request ``n``."""
    return lambda n: {"model": INFINITY_MODEL_NAME, "input": [uris[n % len(uris)]], "modality": "image",
                      "encoding_format": "base64"}


def thread_env(threads: int) -> dict[str, str]:
    """OpenMP/MKL pool sizes for ``threads`` (nothing for 0)."""
    return {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)} if threads else {}


def _answers(url: str, body: dict[str, Any]) -> Callable[[httpx.Client], bool]:
    return lambda client: client.post(url, json=body, timeout=60).status_code == 200


def start_pod(stack: ExitStack, model: Path, device: str, max_batch: int, threads: int, uris: list[str]) -> Running:
    """``encoder-pod serve`` as bench/core_bench.py starts it (plus ``ENCODER_NUM_THREADS``)."""
    from testkit.server import EncoderServer

    env = {"ENCODER_MAX_BATCH_SIZE": str(max_batch), "ENCODER_DEVICE": device, "ENCODER_MAX_QUEUE": "4096"}
    if threads:
        env.update({"ENCODER_NUM_THREADS": str(threads), **thread_env(threads)})
    server = stack.enter_context(EncoderServer(model, env=env))
    assert server.proc is not None
    pid = server.proc.pid
    return Running("encoder-pod", server.base_url, "/encode", pod_body(uris), lambda: tree_cpu_seconds(pid), pid,
                   {"command": "encoder-pod serve --model-path <clip-moderate>", "env": env})


def start_infinity(stack: ExitStack, python: Path, full_model: Path, port: int, device: str, max_batch: int,
                   threads: int, uris: list[str]) -> Running:
    """``infinity_emb v2`` on the full CLIP checkpoint: no compile, no disk cache, float32 (bf16 on GPU)."""
    dtype = "bfloat16" if device == "cuda" else "float32"
    cmd = [str(python.parent / "infinity_emb"), "v2", "--model-id", str(full_model),
           "--served-model-name", INFINITY_MODEL_NAME, "--batch-size", str(max_batch), "--device", device,
           "--engine", "torch", "--dtype", dtype, "--no-compile", "--no-bettertransformer",
           "--no-vector-disk-cache", "--log-level", "warning", "--host", "127.0.0.1", "--port", str(port)]
    server = stack.enter_context(PeerServer("infinity", cmd, f"http://127.0.0.1:{port}",
                                            env={"DO_NOT_TRACK": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0",
                                                 **thread_env(threads)}))
    body = infinity_body(uris)
    server.start(_answers(server.base_url + "/embeddings", body(0)), START_TIMEOUT)
    return Running("infinity-emb", server.base_url, "/embeddings", body, lambda: session_cpu_seconds(server.pid),
                   server.pid, {"command": " ".join(["infinity_emb", *cmd[1:]]).replace(str(full_model), "<clip-moderate-full>"),
                    "env": thread_env(threads)})


def start_ray(stack: ExitStack, python: Path, model: Path, port: int, device: str, max_batch: int, threads: int,
              keep_layers: int, uris: list[str]) -> Running:
    """bench/peers/ray_app.py: Ray Serve, one replica, ``@serve.batch(max_batch_size=max_batch)``."""
    temp_dir = tempfile.mkdtemp(prefix="ray-")  # removed once every Ray process is gone
    stack.callback(shutil.rmtree, temp_dir, ignore_errors=True)
    cmd = [str(python), str(RAY_APP), "--model", str(model), "--port", str(port), "--device", device,
           "--keep-layers", str(keep_layers), "--max-batch", str(max_batch), "--temp-dir", temp_dir]
    if threads:
        cmd += ["--threads", str(threads)]
    server = stack.enter_context(PeerServer("ray", cmd, f"http://127.0.0.1:{port}",
                                            env={"RAY_USAGE_STATS_ENABLED": "0", **thread_env(threads)}))
    body = pod_body(uris)
    server.start(_answers(server.base_url + "/encode", body(0)), START_TIMEOUT)
    shown = ["python", "bench/peers/ray_app.py", *cmd[2:]]
    return Running("ray-serve", server.base_url, "/encode", body, lambda: session_cpu_seconds(server.pid), server.pid,
                   {"command": " ".join(shown).replace(str(model), "<clip-moderate>").replace(temp_dir, "<tmp>"),
                    "batch_wait_timeout_s": 0.01, "max_ongoing_requests": 64})


def fetch_one(running: Running, n: int = 0) -> dict[str, Any]:
    """One answer's JSON body, for the output check."""
    resp = httpx.post(running.base_url + running.path, json=running.body_for(n), timeout=120)
    resp.raise_for_status()
    return resp.json()
