"""Tensor-parallel groups when a rank dies or hangs: real processes, real signals, gloo on CPU.

The group is one unit for the data-parallel watchdog: whichever rank fails, the whole group goes
down, its in-flight requests get 503 at once, and it is restarted with backoff.
"""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.integration.encode_client import encode
from tests.integration.test_dp_failures import Load, _info, _wait
from testkit.media import png_data_uri
from testkit.server import EncoderServer, process_alive

pytestmark = pytest.mark.integration

TP2 = ["--tp-size", "2"]


def _follower(server: EncoderServer, rank: int = 0) -> int:
    return _info(server)["workers"][rank]["model"]["tensor_parallel"]["follower_pids"][0]


def _healthy(server: EncoderServer) -> bool:
    return httpx.get(server.base_url + "/health", timeout=30).status_code == 200


@pytest.mark.timeout(300)
def test_sigkill_of_a_follower_under_load_restarts_the_group_and_answers_everyone(tiny_model):
    env = {"ENCODER_DP_RESTART_BACKOFF": "0.5"}
    with EncoderServer(tiny_model("qwen2_vl"), env=env, args=TP2) as server:
        leader, victim = _info(server)["workers"][0]["pid"], _follower(server)
        load = Load(server, clients=4)
        try:
            _wait(lambda: len(load.answers) >= 8, 60, "load", server)
            os.kill(victim, signal.SIGKILL)
            # rank 0 watches its followers: the group is down within moments, not a timeout later.
            noticed = _wait(lambda: _info(server)["workers"][0]["state"] != "ready", 10, "group down", server)
            assert noticed < 3.0, noticed
            _wait(lambda: _healthy(server), 120, "group back", server)
            served = len([a for a in load.answers if a[0] == 200])
            _wait(lambda: len([a for a in load.answers if a[0] == 200]) > served + 3, 60, "group serving", server)
        finally:
            answers = load.stop()
        assert {code for code, _, _ in answers} <= {200, 503}, [a for a in answers if a[0] not in (200, 503)][:5]
        assert max(seconds for _, seconds, _ in answers) < 30
        worker = _info(server)["workers"][0]
        assert worker["deaths"] == 1 and worker["restarts"] == 1, worker
        assert worker["pid"] != leader and _follower(server) != victim
        assert "tensor-parallel group went down" in worker["last_exit"]
        assert server.metric("encoder_dp_worker_deaths_total", 'reason="tp_group_down"') == 1
        assert not process_alive(leader)
        # Whichever noticed first (the watcher, or a broadcast to the dead peer), the group said why.
        assert "tensor-parallel group dp0 is down" in server.log_text()


@pytest.mark.timeout(300)
def test_a_hung_follower_turns_into_a_collective_timeout_not_a_hang(tiny_model):
    # The heartbeat watchdog would never fire: rank 0's event loop is fine, its model thread waits.
    env = {"ENCODER_TP_COLLECTIVE_TIMEOUT": "3", "ENCODER_DP_RESTART_BACKOFF": "0.2"}
    with EncoderServer(tiny_model("qwen2_vl"), env=env, args=TP2) as server:
        victim = _follower(server)
        os.kill(victim, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with ThreadPoolExecutor(3) as pool:
                futures = [pool.submit(encode, server.base_url, f"h{i}", [png_data_uri(48, 48, seed=i)], timeout=60) for i in range(3)]
                answers = [f.result() for f in futures]
            assert time.monotonic() - started < 20
            assert {r.status_code for r in answers} <= {200, 503}, [r.text for r in answers]
            assert any(r.status_code == 503 for r in answers), [r.text for r in answers]
            _wait(lambda: _healthy(server), 120, "group replaced", server)
            assert encode(server.base_url, "after", [png_data_uri(40, 40)], timeout=30).status_code == 200
            # rank 0 killed its stopped follower on the way down: nothing is left behind.
            _wait(lambda: not process_alive(victim), 10, "old follower gone", server)
        finally:
            if process_alive(victim):
                os.kill(victim, signal.SIGKILL)
        assert server.metric("encoder_dp_worker_deaths_total", 'reason="tp_group_down"') == 1


@pytest.mark.timeout(300)
def test_sigkill_of_rank_0_takes_its_followers_down_and_the_group_comes_back(tiny_model):
    env = {"ENCODER_DP_RESTART_BACKOFF": "0.2"}
    with EncoderServer(tiny_model("clip"), env=env, args=TP2) as server:
        leader, follower = _info(server)["workers"][0]["pid"], _follower(server)
        os.kill(leader, signal.SIGKILL)
        _wait(lambda: not process_alive(follower), 10, "orphaned follower exits", server)
        _wait(lambda: _healthy(server), 120, "group back", server)
        assert encode(server.base_url, "after", [png_data_uri(40, 40)], timeout=30).status_code == 200
        assert _info(server)["workers"][0]["last_exit"] == "killed by SIGKILL"
