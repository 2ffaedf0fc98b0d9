"""A real ``encoder-pod serve`` subprocess on a free loopback port, for tests and benchmarks."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, exited but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EncoderServer:
    """Starts the real server as a subprocess; stops it (and checks it stopped) on exit."""

    def __init__(self, model_path: Path | str, env: dict[str, str] | None = None, args: list[str] | None = None):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._model_path = str(model_path)
        self._env = env or {}
        self._args = args or []
        self._log = tempfile.NamedTemporaryFile(prefix="encoder-pod-", suffix=".log", delete=False)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, wait_ready: bool = True, timeout: float = 180.0) -> "EncoderServer":
        """Launch; with ``wait_ready``, wait until /health answers 200."""
        env = {**os.environ, "ENCODER_LOG_LEVEL": "info", **self._env}
        cmd = [sys.executable, "-m", "encoder_pod.cli", "serve", "--model-path", self._model_path,
               "--host", "127.0.0.1", "--port", str(self.port), *self._args]
        self.proc = subprocess.Popen(cmd, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        if wait_ready:
            try:
                self.wait_status("/health", 200, timeout)
            except BaseException:
                # `with EncoderServer(...)` never reaches __exit__ when start fails: stop it here.
                self.stop(signal.SIGKILL, timeout=10)
                raise
        return self

    def wait_status(self, path: str, status: int, timeout: float) -> None:
        """Poll ``path`` until it answers ``status``; fail with the server log otherwise."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_text()}")
            try:
                last = httpx.get(self.base_url + path, timeout=5).status_code
                if last == status:
                    return
            except httpx.HTTPError as exc:
                last = exc
            time.sleep(0.1)
        raise TimeoutError(f"{path} never answered {status} (last: {last}):\n{self.log_text()}")

    def log_text(self) -> str:
        """Everything the server printed so far."""
        return Path(self._log.name).read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        """Send ``sig`` and wait; kills after ``timeout``. Returns the exit code."""
        self._log.close()  # the child holds its own descriptor; ours is only for writing
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def metric(self, name: str, *labels: str) -> float:
        """Sum of the samples of metric ``name`` whose labels contain every ``labels`` string."""
        text = httpx.get(self.base_url + "/metrics", timeout=10).text
        total = 0.0
        for line in text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            head, _, value = line.rpartition(" ")
            if head.split("{", 1)[0] == name and all(label in head for label in labels):
                total += float(value)
        return total

    def __enter__(self) -> "EncoderServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        os.unlink(self._log.name)
