"""Probes that mean what they say: /health answers from a cached verdict at once, whatever the model
does; the probe encode runs in the background on a lane no queued batch delays.

/health is polled by a process of its own (tests/support/health_poller.py), the way a kubelet or
SGLang's bootstrap server polls it: a new connection each time, a timeout.
"""

from __future__ import annotations

import base64
import io
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from PIL import Image

from encoder_pod.readiness import HEALTH_SKIP_S
from tests.integration.encode_client import encode
from tests.support.health_poller import Poller
from testkit.load import ClosedLoop, image_bodies, refused_or_unreachable
from testkit.media import png_data_uri
from testkit.server import EncoderServer

pytestmark = pytest.mark.integration

HANDLER_BOUND_S = 1.0
"""What the contract promises for one /health answer, whatever the workers do."""
SATURATED_BOUND_S = 2.0
"""SGLang's bootstrap server probes with a 2 s timeout (3 misses evict a pod)."""


def _flat_image(side: int) -> str:
    """A solid-colour PNG: tiny on the wire, a full-size image for the model."""
    buf = io.BytesIO()
    Image.new("RGB", (side, side), (40, 90, 200)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _probes_done(server: EncoderServer) -> int:
    return httpx.get(server.base_url + "/server_info", timeout=5).json()["health"]["probes"]


@pytest.mark.timeout(600)
def test_health_answers_at_once_while_long_batches_run_and_the_probe_jumps_the_queue(tiny_model):
    """Three requests of 300 images, one batch each (MAX_BATCH_SIZE=1): seconds without any success.

    Before this design, /health ran its probe encode behind every queued batch and blocked for
    the whole backlog. Now it answers from the cached verdict, and the background probe (due once
    no success is HEALTH_SKIP_S old) runs right after the forward in progress: it finishes before
    the second long request, which was queued ahead of it.
    """
    env = {"ENCODER_MAX_BATCH_SIZE": "1", "ENCODER_REQ_TIMEOUT": "300", "ENCODER_HEALTH_TIMEOUT": "120"}
    items = [_flat_image(224)] * 300
    with EncoderServer(tiny_model("clip", preset="moderate"), env=env) as server, ThreadPoolExecutor(3) as pool:
        probes_before = _probes_done(server)
        poller = Poller(server.base_url + "/health", interval=0.1)
        started = time.monotonic()
        done: dict[str, float] = {}

        def long_request(name: str) -> int:
            status = encode(server.base_url, name, items, timeout=300).status_code
            done[name] = time.monotonic()
            return status

        futures = []
        for name in ("a", "b1", "b2"):  # one after the other, so they queue in this order
            futures.append(pool.submit(long_request, name))
            time.sleep(0.5)
        probe_seen = None
        while not all(f.done() for f in futures):
            if probe_seen is None and _probes_done(server) > probes_before:
                probe_seen = time.monotonic()
            time.sleep(0.1)
        probes = poller.stop()
        info = httpx.get(server.base_url + "/server_info", timeout=5).json()
    assert [f.result() for f in futures] == [200, 200, 200]
    span = done["b2"] - started
    seconds = sorted(p[1] for p in probes)
    print(
        f"\n/health during {span:.1f}s of 300-image batches: {len(probes)} probes, p50 "
        f"{statistics.median(seconds) * 1000:.1f} ms, max {seconds[-1] * 1000:.1f} ms; a probe encode finished "
        f"{(probe_seen or float('nan')) - started:.1f}s in, the queued requests at {done['b1'] - started:.1f}s "
        f"and {span:.1f}s; last probe took {info['health']['last_probe_s']}s"
    )
    assert span > 2 * HEALTH_SKIP_S, "the batches were too short to leave the pod without a recent success"
    assert {p[2] for p in probes} == {200}, [p for p in probes if p[2] != 200][:5]
    assert seconds[-1] < HANDLER_BOUND_S
    # The probe ran on its own lane: after the forward in progress, before the queued long request.
    assert probe_seen is not None and probe_seen < done["b2"], (probe_seen, done)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("args", [[], ["--dp-size", "2"]], ids=["single-process", "dp2"])
def test_health_stays_under_2s_at_concurrency_64(tiny_model, args):
    image = png_data_uri(640, 480, seed=1, fmt="JPEG")
    with EncoderServer(tiny_model("clip", preset="moderate"), env={"ENCODER_MAX_BATCH_SIZE": "8"}, args=args) as server:
        load = ClosedLoop(server.base_url, 64, image_bodies([image]), stop_after=refused_or_unreachable).start()
        try:
            load.wait_ok(64, 120)
            poller = Poller(server.base_url + "/health", interval=0.1)
            time.sleep(20)
            probes = poller.stop()
        finally:
            answers = load.stop()
    seconds = sorted(p[1] for p in probes)
    p99 = seconds[min(len(seconds) - 1, int(len(seconds) * 0.99))]
    codes = {a.status for a in answers}
    print(
        f"\n/health at concurrency 64 ({' '.join(args) or 'single process'}, moderate CLIP, 640x480 JPEG): "
        f"{len(probes)} probes over 20 s, p50 {statistics.median(seconds) * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, "
        f"max {seconds[-1] * 1000:.1f} ms; {len(answers)} requests answered {sorted(codes, key=str)}"
    )
    assert codes == {200}
    assert {p[2] for p in probes} == {200}, [p for p in probes if p[2] != 200][:5]
    assert seconds[-1] < SATURATED_BOUND_S
