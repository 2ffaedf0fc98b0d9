"""Follower heartbeats: every follower writes its rank (one byte) into one pipe every :data:`BEAT_S`.

Rank 0 reads them on a thread. A follower that stops writing (SIGSTOP, a wedged interpreter)
would otherwise be noticed only by a collective timing out, and an idle group runs no collective
that waits for it; so rank 0 takes the group down once a follower is silent for
``ENCODER_DP_HEARTBEAT_TIMEOUT`` (the same bound as a data-parallel worker), and reports it
silent in its own heartbeats from :data:`~encoder_pod.readiness.STALE_HEARTBEAT_S` on (``/health``
503, no new traffic). A follower still loading gets :data:`LOADING_SILENCE_S` at least.

Writes of one byte into a pipe are atomic and non-blocking here; a full pipe (rank 0 stopped
reading) only drops beats.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from typing import Callable, Sequence

log = logging.getLogger(__name__)

BEAT_S = 0.5
"""How often a follower writes its beat."""
LOADING_SILENCE_S = 60.0
"""Silence allowed while the group is still joining (interpreter start, imports, weights), at least."""


class BeatReader:
    """Rank 0's side: the pipe, the last beat of each follower, and the watchdog thread."""

    def __init__(self, ranks: Sequence[int], timeout: float, on_silent: Callable[[int, float], None]) -> None:
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.write_fd, False)  # the followers' writes never block
        self._timeout = timeout
        self._on_silent = on_silent
        now = time.monotonic()
        self._last = {rank: now for rank in ranks}
        self._serving = False
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tp-beats", daemon=True)

    def start(self) -> None:
        """Close rank 0's copy of the write end (the followers hold theirs) and start watching."""
        os.close(self.write_fd)
        self._thread.start()

    def serving(self) -> None:
        """The group is serving: from now on the tight bound applies."""
        self._serving = True

    def silent(self, bound: float, now: float | None = None) -> list[tuple[int, float]]:
        """(rank, seconds) of every follower silent longer than ``bound``."""
        now = time.monotonic() if now is None else now
        return [(rank, now - last) for rank, last in sorted(self._last.items()) if now - last > bound]

    def close(self) -> None:
        """Stop watching (the group is closing)."""
        self._closed.set()

    def _loop(self) -> None:
        while not self._closed.is_set():
            readable, _, _ = select.select([self.read_fd], [], [], 0.25)
            if readable:
                data = os.read(self.read_fd, 4096)
                if not data:
                    return  # every follower is gone; their exits are watched elsewhere
                now = time.monotonic()
                for rank in data:
                    if rank in self._last:
                        self._last[rank] = now
            if self._closed.is_set():
                return
            limit = self._timeout if self._serving else max(self._timeout, LOADING_SILENCE_S)
            for rank, seconds in self.silent(limit):
                self._on_silent(rank, seconds)
                return


def beat_forever(fd: int, rank: int) -> None:
    """A follower's side: start the thread that writes ``rank`` into ``fd`` every :data:`BEAT_S`."""

    def beat() -> None:
        byte = bytes([rank])
        while True:
            try:
                os.write(fd, byte)
            except BlockingIOError:
                pass  # rank 0 is not reading (stopped): drop the beat
            except OSError:
                return  # rank 0 is gone; the leader watch ends this process
            time.sleep(BEAT_S)

    threading.Thread(target=beat, name="tp-beat", daemon=True).start()
