"""Hang detection is bounded, with the DEFAULT settings, in every mode: SIGSTOP a data-parallel
worker, a tensor-parallel follower, or a tensor-parallel rank 0 under load.

What a user sees: /health keeps answering within a second (503 once the rank is silent for
STALE_HEARTBEAT_S), the other group keeps serving, the stopped process is killed within
ENCODER_DP_HEARTBEAT_TIMEOUT (10 s) and its group restarted, then /health is 200 again.
"""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest

from encoder_pod.readiness import STALE_HEARTBEAT_S
from encoder_pod.settings import ParallelSettings
from tests.support.health_poller import Poller
from testkit.load import ClosedLoop, image_bodies, refused_or_unreachable
from testkit.media import png_data_uri
from testkit.server import EncoderServer, process_alive

pytestmark = pytest.mark.integration

HEARTBEAT_TIMEOUT_S = ParallelSettings().dp_heartbeat_timeout
HANDLER_BOUND_S = 1.0
SLACK_S = 5.0
"""Scheduling slack on a loaded 2-core machine, on top of each bound."""


def _info(server: EncoderServer) -> dict:
    return httpx.get(server.base_url + "/server_info", timeout=5).json()


def _victim(server: EncoderServer, which: str) -> int:
    worker = _info(server)["workers"][1]
    if which == "tp-follower":
        return worker["model"]["tensor_parallel"]["follower_pids"][0]
    return worker["pid"]


CASES = [
    ("dp-worker", "qwen2_vl", ["--dp-size", "2"], "hung"),
    ("tp-follower", "clip", ["--dp-size", "2", "--tp-size", "2"], "tp_group_down"),
    ("tp-rank0", "clip", ["--dp-size", "2", "--tp-size", "2"], "hung"),
]


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("which", "arch", "args", "reason"), CASES, ids=[c[0] for c in CASES])
def test_sigstop_is_503_at_once_killed_within_the_bound_and_the_other_group_serves(tiny_model, which, arch, args, reason):
    env = {"ENCODER_DP_RESTART_BACKOFF": "0.5"}  # every detection bound at its default
    with EncoderServer(tiny_model(arch), env=env, args=args) as server:
        load = ClosedLoop(server.base_url, 4, image_bodies([png_data_uri(64, 64)]), timeout=60,
                          stop_after=refused_or_unreachable).start()
        victim = 0
        try:
            load.wait_ok(8, 120)
            first_pid = _info(server)["workers"][1]["pid"]
            poller = Poller(server.base_url + "/health", interval=0.05, timeout=5)
            time.sleep(1.0)
            victim = _victim(server, which)
            stopped = time.monotonic()
            os.kill(victim, signal.SIGSTOP)
            deadline = stopped + HEARTBEAT_TIMEOUT_S + 60 + 120
            while _info(server)["workers"][1]["deaths"] == 0:
                assert time.monotonic() < stopped + HEARTBEAT_TIMEOUT_S + 60, server.log_text()[-3000:]
                time.sleep(0.05)
            killed_s = time.monotonic() - stopped
            while httpx.get(server.base_url + "/health", timeout=5).status_code != 200:
                assert time.monotonic() < deadline, server.log_text()[-3000:]
                time.sleep(0.2)
            back_s = time.monotonic() - stopped
            probes = poller.stop()
        finally:
            answers = load.stop()
            if victim and process_alive(victim):
                os.kill(victim, signal.SIGKILL)
        worker = _info(server)["workers"][1]
        deaths = server.metric("encoder_dp_worker_deaths_total", 'rank="1"', f'reason="{reason}"')
    after = [p for p in probes if p[0] >= stopped]
    first_503 = next((p[0] - stopped for p in after if p[2] == 503), None)
    slowest = max(p[1] for p in probes)
    during = [a for a in answers if stopped <= a.done <= stopped + killed_s]
    served = sum(1 for a in during if a.status == 200)
    print(
        f"\nSIGSTOP {which} (pid {victim}): /health 503 after {first_503 if first_503 is None else round(first_503, 2)}s, "
        f"slowest /health {slowest * 1000:.0f} ms over {len(probes)} probes, killed after {killed_s:.1f}s "
        f"(ENCODER_DP_HEARTBEAT_TIMEOUT={HEARTBEAT_TIMEOUT_S:g}), /health 200 again after {back_s:.1f}s; "
        f"{served} requests answered 200 by the other group meanwhile; codes {sorted({a.status for a in answers}, key=str)}"
    )
    assert {p[2] for p in probes} <= {200, 503}, [p for p in probes if p[2] not in (200, 503)][:3]  # never a timeout
    assert slowest < HANDLER_BOUND_S
    assert first_503 is not None and first_503 < STALE_HEARTBEAT_S + SLACK_S
    assert killed_s < HEARTBEAT_TIMEOUT_S + SLACK_S
    assert served > 0, "the other group did not serve while this one was stopped"
    assert {a.status for a in answers} <= {200, 503}, [a for a in answers if a.status not in (200, 503)][:3]
    assert max(a.done - a.sent for a in answers) < HEARTBEAT_TIMEOUT_S + SLACK_S + 5
    assert worker["pid"] != first_pid and worker["deaths"] == 1 and deaths == 1, worker
    assert not process_alive(victim)
