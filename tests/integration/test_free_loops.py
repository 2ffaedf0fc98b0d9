"""The event loop that answers /livez and /health stays free while a 16 MiB request is parsed and a
large inline answer is rendered: single process and data parallel (dp=2).

The server parses large bodies, packs requests for workers, base64-encodes and renders inline
answers on threads, in slices short enough that the GIL keeps coming back to the loop. A separate
poller process (so nothing in this test process competes with it for the GIL) asks /livez and
/health every few milliseconds over one keep-alive connection while two heavy requests run:
one 16 MiB body (a large PNG as a data: URI), one whose answer is 16384 rows x 128 floats
(about 11 MB of base64). /health answers from state while live traffic is recent (HEALTH_SKIP_S);
polls later than that may run a probe encode that waits behind the batch, so they are only
required to succeed.
"""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
from PIL import Image

from encoder_pod.readiness import HEALTH_SKIP_S
from tests.integration.encode_client import encode
from testkit.media import png_data_uri
from testkit.server import EncoderServer

pytestmark = pytest.mark.integration

BOUND_S = 0.050

POLLER = r"""
import http.client, json, sys, time
host, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
conn = http.client.HTTPConnection(host, port, timeout=60)
end = time.monotonic() + seconds
print(json.dumps({"ready": time.monotonic()}), flush=True)
while time.monotonic() < end:
    for path in ("/livez", "/health"):
        start = time.monotonic()
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        print(json.dumps([path, start, time.monotonic() - start, resp.status]), flush=True)
    time.sleep(0.005)
"""


def _big_png_body(target_bytes: int) -> bytes:
    """An /encode body of about ``target_bytes``: one noisy PNG (incompressible) as a data: URI."""
    side = int((target_bytes * 3 / 4 / 3) ** 0.5)
    pixels = np.random.default_rng(0).integers(0, 255, size=(side, side, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG", compress_level=0)
    uri = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    return json.dumps({"req_id": "big-body", "modality": "IMAGE", "mm_items": [uri]}).encode()


def _wide_answer_body() -> bytes:
    """256 items of 224x224 (64 rows of 128 each on the tiny Qwen2-VL): a 16384 x 128 answer."""
    buf = io.BytesIO()
    Image.new("RGB", (224, 224), (10, 200, 30)).save(buf, format="PNG")
    uri = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    return json.dumps({"req_id": "wide-answer", "modality": "IMAGE", "mm_items": [uri] * 256}).encode()


def _post(url: str, body: bytes) -> tuple[int, bytes, float]:
    resp = httpx.post(url, content=body, headers={"content-type": "application/json"}, timeout=300)
    return resp.status_code, resp.content, time.monotonic()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("args", [[], ["--dp-size", "2"]], ids=["single-process", "dp2"])
def test_livez_and_health_answer_within_50ms_while_large_bodies_are_parsed_and_rendered(tiny_model, args):
    big, wide = _big_png_body(16 * 2**20), _wide_answer_body()
    assert len(big) >= 16 * 2**20
    env = {"ENCODER_NUM_THREADS": "1", "ENCODER_MAX_BATCH_TOKENS": "16384"}
    with EncoderServer(tiny_model("qwen2_vl"), env=env, args=args) as server, ThreadPoolExecutor(2) as pool:
        poller = subprocess.Popen(
            [sys.executable, "-c", POLLER, "127.0.0.1", str(server.port), "600"], stdout=subprocess.PIPE, text=True
        )
        try:
            assert poller.stdout is not None
            json.loads(poller.stdout.readline())  # the poller is up
            # Live traffic on every rank (requests rotate over equally idle ranks): /health answers from state.
            for i in range(2):
                assert encode(server.base_url, f"warm-{i}", [png_data_uri(40, 40, seed=i)]).status_code == 200
            proven_until = time.monotonic() + HEALTH_SKIP_S - 1.0
            started = time.monotonic()
            heavy = [pool.submit(_post, server.base_url + "/encode", body) for body in (big, wide)]
            answers = [f.result() for f in heavy]
            finished = time.monotonic()
            time.sleep(0.3)
        finally:
            poller.kill()
            out, _ = poller.communicate()
        polls = [json.loads(line) for line in out.splitlines() if line.startswith("[")]
    assert [code for code, _, _ in answers] == [200, 200], [body[:300] for _, body, _ in answers]
    wide_embedding = json.loads(answers[1][1])["embedding"]
    assert wide_embedding["shape"] == [16384, 128] and len(wide_embedding["data"]) > 10 * 2**20
    during = [p for p in polls if started <= p[1] <= finished]
    assert len(during) >= 20, f"only {len(during)} polls overlapped the heavy requests"
    assert all(status == 200 for _, _, _, status in during), [p for p in during if p[3] != 200][:5]
    livez = [p[2] for p in during if p[0] == "/livez"]
    health = [p[2] for p in during if p[0] == "/health" and p[1] <= proven_until]
    assert livez and health
    print(f"/livez max {max(livez) * 1000:.1f} ms, /health max {max(health) * 1000:.1f} ms over {len(during)} polls")
    assert max(livez) < BOUND_S, f"/livez took up to {max(livez) * 1000:.1f} ms (median {np.median(livez) * 1000:.1f})"
    assert max(health) < BOUND_S, f"/health took up to {max(health) * 1000:.1f} ms (median {np.median(health) * 1000:.1f})"
