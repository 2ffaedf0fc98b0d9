"""Admission, timeouts, disconnects, duplicates and health on a real server (the drain: test_drain.py).

Slowness comes from real sources: a media host that holds its responses (a slow origin) and a
moderate-size checkpoint encoding many images (a busy model).
"""

from __future__ import annotations

import asyncio
import base64
import io
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from PIL import Image

from encoder_pod.errors import NotReady
from encoder_pod.exitcodes import ExitCode
from encoder_pod.models.registry import load_adapter
from encoder_pod.readiness import ReplicaState as State
from encoder_pod.runtime import EncoderRuntime
from encoder_pod.settings import load_settings
from tests.integration.encode_client import encode
from tests.support.media_host import MediaHost
from testkit.media import png_data_uri
from testkit.server import EncoderServer

pytestmark = pytest.mark.integration


def _held_env(**extra: str) -> dict[str, str]:
    return {"ENCODER_ALLOW_URL_FETCH": "true", "ENCODER_ALLOWED_URL_HOSTS": "127.0.0.1", **extra}


def _flat_png(side: int) -> str:
    """A solid-colour PNG: decoded at once, a full-size image for the model."""
    buf = io.BytesIO()
    Image.new("RGB", (side, side), (200, 30, 30)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _wait_inflight(server: EncoderServer, n: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while httpx.get(server.base_url + "/server_info", timeout=5).json()["inflight"] < n:
        assert time.monotonic() < deadline, "requests never became in flight"
        time.sleep(0.05)


def test_duplicate_inflight_req_id_is_409(tiny_model):
    with MediaHost() as host, EncoderServer(tiny_model("qwen2_vl"), env=_held_env()) as server, ThreadPoolExecutor(2) as pool:
        first = pool.submit(encode, server.base_url, "dup", [host.base_url + "/held/40x40.png"])
        _wait_inflight(server, 1)
        second = encode(server.base_url, "dup", [png_data_uri(40, 40)])
        assert second.status_code == 409 and "dup" in second.json()["message"]
        host.release()
        assert first.result().status_code == 200
        # Once answered, the id may be used again.
        assert encode(server.base_url, "dup", [png_data_uri(40, 40)]).status_code == 200


def test_queue_full_is_429_at_once(tiny_model):
    with MediaHost() as host, EncoderServer(tiny_model("qwen2_vl"), env=_held_env(ENCODER_MAX_QUEUE="2", ENCODER_MAX_BATCH_SIZE="2")) as server, ThreadPoolExecutor(2) as pool:
        held = [pool.submit(encode, server.base_url, f"q{i}", [host.base_url + "/held/40x40.png"]) for i in range(2)]
        _wait_inflight(server, 2)
        started = time.monotonic()
        over = encode(server.base_url, "q-over", [png_data_uri(40, 40)])
        assert over.status_code == 429 and "queue is full" in over.json()["message"]
        assert time.monotonic() - started < 5
        host.release()
        assert [f.result().status_code for f in held] == [200, 200]
        assert encode(server.base_url, "q-after", [png_data_uri(40, 40)]).status_code == 200


def test_timeout_504_and_queued_work_dropped(tiny_model):
    """Requests stuck behind a long batch get 504 after REQ_TIMEOUT; their work never runs."""
    env = {"ENCODER_REQ_TIMEOUT": "1.5", "ENCODER_MAX_BATCH_SIZE": "1"}
    with EncoderServer(tiny_model("clip", preset="moderate"), env=env) as server, ThreadPoolExecutor(4) as pool:
        big = pool.submit(encode, server.base_url, "big", [_flat_png(224)] * 150)
        # The small ones must queue behind the big batch: wait until its items are decoded.
        deadline = time.monotonic() + 30
        while server.metric("encoder_decode_seconds_count") < 1:
            assert time.monotonic() < deadline, server.log_text()
            time.sleep(0.02)
        small = [pool.submit(encode, server.base_url, f"s{i}", [png_data_uri(32, 32)]) for i in range(3)]
        answers = [f.result() for f in small] + [big.result()]
        assert [r.status_code for r in answers] == [504] * 4, [r.text for r in answers]
        assert "ENCODER_REQ_TIMEOUT" in answers[0].json()["message"]
        # Once the long batch is done, the timed-out requests are dropped, never encoded.
        deadline = time.monotonic() + 120
        while server.metric("encoder_dropped_requests_total", 'reason="timeout"') < 3:
            assert time.monotonic() < deadline, server.log_text()
            time.sleep(0.2)
        assert server.metric("encoder_batch_items_sum") == 150  # probe encodes are not batches
        assert httpx.get(server.base_url + "/health", timeout=30).status_code == 200


def test_disconnected_client_work_is_dropped(tiny_model):
    env = {"ENCODER_MAX_BATCH_SIZE": "1"}
    with EncoderServer(tiny_model("clip", preset="moderate"), env=env) as server, ThreadPoolExecutor(4) as pool:
        big = pool.submit(encode, server.base_url, "big", [png_data_uri(224, 224, seed=i) for i in range(100)])
        _wait_inflight(server, 1)
        time.sleep(0.3)
        gone = [pool.submit(encode, server.base_url, f"g{i}", [png_data_uri(32, 32)], timeout=0.5) for i in range(3)]
        for f in gone:
            with pytest.raises(httpx.ReadTimeout):
                f.result()
        assert big.result().status_code == 200
        deadline = time.monotonic() + 10
        while server.metric("encoder_dropped_requests_total", 'reason="client_gone"') < 3:
            assert time.monotonic() < deadline, server.log_text()
            time.sleep(0.1)
        # Only the big request was ever encoded.
        assert server.metric("encoder_batch_items_sum") == 100  # probe encodes are not batches


def test_health_503_while_loading_then_200(tiny_model):
    """Health is a real encode: 503 before the model is loaded, 200 after."""
    gate = threading.Event()
    settings = load_settings(env={"ENCODER_MODEL_PATH": str(tiny_model("qwen2_vl"))})

    def gated_loader(s):
        gate.wait(30)
        return load_adapter(s)

    async def scenario() -> None:
        runtime = EncoderRuntime(settings, adapter_loader=gated_loader)
        await runtime.start()
        with pytest.raises(NotReady, match="loading"):
            await runtime.health()
        gate.set()
        assert await runtime.wait_loaded() is State.READY
        await runtime.health()
        await runtime.shutdown(grace=1)

    asyncio.run(scenario())


def test_a_checkpoint_that_does_not_load_stops_the_pod_with_exit_code_3(tiny_model, tmp_path):
    # Not a refusal: the checkpoint passes the start-up check and its adapter's load raises (corrupt
    # weights). Before, the pod stayed up unready for good (/health 503, state failed), which the
    # operator saw as Starting forever; it reads ModelLoadFailed from exit code 3 and the last line.
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(tiny_model("qwen2_vl"), broken)
    for f in broken.glob("*.safetensors"):
        f.write_bytes(b"not a safetensors file")
    server = EncoderServer(broken).start(wait_ready=False)
    assert server.proc is not None
    try:
        code = server.proc.wait(120)  # interpreter start, imports, the load: seconds; never staying up
    finally:
        server.stop(timeout=10)
    log = server.log_text()
    assert code == ExitCode.MODEL_LOAD_FAILED, log[-3000:]
    last = log.strip().splitlines()[-1]
    assert last.startswith("encoder-pod: model load failed: SafetensorError: "), log[-3000:]  # type and message
    reason = last.removeprefix("encoder-pod: model load failed: ")
    assert f"encoder_pod.runtime: model load failed: {reason}" in log, log[-3000:]  # as the runtime's load_error has it
    assert "Traceback" not in log
