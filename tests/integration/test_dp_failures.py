"""Data-parallel mode when workers die, cannot load, or the pod is stopped: real processes, real signals."""

from __future__ import annotations

import os
import re
import shutil
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from encoder_pod.exitcodes import ExitCode
from tests.integration.encode_client import encode
from tests.support.media_host import MediaHost
from testkit.media import png_data_uri
from testkit.server import EncoderServer, process_alive

pytestmark = pytest.mark.integration

DP2 = ["--dp-size", "2"]


def _info(server: EncoderServer) -> dict:
    return httpx.get(server.base_url + "/server_info", timeout=5).json()


def _wait(predicate, timeout: float, what: str, server: EncoderServer) -> float:
    started = time.monotonic()
    while not predicate():
        assert time.monotonic() - started < timeout, f"{what} not within {timeout}s:\n{server.log_text()[-4000:]}"
        time.sleep(0.02)
    return time.monotonic() - started


class Load:
    """Closed-loop clients that record (status, seconds, message) of every answer."""

    def __init__(self, server: EncoderServer, clients: int = 6, timeout: float = 60) -> None:
        self.server, self.timeout = server, timeout
        self.answers: list[tuple[int | str, float, str]] = []
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(clients)
        self._futures = [self._pool.submit(self._client, i) for i in range(clients)]

    def _client(self, index: int) -> None:
        n = 0
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                r = encode(self.server.base_url, f"load-{index}-{n}", [png_data_uri(96, 96, seed=n)], timeout=self.timeout)
                self.answers.append((r.status_code, time.monotonic() - started, r.text[:300]))
            except httpx.HTTPError as exc:  # a hang past the timeout lands here and fails the test
                self.answers.append((type(exc).__name__, time.monotonic() - started, str(exc)))
            n += 1

    def stop(self) -> list[tuple[int | str, float, str]]:
        self._stop.set()
        for f in self._futures:
            f.result()
        self._pool.shutdown()
        return self.answers


def test_sigkill_under_load_answers_everyone_and_the_worker_comes_back(tiny_model):
    env = {"ENCODER_DP_RESTART_BACKOFF": "0.5"}
    with EncoderServer(tiny_model("qwen2_vl"), env=env, args=DP2) as server:
        load = Load(server)
        try:
            _wait(lambda: len(load.answers) >= 10, 60, "load", server)
            victim = _info(server)["workers"][1]["pid"]
            os.kill(victim, signal.SIGKILL)
            noticed = _wait(lambda: _info(server)["workers"][1]["state"] != "ready", 5, "death noticed", server)
            assert noticed < 1.0, noticed
            assert httpx.get(server.base_url + "/health", timeout=5).status_code == 503
            _wait(lambda: httpx.get(server.base_url + "/health", timeout=30).status_code == 200, 120, "worker back", server)
            routed = server.metric("encoder_dp_routed_requests_total", 'rank="1"')
            _wait(lambda: server.metric("encoder_dp_routed_requests_total", 'rank="1"') > routed + 3, 30,
                  "restarted worker serving", server)
        finally:
            answers = load.stop()
        codes = {code for code, _, _ in answers}
        assert codes <= {200, 503}, [a for a in answers if a[0] not in (200, 503)][:5]
        assert max(seconds for _, seconds, _ in answers) < 30
        assert all("died" in text for code, _, text in answers if code == 503), [a for a in answers if a[0] == 503][:3]
        after_restart = [a for a in answers[-20:]]
        assert all(code == 200 for code, _, _ in after_restart)
        worker = _info(server)["workers"][1]
        assert worker["pid"] != victim and worker["deaths"] == 1 and worker["restarts"] == 1
        assert worker["last_exit"] == "killed by SIGKILL"
        assert server.metric("encoder_dp_worker_deaths_total", 'rank="1"', 'reason="killed"') == 1
        assert server.metric("encoder_dp_worker_restarts_total", 'rank="1"') == 1
        assert f"worker pid {victim} died: killed by SIGKILL" in server.log_text()

        # Every worker dead: /encode and /health answer 503 at once, then both come back.
        pids = [w["pid"] for w in _info(server)["workers"]]
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        _wait(lambda: _info(server)["state"] != "ready", 5, "deaths noticed", server)
        started = time.monotonic()
        dead = encode(server.base_url, "all-dead", [png_data_uri(32, 32)], timeout=10)
        assert dead.status_code == 503 and time.monotonic() - started < 0.5, dead.text
        assert "dead" in dead.json()["message"] or "died" in dead.json()["message"]
        assert httpx.get(server.base_url + "/health", timeout=5).status_code == 503
        _wait(lambda: httpx.get(server.base_url + "/health", timeout=30).status_code == 200, 120, "both back", server)
        assert encode(server.base_url, "after", [png_data_uri(32, 32)]).status_code == 200


