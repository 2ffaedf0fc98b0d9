"""Issue 11, item 9: spec.sglang.registerURLs reaches running prefill servers.

A stand-in for SGLang's EncoderBootstrapServer (test-only: the three endpoints of its API,
``POST /register_encoder_url``, ``DELETE /unregister_encoder_url``, ``GET /list_encoder_urls``,
on loopback, which the local node's pod processes reach) records who registers. A CPU pool names
it in spec.sglang.registerURLs: each encoder pod registers ``http://<its pod IP>:30000``
(ENCODER_ADVERTISE_URL from the downward API's POD_IP) once ready; ``kubectl scale`` up adds a
registration, scaling down withdraws the removed pod's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cluster import Cluster, local_node_placement
from tests.e2e.cluster.api import wait_for
from tests.e2e.cluster.objects import pod_ready
from tests.e2e.pools import Pools, load_example, pool_ready

pytestmark = pytest.mark.e2e

NAME = "registers"
READY_SECONDS = 240.0


class Bootstrap:
    """The registered encoder URLs, as SGLang's bootstrap server keeps them."""

    def __init__(self) -> None:
        self.urls: list[str] = []
        self.lock = threading.Lock()
        bootstrap = self

        class Handler(BaseHTTPRequestHandler):
            def _body(self) -> dict[str, Any]:
                return json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")

            def _send(self, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:  # noqa: N802
                url = self._body()["url"]
                with bootstrap.lock:
                    if url not in bootstrap.urls:
                        bootstrap.urls.append(url)
                self._send({"status": "ok"})

            def do_DELETE(self) -> None:  # noqa: N802
                url = self._body()["url"]
                with bootstrap.lock:
                    bootstrap.urls = [u for u in bootstrap.urls if u != url]
                self._send({"status": "ok"})

            def do_GET(self) -> None:  # noqa: N802
                with bootstrap.lock:
                    self._send({"encoder_urls": list(bootstrap.urls)})

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def registered(self) -> list[str]:
        """The URLs registered right now."""
        with self.lock:
            return sorted(self.urls)


@pytest.fixture
def bootstrap() -> Iterator[Bootstrap]:
    server = Bootstrap()
    server.thread.start()
    try:
        yield server
    finally:
        server.server.shutdown()
        server.server.server_close()


@pytest.fixture
def checkpoint(tmp_path: Path) -> str:
    out = tmp_path / "qwen2_vl-tiny"
    built = subprocess.run([str(Path(sys.executable).parent / "encoder-pod"), "make-tiny-model", "--arch", "qwen2_vl",
                            "--out", str(out)], capture_output=True, text=True, timeout=300,
                           env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert built.returncode == 0, built.stderr
    return str(out)


def test_pods_register_with_the_bootstrap_servers_and_scaling_reaches_them(
        k8s_cluster: Cluster, pools: Pools, bootstrap: Bootstrap, checkpoint: str) -> None:
    if getattr(k8s_cluster, "external", False):
        pytest.skip("the stand-in bootstrap server listens on this machine's loopback, reached by local-node pods")
    manifest = load_example("encoderpool-cpu.yaml")
    manifest["metadata"]["name"] = NAME
    spec = manifest["spec"]
    spec.update(model=checkpoint, replicas=1, parallelism={"tensor": 1, "data": 1}, **local_node_placement())
    spec["sglang"] = {"registerURLs": [bootstrap.url]}
    pools.apply(manifest)

    def urls_of_ready_pods() -> list[str]:
        return sorted(f"http://{p['status']['podIP']}:30000" for p in pools.pods(NAME) if pod_ready(p))

    pools.wait(NAME, pool_ready, READY_SECONDS, "Ready")
    first = wait_for(lambda: bootstrap.registered() == urls_of_ready_pods() and bootstrap.registered(), 60,
                     "the pod to register its pod IP")
    pools.kubectl("scale", f"encpool/{NAME}", "--replicas=2")
    pools.wait(NAME, lambda p: pool_ready(p) and p["status"]["readyReplicas"] == 2, READY_SECONDS, "Ready with 2")
    both = wait_for(lambda: len(bootstrap.registered()) == 2 and bootstrap.registered() == urls_of_ready_pods()
                    and bootstrap.registered(), 60, "both pods registered")
    pools.kubectl("scale", f"encpool/{NAME}", "--replicas=1")
    pools.wait(NAME, lambda p: pool_ready(p) and p["status"]["replicas"] == 1, READY_SECONDS, "scaled to 1")
    last = wait_for(lambda: bootstrap.registered() == first and bootstrap.registered(), 60,
                    "the removed pod to withdraw its registration")
    print(f"\nSGLang registration: {first} -> scaled to 2: {both} -> scaled to 1: {last}")
