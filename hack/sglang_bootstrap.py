"""Run ONE SGLang release's own ``EncoderBootstrapServer`` (the prefill side's dynamic discovery), standalone.

Usage: python hack/sglang_bootstrap.py SITE_DIR RELEASE [PORT]

Only that class and environ.py are loaded from the release (hack/sglang_release.py): no torch,
zmq or numpy. Its health probe is tuned through SGLang's own env names
(``SGLANG_ENCODER_BOOTSTRAP_HEALTH_CHECK_INTERVAL`` / ``_TIMEOUT`` / ``SGLANG_ENCODER_BOOTSTRAP_EVICTED_TTL``).
Each probe's outcome and duration is recorded by wrapping the instance's ``_probe`` (observation
only: the class and its eviction logic are the release's). Prints ``READY {"port": P}``; when stdin
closes, prints ``RESULT {"urls", "probes", "logs"}`` and exits.
"""

from __future__ import annotations

import json
import logging
import socket
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sglang_release  # noqa: E402


class Tap(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname}: {record.getMessage()}")


def main() -> None:
    site, version = Path(sys.argv[1]), sys.argv[2]
    for heavy in ("torch", "zmq", "numpy", "transformers"):
        sys.modules[heavy] = None  # type: ignore[assignment]  # prove the bootstrap needs none of them
    tap = Tap()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    logging.getLogger().addHandler(tap)
    server_cls = sglang_release.load_bootstrap(site)
    port = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    if not port:
        with socket.socket() as probe_port:
            probe_port.bind(("127.0.0.1", 0))
            port = probe_port.getsockname()[1]
    server = server_cls(host="127.0.0.1", port=port)
    probes: list[dict[str, Any]] = []
    original = server._probe
    started = time.monotonic()

    async def observed(session: Any, url: str) -> bool:
        t0 = time.monotonic()
        ok = await original(session, url)
        probes.append({"url": url, "ok": ok, "at_s": round(t0 - started, 3), "seconds": round(time.monotonic() - t0, 4)})
        return ok

    server._probe = observed
    import requests

    for _ in range(200):
        try:
            requests.get(f"http://127.0.0.1:{port}/health", timeout=0.5)
            break
        except requests.RequestException:
            time.sleep(0.05)
    print("READY " + json.dumps({"port": port, "release": version}), flush=True)
    for _ in sys.stdin:
        pass
    result = {"urls": server.list_urls(), "probes": probes, "logs": tap.lines}
    server.close()
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
