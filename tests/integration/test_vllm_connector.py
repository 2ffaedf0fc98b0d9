"""EncoderPoolECConnector against vLLM 0.34.0's own base class and factory (CPU only, real sockets).

The pods here are plain HTTP servers on loopback serving files of the ECExampleConnector layout
(the pod's own route is exercised end to end by tests/integration/test_vllm_epd.py).
"""

from __future__ import annotations

import http.server
import threading
from pathlib import Path
from typing import Iterator

import pytest
import torch

from encoder_pod.transfer.tensors import tensor_bytes
from encoder_pod.vllm_epd.storage import EcStore
from tests.integration.test_vllm_epd import Request, consumer_load
from testkit.server import free_port
from tests.support.vllm_harness import vllm_release

pytestmark = pytest.mark.integration


@pytest.fixture
def pod(tmp_path: Path) -> Iterator[tuple[str, EcStore]]:
    """A loopback server answering HEAD/GET /v1/ec_cache/<id> from an EcStore, as the pod does."""
    store = EcStore(tmp_path / "ec", max_bytes=1 << 24, max_age_s=600)

    class Handler(http.server.BaseHTTPRequestHandler):
        def _body(self) -> bytes | None:
            return store.read(self.path.removeprefix("/v1/ec_cache/"))

        def do_HEAD(self) -> None:  # noqa: N802
            self.send_response(200 if self._body() is not None else 404)
            self.send_header("content-length", "0")
            self.end_headers()

        def do_GET(self) -> None:  # noqa: N802
            body = self._body()
            self.send_response(200 if body is not None else 404)
            self.send_header("content-length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", store
    finally:
        server.shutdown()
        server.server_close()


def ours(urls: list[str]) -> dict:
    return {"ec_connector": "EncoderPoolECConnector", "ec_role": "ec_consumer", "ec_connector_module_path": "encoder_pod.vllm_epd.connector",
            "ec_connector_extra_config": {"encoder_urls": urls, "timeout_s": 2}}


def test_it_is_a_complete_vllm_connector_chosen_by_vllms_factory():
    release = vllm_release()
    from encoder_pod.vllm_epd.connector import EncoderPoolECConnector

    config = release.loader.vllm_config(release, **ours(["http://127.0.0.1:1"]))
    assert release.factory.ECConnectorFactory.get_connector_class(config.ec_transfer_config) is EncoderPoolECConnector
    assert issubclass(EncoderPoolECConnector, release.base.ECConnectorBase)
    assert not EncoderPoolECConnector.__abstractmethods__  # every abstract method of the release's base is implemented
    for role, message in (("ec_producer", "for consumers"), ("ec_both", "for consumers")):
        with pytest.raises(ValueError, match=message):
            EncoderPoolECConnector(release.loader.vllm_config(release, **{**ours(["http://x"]), "ec_role": role}),
                                   release.base.ECConnectorRole.SCHEDULER)
    with pytest.raises(ValueError, match="encoder_urls or .encoder_service"):
        EncoderPoolECConnector(release.loader.vllm_config(release, **{**ours([]), "ec_connector_extra_config": {}}),
                               release.base.ECConnectorRole.WORKER)


def test_a_dead_pod_is_skipped_and_the_item_loads_from_the_one_that_has_it(pod):
    url, store = pod
    tensor = torch.randn(6, 8)
    store.write("item-1", tensor_bytes(tensor), "float32", (6, 8))
    dead = f"http://127.0.0.1:{free_port()}"
    loaded = consumer_load(vllm_release(), ours([dead, url]), ["item-1"], [6])
    assert torch.equal(loaded["item-1"], tensor)


def test_a_missing_item_is_no_cache_hit_and_a_row_mismatch_fails_loudly(pod):
    release = vllm_release()
    url, store = pod
    from encoder_pod.vllm_epd.connector import EncoderPoolECConnector

    config = release.loader.vllm_config(release, **ours([url]))
    scheduler = EncoderPoolECConnector(config, release.base.ECConnectorRole.SCHEDULER)
    try:
        assert not scheduler.has_cache_item("absent")  # the consumer then runs its own encoder
        scheduler.update_state_after_alloc(Request(["absent"], [3]), 0)
        assert scheduler.build_connector_meta(release.loader.SchedulerOutput()).loads == []
    finally:
        scheduler.shutdown()
    store.write("short", tensor_bytes(torch.zeros(4, 8)), "float32", (4, 8))
    with pytest.raises(RuntimeError, match="prompt holds 5 placeholders"):
        consumer_load(release, ours([url]), ["short"], [5])

