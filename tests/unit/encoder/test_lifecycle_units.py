"""The drain's pure parts: its timeout default, and the draining refusal across the DP boundary."""

from __future__ import annotations

import pytest

from encoder_pod.errors import Draining, ShuttingDown
from encoder_pod.parallel.messages import Error, pack, unpack
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
