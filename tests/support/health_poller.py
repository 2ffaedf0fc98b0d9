"""Polls a path like a kubelet probe does (a new connection each time, a timeout), in a process of its
own so that nothing in the test process competes with it for the GIL.

``python -m tests.support.health_poller URL INTERVAL_S TIMEOUT_S`` prints one JSON line per probe,
``[started_monotonic, seconds, status_or_error, message]``, until killed (SIGTERM).
"""

from __future__ import annotations

import http.client
import json
import signal
import sys
import time
from urllib.parse import urlsplit


def _probe(host: str, port: int, path: str, timeout: float) -> tuple[int | str, str]:
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        body = resp.read()
        message = json.loads(body).get("message", "") if resp.status != 200 and body else ""
        return resp.status, message
    except (OSError, http.client.HTTPException) as exc:
        return type(exc).__name__, str(exc)
    finally:
        conn.close()


def main(argv: list[str]) -> None:
    """Probe until SIGTERM."""
    url, interval, timeout = urlsplit(argv[1]), float(argv[2]), float(argv[3])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(json.dumps({"ready": time.monotonic()}), flush=True)
    while True:
        started = time.monotonic()
        status, message = _probe(url.hostname or "127.0.0.1", url.port or 80, url.path or "/", timeout)
        print(json.dumps([started, time.monotonic() - started, status, message]), flush=True)
        time.sleep(max(0.0, interval - (time.monotonic() - started)))


class Poller:
    """The poller as a subprocess of the test: start, then :meth:`stop` returns every probe."""

    def __init__(self, url: str, interval: float = 0.1, timeout: float = 5.0) -> None:
        import subprocess

        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.health_poller", url, str(interval), str(timeout)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._proc.stdout is not None
        json.loads(self._proc.stdout.readline())  # it runs

    def stop(self) -> list[tuple[float, float, int | str, str]]:
        """Stop it; every probe as (started, seconds, status, message)."""
        self._proc.terminate()
        out, _ = self._proc.communicate(timeout=30)
        probes = []
        for line in out.splitlines():
            try:
                started, seconds, status, message = json.loads(line)
            except ValueError:
                continue  # the header line, or a line cut by the stop
            probes.append((started, seconds, status, message))
        return probes


if __name__ == "__main__":
    main(sys.argv)
