"""SGLang's own prefill-side code, one process per release, for the interop tests.

The wheels are fetched ``--no-deps`` and unpacked into a cache outside the repo by
hack/sglang-receiver.sh (once per machine; offline afterwards). Each release runs in its own
long-lived subprocess (hack/sglang_receiver_harness.py) that loads that release's real source
files; a test sends it a scenario and drives the encoder side while the release receives.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from encoder_pod.settings import SGLANG_RELEASES

REPO = Path(__file__).resolve().parents[2]

HARNESS_ENV = {
    # SGLang's real environ.py reads these (its defaults are 180 s and 1800 s): a broken test fails sooner.
    "SGLANG_ENCODER_RECV_TIMEOUT": "60",
    "SGLANG_ENCODER_HTTP_TIMEOUT": "60",
    "MC_FORCE_TCP": "1",
}


def install_releases(releases: tuple[str, ...] = SGLANG_RELEASES) -> dict[str, Path]:
    """Each release's unpacked source directory (downloads what the cache lacks; raises if it cannot)."""
    proc = subprocess.run(["bash", str(REPO / "hack/sglang-receiver.sh"), *releases], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(
            f"hack/sglang-receiver.sh could not fetch sglang {', '.join(releases)} (needs the package index once):\n{proc.stderr[-2000:]}"
        )
    sites = [Path(line) for line in proc.stdout.split()]
    return dict(zip(releases, sites))


class SglangHarness:
    """One release's receiver process: ``start(spec)`` sends a scenario and returns READY, ``result()`` its RESULT."""

    def __init__(self, site: Path, release: str) -> None:
        self.release = release
        cmd = [sys.executable, str(REPO / "hack/sglang_receiver_harness.py"), str(site), release]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **HARNESS_ENV})
        self._lines: queue.Queue[str] = queue.Queue()
        self._err: list[str] = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, self._lines.put), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, self._err.append), daemon=True).start()
        self.loaded = self._next("LOADED", 120)

    @staticmethod
    def _pump(stream: Any, sink: Any) -> None:
        for line in stream:
            sink(line)
        stream.close()

    def stderr_tail(self, n: int = 4000) -> str:
        """The end of what the release logged."""
        return "".join(self._err)[-n:]

    def _next(self, tag: str, timeout: float) -> dict[str, Any]:
        while True:
            try:
                line = self._lines.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"sglang {self.release} harness gave no {tag} in {timeout}s:\n{self.stderr_tail()}") from None
            if line.startswith(tag + " "):
                return json.loads(line[len(tag) + 1 :])
            if line.startswith("RESULT ") and tag == "READY":  # the scenario broke before it was listening
                raise AssertionError(f"sglang {self.release} harness scenario failed:\n{json.loads(line[7:]).get('error')}")

    def start(self, spec: dict[str, Any], timeout: float = 60) -> dict[str, Any]:
        """Send one scenario; its READY payload (ports) once the release is listening."""
        assert self.proc.stdin is not None and self.proc.poll() is None, self.stderr_tail()
        self.proc.stdin.write(json.dumps(spec) + "\n")
        self.proc.stdin.flush()
        return self._next("READY", timeout)

    def result(self, timeout: float = 120) -> dict[str, Any]:
        """The scenario's RESULT; a scenario that broke inside the harness fails the test with its traceback."""
        result = self._next("RESULT", timeout)
        if "error" in result:
            raise AssertionError(f"sglang {self.release} harness scenario failed:\n{result['error']}")
        return result

    def run(self, spec: dict[str, Any], timeout: float = 120) -> dict[str, Any]:
        """A scenario that needs nothing from the test between READY and RESULT."""
        self.start(spec)
        return self.result(timeout)

    def close(self) -> None:
        """End the process (stdin closed: it exits by itself)."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class SglangBootstrap:
    """One release's real ``EncoderBootstrapServer`` in its own process (hack/sglang_bootstrap.py)."""

    def __init__(self, site: Path, release: str, *, port: int = 0, interval: float = 0.5, timeout: float = 2.0,
                 evicted_ttl: float = 600.0) -> None:
        self.release = release
        env = {**os.environ, "SGLANG_ENCODER_BOOTSTRAP_HEALTH_CHECK_INTERVAL": str(interval),
               "SGLANG_ENCODER_BOOTSTRAP_HEALTH_CHECK_TIMEOUT": str(timeout), "SGLANG_ENCODER_BOOTSTRAP_EVICTED_TTL": str(evicted_ttl)}
        cmd = [sys.executable, str(REPO / "hack/sglang_bootstrap.py"), str(site), release, str(port)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("READY "):
            self.proc.kill()
            raise AssertionError(f"sglang {release} bootstrap did not start: {line!r}")
        self.port = json.loads(line[6:])["port"]
        self.url = f"http://127.0.0.1:{self.port}"

    def listed(self) -> list[str]:
        """``GET /list_encoder_urls``, as the prefill's dispatcher sees it."""
        import httpx

        return list(httpx.get(self.url + "/list_encoder_urls", timeout=5).json()["encoder_urls"])

    def stop(self) -> dict[str, Any]:
        """Stop it; its probe record (each probe's url, ok, seconds) and its log lines."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        try:
            for line in self.proc.stdout:
                if line.startswith("RESULT "):
                    return dict(json.loads(line[7:]))
            return {}
        finally:
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc.stdout.close()
