"""Where the front and its workers meet: ``ipc://`` sockets in a private temporary directory.

The directory is created with mode 0700 (``mkdtemp``), so no other user on the host can connect
to a worker's socket, and it is removed when the front stops.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

MAX_IPC_PATH = 100
"""Unix socket paths are limited to 107 bytes (sun_path); keep a margin for file names."""


class IpcDir:
    """The private socket directory of one front, and the addresses inside it."""

    def __init__(self) -> None:
        base = tempfile.gettempdir()
        # A long TMPDIR (macOS, some CI runners) would overflow sun_path; /tmp always fits.
        if len(base) > MAX_IPC_PATH - 40:
            base = "/tmp"
        self.path = Path(tempfile.mkdtemp(prefix="encoderpool-dp-", dir=base))

    @property
    def results(self) -> str:
        """The one PULL socket every worker pushes its answers to (bound by the front)."""
        return f"ipc://{self.path}/results"

    def worker_inbox(self, rank: int, generation: int) -> str:
        """The PUSH socket that feeds one incarnation of one rank (bound by the front).

        A new address per restart: a message queued for a dead incarnation can never be read
        by its successor.
        """
        return f"ipc://{self.path}/rank{rank}-g{generation}"

    def remove_inbox(self, rank: int, generation: int) -> None:
        """Delete the socket file of a finished incarnation (ZMQ leaves it behind on close)."""
        (self.path / f"rank{rank}-g{generation}").unlink(missing_ok=True)

    def remove(self) -> None:
        """Delete the directory and every socket file in it."""
        shutil.rmtree(self.path, ignore_errors=True)
        log.debug("removed IPC directory %s", self.path)