def test_a_rank_that_cannot_load_is_given_up_after_its_failed_starts_and_the_pod_exits_3(tiny_model, tmp_path):
    # Corrupt weights: a load error that is no refusal, so each rank retries it (a GPU can fail
    # transiently) up to ENCODER_DP_MAX_FAILED_STARTS. Before, the front then stayed up failed for
    # good (/health 503), which the operator saw as Starting forever; now the first rank given up
    # stops the pod: its workers stop and it exits 3 naming the rank and the reason.
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model("qwen2_vl"), broken)
    for f in broken.glob("*.safetensors"):
        f.write_bytes(b"not a safetensors file")
    env = {"ENCODER_DP_MAX_FAILED_STARTS": "2", "ENCODER_DP_RESTART_BACKOFF": "0.2"}
    server = EncoderServer(broken, env=env, args=DP2).start(wait_ready=False)
    assert server.proc is not None
    try:
        code = server.proc.wait(300)  # two starts of about 30 s each on a busy 2-core host, never staying up
    finally:
        server.stop(timeout=10)
    log = server.log_text()
    assert code == ExitCode.MODEL_LOAD_FAILED, log[-4000:]
    last = log.strip().splitlines()[-1]
    given_up = re.fullmatch(
        r"encoder-pod: model load failed: worker ([01]): SafetensorError: (.+) \(after 2 failed starts\)", last
    )
    assert given_up is not None, log[-4000:]
    rank = given_up.group(1)
    starts = re.findall(r"rank (\d): worker pid (\d+) started", log)
    # Each rank was started twice (its restart follows its first failure by 0.2 s, long before the
    # other rank's second load ends), and none a third time.
    assert sorted(r for r, _ in starts) == ["0", "0", "1", "1"], log[-4000:]
    assert len(re.findall(rf"rank {rank}: worker pid \d+ died: model failed to load", log)) == 2, log[-4000:]
    assert len(re.findall(rf"\[rank {rank}\] encoder_pod.runtime: model load failed: SafetensorError", log)) == 2
    assert f"rank {rank}: given up: SafetensorError" in log
    assert not any(process_alive(int(pid)) for _, pid in starts), starts
    assert "Traceback" not in log


def test_sigterm_drains_every_request_stops_workers_and_removes_ipc_files(tiny_model):
    env = {"ENCODER_ALLOW_URL_FETCH": "true", "ENCODER_ALLOWED_URL_HOSTS": "127.0.0.1"}
    with MediaHost() as host:
        server = EncoderServer(tiny_model("qwen2_vl"), env=env, args=DP2).start()
        info = _info(server)
        pids, ipc_dir = [w["pid"] for w in info["workers"]], Path(info["ipc_dir"])
        assert ipc_dir.is_dir()
        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(encode, server.base_url, f"t{i}", [host.base_url + "/held/40x40.png"]) for i in range(4)]
            _wait(lambda: _info(server)["inflight"] == 4, 20, "requests in flight", server)
            server.proc.send_signal(signal.SIGTERM)
            _wait(lambda: httpx.get(server.base_url + "/health", timeout=5).status_code == 503, 5, "draining", server)
            late = encode(server.base_url, "late", [png_data_uri(32, 32)])
            assert late.status_code == 503 and late.headers["retry-after"] == "1", late.text
            host.release()
            answers = [f.result() for f in futures]
        # The drain delivers what the workers held, then they stop and the process exits 0.
        assert [r.status_code for r in answers] == [200] * 4, [r.text[:200] for r in answers]
        assert server.proc.wait(60) == 0
        assert not any(process_alive(pid) for pid in pids)
        assert not ipc_dir.exists()
        assert "data-parallel front stopped" in server.log_text()


def test_hung_worker_is_killed_and_replaced(tiny_model):
    env = {"ENCODER_DP_HEARTBEAT_TIMEOUT": "2", "ENCODER_DP_RESTART_BACKOFF": "0.2"}
    with EncoderServer(tiny_model("qwen2_vl"), env=env, args=DP2) as server:
        victim = _info(server)["workers"][0]["pid"]
        os.kill(victim, signal.SIGSTOP)  # alive, but answers nothing: a wedged worker
        started = time.monotonic()
        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(encode, server.base_url, f"h{i}", [png_data_uri(32, 32, seed=i)], timeout=30) for i in range(4)]
            answers = [f.result() for f in futures]
        assert time.monotonic() - started < 10
        assert {r.status_code for r in answers} <= {200, 503}
        assert any(r.status_code == 503 and "died" in r.json()["message"] for r in answers), [r.text for r in answers]
        _wait(lambda: httpx.get(server.base_url + "/health", timeout=30).status_code == 200, 120, "worker replaced", server)
        worker = _info(server)["workers"][0]
        assert worker["pid"] != victim and "without a heartbeat" in worker["last_exit"]
        assert server.metric("encoder_dp_worker_deaths_total", 'rank="0"', 'reason="hung"') == 1
        assert not process_alive(victim)
