"""The SMG gateway (PyPI ``smg`` 1.13.0, its own Rust binary) pointed at a pod's gRPC face.

SMG is the gateway smg-grpc-proto was written for. This records, with the gateway's own code,
why it cannot be the pod's client today, and that the pod takes what it does send: registering a
``grpc://`` encode worker, the gateway probes it with the health RPCs of the scheduler services
it knows (SGLang's, vLLM's, TensorRT-LLM's, MLX's, TokenSpeed's); an SGLang encoder serves none
of them, so the worker is refused and never added. Its binary has no client of
``sglang.grpc.encoder.SglangEncoder`` at all; its EPD mode speaks TokenSpeed's encoder service.
If a release of the gateway learns the service, this test fails and should become a real EPD one.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from tests.integration.test_grpc_face import GrpcPod
from testkit.server import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture(scope="module")
def smg() -> Path:
    """The gateway's ``smg`` command (hack/smg-gateway.sh installs it into the cache once)."""
    proc = subprocess.run(["bash", str(REPO / "hack/smg-gateway.sh")], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"hack/smg-gateway.sh could not install smg (needs the package index once):\n{proc.stderr[-2000:]}"
    return Path(proc.stdout.split()[-1])


@pytest.fixture(scope="module")
def pod(tiny_model) -> Iterator[GrpcPod]:
    started = GrpcPod(tiny_model("qwen2_vl"))
    started.server.start(timeout=300)
    try:
        yield started
    finally:
        started.close()


def test_the_gateways_binary_has_no_sglang_encoder_client(smg: Path):
    [binary] = (smg.parent.parent / "lib").glob("python3*/site-packages/smg/smg_rs*.so")
    data = binary.read_bytes()
    assert b"sglang.grpc.encoder.SglangEncoder" not in data
    assert b"tokenspeed.grpc.encoder.TokenSpeedEncoder" in data
    assert b"EPD mode requires gRPC connection_mode and TokenSpeed" in data


def test_the_gateway_probes_the_pod_with_scheduler_rpcs_and_never_adds_it(smg: Path, pod: GrpcPod):
    port = free_port()
    args = [str(smg), "launch", "--epd-disaggregation", "--encode", pod.url,
            "--prefill", f"grpc://127.0.0.1:{free_port()}", "--decode", f"grpc://127.0.0.1:{free_port()}",
            "--host", "127.0.0.1", "--port", str(port), "--prometheus-port", str(free_port()),
            "--prometheus-host", "127.0.0.1"]
    with tempfile.TemporaryFile() as log:
        gateway = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "NO_COLOR": "1"})
        try:
            refused = f"grpc health check failed for explicitly configured worker URL {pod.url}: gRPC not reachable"
            deadline, text = time.monotonic() + 120, ""
            while refused not in text:
                assert gateway.poll() is None and time.monotonic() < deadline, text[-4000:]
                time.sleep(0.5)
                log.seek(0)
                text = ANSI.sub("", log.read().decode(errors="replace"))
            line = next(x for x in text.splitlines() if refused in x)
            assert "tried sglang, vllm, trtllm, mlx, tokenspeed" in line
            assert line.count("not implemented") == 5, line  # UNIMPLEMENTED, for each scheduler's health RPC
            workers = httpx.get(f"http://127.0.0.1:{port}/workers", timeout=10).json()
            assert workers["total"] == 0, workers
            assert httpx.get(f"http://127.0.0.1:{port}/readiness", timeout=10).status_code == 503
            assert pod.client.health() == "SERVING"  # the pod answered the unknown methods and kept serving
        finally:
            gateway.terminate()
            gateway.wait(60)
