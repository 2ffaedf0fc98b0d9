"""Peer servers as subprocesses: start in a session of their own, wait until ready, stop them all.

A peer (infinity-emb, Ray Serve) runs from its own virtual environment and may start helper
processes of its own (Ray starts a GCS, a raylet, workers and an HTTP proxy). Each one is started
as the leader of a new session, so stopping signals the whole group and then kills whatever of
that session is left; nothing outlives the benchmark.

CPU time is read from ``/proc`` for a process and all its descendants, so a point can say how
much CPU the measured stack used per image and how much the idle stacks used meanwhile.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import httpx

PROC = Path("/proc")


@dataclass(frozen=True)
class ProcStat:
    """The fields of ``/proc/<pid>/stat`` this module uses."""

    pid: int
    ppid: int
    session: int
    cpu_ticks: int
    """utime + stime, in clock ticks."""


def parse_stat(text: str) -> ProcStat:
    """Parse one ``/proc/<pid>/stat`` line (the command name may hold spaces and parentheses)."""
    pid = int(text[: text.index(" ")])
    rest = text[text.rindex(")") + 2 :].split()
    # rest[0] is field 3 (state): ppid is field 4, session 6, utime 14, stime 15.
    return ProcStat(pid=pid, ppid=int(rest[1]), session=int(rest[3]), cpu_ticks=int(rest[11]) + int(rest[12]))


def all_stats() -> list[ProcStat]:
    """Every process readable right now (processes that exit while scanned are skipped)."""
    out = []
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            try:
                out.append(parse_stat((entry / "stat").read_text()))
            except (OSError, ValueError, IndexError):
                continue
    return out


def descendants(root: int, stats: list[ProcStat]) -> list[ProcStat]:
    """``root`` and every process below it in ``stats`` (by parent id)."""
    children: dict[int, list[ProcStat]] = {}
    for s in stats:
        children.setdefault(s.ppid, []).append(s)
    found = [s for s in stats if s.pid == root]
    queue = [root]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child.pid)
    return found


def tree_cpu_seconds(root: int, stats: list[ProcStat] | None = None) -> float:
    """CPU seconds used so far by ``root`` and its living descendants."""
    ticks = sum(s.cpu_ticks for s in descendants(root, stats if stats is not None else all_stats()))
    return ticks / os.sysconf("SC_CLK_TCK")


def session_cpu_seconds(session: int, stats: list[ProcStat] | None = None) -> float:
    """CPU seconds used so far by the living processes of ``session`` (orphans included)."""
    ticks = sum(s.cpu_ticks for s in (stats if stats is not None else all_stats()) if s.session == session)
    return ticks / os.sysconf("SC_CLK_TCK")


def session_members(session: int) -> list[int]:
    """Process ids whose session is ``session``."""
    return [s.pid for s in all_stats() if s.session == session]


class PeerServer:
    """One server command in a session of its own, its output in a temporary log file."""

    def __init__(self, name: str, cmd: list[str], base_url: str, env: dict[str, str] | None = None):
        self.name = name
        self.cmd = cmd
        self.base_url = base_url
        self.env = env or {}
        self.log = Path(tempfile.mkstemp(prefix=f"peer-{name}-", suffix=".log")[1])
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        """The process id of the server (the session leader)."""
        if self.proc is None:
            raise RuntimeError(f"{self.name} is not started")
        return self.proc.pid

    def start(self, ready: Callable[[httpx.Client], bool], timeout: float) -> "PeerServer":
        """Launch and poll ``ready`` until it returns true; stops the server if it never does."""
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(self.cmd, env={**os.environ, **self.env}, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        try:
            with httpx.Client(timeout=10) as client:
                while time.monotonic() < deadline:
                    if self.proc.poll() is not None:
                        raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.tail()}")
                    try:
                        if ready(client):
                            return self
                    except httpx.HTTPError:
                        pass
                    time.sleep(0.5)
            raise TimeoutError(f"{self.name} not ready after {timeout:.0f} s:\n{self.tail()}")
        except BaseException:
            self.stop()
            raise

    def tail(self, chars: int = 4000) -> str:
        """The end of the server's log."""
        return self.log.read_text(errors="replace")[-chars:]

    def stop(self, grace: float = 30.0) -> list[int]:
        """SIGTERM to the server (it shuts its helpers down), then to the rest of its session, then
        SIGKILL to whatever of the session is left; returns the pids that had to be killed."""
        if self.proc is None:
            return []
        session = self.proc.pid
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        for pid in session_members(session):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while session_members(session) and time.monotonic() < deadline:
            time.sleep(0.2)
        leftovers = session_members(session)
        for pid in leftovers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc.poll() is None:
            self.proc.wait(10)
        return leftovers

    def __enter__(self) -> "PeerServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.log.unlink(missing_ok=True)
