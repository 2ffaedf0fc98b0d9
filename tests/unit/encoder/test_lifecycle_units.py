"""Pure parts of the lifecycle: the drain timeout, the draining refusal across the DP boundary, the
readiness verdict, follower heartbeats (a real pipe)."""

from __future__ import annotations

import os
import time

import pytest

from encoder_pod.errors import Draining, ShuttingDown
from encoder_pod.parallel.messages import Error, pack, unpack
from encoder_pod.parallel.tensor.beats import BeatReader
from encoder_pod.readiness import HEALTH_SKIP_S, Readiness
from encoder_pod.settings import SettingsError, load_settings

pytestmark = pytest.mark.unit


def test_drain_timeout_defaults_to_the_request_timeout_plus_5():
    assert load_settings(env={}).drain_timeout_s() == 185.0
    assert load_settings(env={"ENCODER_REQ_TIMEOUT": "30"}).drain_timeout_s() == 35.0
    assert load_settings(env={"ENCODER_REQ_TIMEOUT": "30", "ENCODER_DRAIN_TIMEOUT": "7.5"}).drain_timeout_s() == 7.5
    assert load_settings(cli={"drain_timeout": "0"}, env={}).drain_timeout_s() == 0.0
    with pytest.raises(SettingsError, match="ENCODER_DRAIN_TIMEOUT"):
        load_settings(env={"ENCODER_DRAIN_TIMEOUT": "-1"})


def test_a_draining_refusal_is_503_with_retry_after_even_from_a_worker():
    err = Draining("draining: bye", req_id="r1")
    assert isinstance(err, ShuttingDown) and err.http_status == 503 and err.retry_after == 1
    assert ShuttingDown("stopping").retry_after is None
    msg, _ = unpack(pack(Error.of(0, 1, 7, err)))
    assert isinstance(msg, Error)
    back = msg.to_exception()
    assert isinstance(back, Draining) and back.retry_after == 1 and back.req_id == "r1"


def test_the_readiness_verdict_follows_successes_probes_and_their_time():
    r = Readiness(health_timeout=20)
    assert r.problem(now=100) == "the first health encode has not finished yet" and r.probe_due(now=100)
    r.success.record(now=100)
    assert r.problem(now=101) is None and not r.probe_due(now=101)
    assert r.probe_due(now=100 + HEALTH_SKIP_S)  # no success for HEALTH_SKIP_S: a probe is due
    r.probe_started(now=106)
    assert not r.probe_due(now=107)  # one at a time
    assert r.problem(now=125) is None  # a slow probe is fine up to HEALTH_TIMEOUT ...
    assert "has not finished after 21.0s" in r.problem(now=127)  # ... not beyond
    r.probe_finished("boom", now=128)
    assert r.problem(now=128) == "health encode failed: boom" and r.last_probe_s == 22
    r.success.record(now=129)  # live traffic succeeded again
    assert r.problem(now=129) is None and r.describe(now=130)["probes"] == 1


def test_a_silent_follower_is_reported_then_declared_down():
    silent: list[int] = []
    beats = BeatReader([1, 2], timeout=0.6, on_silent=lambda rank, s: silent.append(rank))
    write_fd = os.dup(beats.write_fd)  # the "followers" (this test) keep a write end
    beats.start()
    beats.serving()
    deadline = time.monotonic() + 10
    while not silent and time.monotonic() < deadline:
        os.write(write_fd, bytes([1]))  # rank 1 beats, rank 2 never does
        time.sleep(0.1)
        assert [r for r, _ in beats.silent(5.0)] == []
    os.close(write_fd)
    assert silent == [2]
    assert [r for r, _ in beats.silent(0.5)] == [2]
