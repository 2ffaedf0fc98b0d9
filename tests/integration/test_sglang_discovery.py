"""Dynamic discovery against SGLang's real ``EncoderBootstrapServer`` of every release, run from its wheel.

The pod registers once ready, re-registers with a bootstrap that lost it, unregisters at the start
of a drain, and is never evicted by the bootstrap's health probe (SGLang's 2 s timeout) while it
is saturated by 64 concurrent requests.
"""

from __future__ import annotations

import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from encoder_pod.settings import SGLANG_RELEASES
from tests.integration.encode_client import encode
from tests.support.media_host import MediaHost
from testkit.media import png_data_uri
from testkit.server import EncoderServer
from tests.support.sglang_harness import SglangBootstrap

pytestmark = pytest.mark.integration


@pytest.fixture
def bootstraps(sglang_sites: dict[str, Path]) -> Iterator[dict[str, SglangBootstrap]]:
    """One real bootstrap server per release (each in its own process)."""
    started = {release: SglangBootstrap(sglang_sites[release], release) for release in SGLANG_RELEASES}
    try:
        yield started
    finally:
        for boot in started.values():
            if boot.proc.poll() is None:
                boot.stop()


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def test_pod_registers_when_ready_comes_back_after_a_bootstrap_restart_and_leaves_at_drain_start(
    tiny_model, sglang_sites, bootstraps
):
    urls = ",".join(b.url for b in bootstraps.values())
    with MediaHost() as media:
        env = {"ENCODER_REGISTER_URLS": urls, "ENCODER_REGISTER_CHECK_INTERVAL": "1", "ENCODER_ALLOWED_MEDIA_DOMAINS": "127.0.0.1"}
        pod = EncoderServer(tiny_model("qwen2_vl"), env=env).start(wait_ready=False)
        try:
            # Never listed before it is ready: each round reads the lists, then the pod's readiness.
            while True:
                listed = [pod.base_url in b.listed() for b in bootstraps.values()]
                ready = _status(pod, "/health") == 200
                assert ready or not any(listed), "listed by a bootstrap before /health answered 200"
                if all(listed):
                    break
                assert pod.proc is not None and pod.proc.poll() is None, pod.log_text()
                time.sleep(0.1)
            assert all(b.listed() == [pod.base_url] for b in bootstraps.values())  # exact URL, once, no trailing slash

            # A bootstrap that restarts (empty list) gets the pod back within the check interval.
            newest = bootstraps[SGLANG_RELEASES[-1]]
            port = newest.port
            newest.stop()
            bootstraps[SGLANG_RELEASES[-1]] = SglangBootstrap(sglang_sites[SGLANG_RELEASES[-1]], SGLANG_RELEASES[-1], port=port)
            _wait(lambda: bootstraps[SGLANG_RELEASES[-1]].listed() == [pod.base_url], 30, "re-registration after a restart")

            # SIGTERM: gone from every list while a request is still in flight (the drain has only begun).
            with ThreadPoolExecutor(1) as pool:
                held = pool.submit(encode, pod.base_url, "held", [media.base_url + "/held/40x40.png"])
                _wait(lambda: media.hits > 0, 30, "the held request to reach the media host")
                assert pod.proc is not None
                pod.proc.send_signal(signal.SIGTERM)
                _wait(lambda: all(b.listed() == [] for b in bootstraps.values()), 10, "unregistration from every bootstrap")
                assert not held.done(), "unregistered only after in-flight work ended"
                media.release()
                held.result(60)
            assert pod.proc.wait(60) in (0, -signal.SIGTERM)
        finally:
            pod.stop()
    logs = pod.log_text()
    assert logs.count("registered http://127.0.0.1") >= len(SGLANG_RELEASES) + 1 and "unregistered" in logs


def _status(pod: EncoderServer, path: str) -> int | None:
    try:
        return httpx.get(pod.base_url + path, timeout=5).status_code
    except httpx.HTTPError:
        return None


def test_a_saturated_pod_is_never_evicted(tiny_model, sglang_sites):
    """64 concurrent requests for ~20 s; SGLang's probe (2 s timeout, 3 misses evict) keeps the pod listed."""
    boot = SglangBootstrap(sglang_sites[SGLANG_RELEASES[-1]], SGLANG_RELEASES[-1], interval=0.5, timeout=2.0)
    images = [png_data_uri(64 + 8 * (i % 4), 64, seed=i) for i in range(8)]
    stop = threading.Event()
    answered: list[int] = []

    def client(n: int) -> None:
        with httpx.Client(timeout=120) as http:
            i = 0
            while not stop.is_set():
                body = {"req_id": f"load-{n}-{i}", "modality": "IMAGE", "mm_items": [images[(n + i) % len(images)]]}
                answered.append(http.post(pod.base_url + "/encode", json=body).status_code)
                i += 1

    env = {"ENCODER_REGISTER_URLS": boot.url, "ENCODER_MAX_BATCH_SIZE": "8"}
    try:
        with EncoderServer(tiny_model("qwen2_vl"), env=env) as pod:
            _wait(lambda: boot.listed() == [pod.base_url], 30, "registration")
            with ThreadPoolExecutor(64) as pool:
                futures = [pool.submit(client, n) for n in range(64)]
                listed_throughout = True
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline:
                    listed_throughout &= boot.listed() == [pod.base_url]
                    time.sleep(0.25)
                stop.set()
                for future in futures:
                    future.result(180)
            # Read the probe record while the pod still serves: once it drains, /health is 503 on purpose.
            result = boot.stop()
    finally:
        if boot.proc.poll() is None:
            boot.stop()
    ours = [p for p in result["probes"] if p["url"].startswith("http://127.0.0.1")]
    assert len(ours) >= 10 and len(answered) > 64, (len(ours), len(answered))
    assert set(answered) == {200}
    assert listed_throughout and not any("evicted" in line for line in result["logs"]), result["logs"]
    missed = [p for p in ours if not p["ok"]]
    assert not missed, f"probes that missed: {missed}"
