"""The rate-limited log line about callers that went away."""

from __future__ import annotations

import logging

from encoder_pod.api.disconnects import GoneClients


def test_one_line_per_interval_carrying_how_many_were_left_out(caplog):
    now = [100.0]
    gone = GoneClients(interval=10.0, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="encoder_pod.api.disconnects"):
        logged = [gone.record("/encode") for _ in range(500)]
        now[0] += 10.0
        logged.append(gone.record("/send"))
        now[0] += 3.0
        logged.append(gone.record("/encode"))
    assert logged.count(True) == 2 and logged[0] and logged[-2]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert "on /encode" in lines[0] and "more" not in lines[0]
    assert "on /send (499 more since the previous line)" in lines[1] and "counted as 499" in lines[1]
