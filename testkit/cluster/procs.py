"""Child processes of the local cluster: each in its own session (process group), logged to a
file, registered with the reaper, and stopped as a whole group.

Own session: Ctrl-C in the terminal reaches only the test runner, which then tears down in order,
instead of hitting etcd and the API server at the same moment as the test. Whole group: a pod
command that forks (an encoder with data-parallel workers) leaves no orphan behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

_REAPER_SCRIPT = Path(__file__).with_name("reaper.py")


class Reaper:
    """Handle on the watchdog process (see reaper.py) that kills our groups if we die."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc = subprocess.Popen(
            [sys.executable, str(_REAPER_SCRIPT)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
            text=True,
        )

    @property
    def pid(self) -> int:
        """PID of the watchdog (tests check it is gone after teardown)."""
        return self._proc.pid

    def _send(self, line: str) -> None:
        with self._lock:
            if self._proc.stdin is None or self._proc.stdin.closed:
                return
            try:
                self._proc.stdin.write(line + "\n")
                self._proc.stdin.flush()
            except BrokenPipeError:
                pass

    def watch(self, pgid: int) -> None:
        """Kill this group if the test process dies."""
        self._send(f"+{pgid}")

    def forget(self, pgid: int) -> None:
        """The group was stopped properly: do not signal a PGID the kernel may reuse."""
        self._send(f"-{pgid}")

    def run_at_exit(self, argv: list[str]) -> None:
        """Run this command when the watchdog ends (after killing the groups)."""
        self._send("C+" + json.dumps(argv))

    def forget_command(self, argv: list[str]) -> None:
        """The cleanup was done properly: do not run it again."""
        self._send("C-" + json.dumps(argv))

    def close(self) -> None:
        """EOF makes the watchdog kill whatever is still registered and exit."""
        with self._lock:
            if self._proc.stdin is not None and not self._proc.stdin.closed:
                self._proc.stdin.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


class ManagedProcess:
    """One command running in its own process group, output appended to ``log_path``."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        reaper: Reaper,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self._reaper = reaper
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            self._proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=dict(env) if env is not None else None,
                cwd=str(cwd) if cwd is not None else None,
            )
        reaper.watch(self._proc.pid)

    @property
    def pid(self) -> int:
        """PID of the command, which is also its process group id."""
        return self._proc.pid

    def poll(self) -> int | None:
        """Exit code, or None while running."""
        return self._proc.poll()

    def send_signal(self, signum: int) -> None:
        """Signal the whole group (a container's SIGTERM reaches every process in it)."""
        self._signal_group(signum)

    def stop(self, grace: float = 5.0) -> int | None:
        """SIGTERM the group, SIGKILL it after ``grace`` seconds; return the exit code."""
        pgid = self._proc.pid
        self._signal_group(signal.SIGTERM)
        try:
            self._proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self._signal_group(signal.SIGKILL)
            self._proc.wait()
        # Children that outlived the leader are still in its group.
        self._signal_group(signal.SIGKILL)
        _wait_group_gone(pgid, timeout=grace)
        self._reaper.forget(pgid)
        return self._proc.returncode

    def _signal_group(self, signum: int) -> None:
        try:
            os.killpg(self._proc.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def log_tail(self, lines: int = 30) -> str:
        """Last lines of the log, for error messages."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def _wait_group_gone(pgid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


def pid_alive(pid: int) -> bool:
    """True if a process with this PID exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            # Field 3 is the state; the command name (field 2) may contain spaces, so split after ')'.
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
