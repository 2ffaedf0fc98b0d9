"""Callers that went away before their answer: not server errors, and worth a log line now and then.

A client that closes its connection mid-body (or after its body, before the answer) is nginx's
499: it is counted under that code in ``encoder_requests_total`` (for ``/encode``), never as a
500, and never logs a traceback. Such closes are cheap to cause in bulk, so the log gets at most
one line per :data:`LOG_INTERVAL_S`, carrying how many were left out since the previous one.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

log = logging.getLogger(__name__)

CLIENT_GONE = 499
"""Status recorded (never sent) for a request whose caller disconnected (nginx's convention)."""

LOG_INTERVAL_S = 10.0
"""At most one log line about disconnected callers per this many seconds."""


class GoneClients:
    """Logs callers that disconnected before their answer, at most one line per ``interval`` seconds."""

    def __init__(self, interval: float = LOG_INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._interval = interval
        self._clock = clock
        self._last: float | None = None
        self._left_out = 0

    def record(self, path: str) -> bool:
        """Note one disconnected caller of ``path``; True when this one was logged."""
        now = self._clock()
        if self._last is not None and now - self._last < self._interval:
            self._left_out += 1
            return False
        more = f" ({self._left_out} more since the previous line)" if self._left_out else ""
        log.info(
            "a client disconnected before its answer on %s%s: not a server error, counted as %d",
            path, more, CLIENT_GONE,
        )
        self._last, self._left_out = now, 0
        return True
