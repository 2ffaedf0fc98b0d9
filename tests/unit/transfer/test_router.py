"""Which backend delivers a request: SGLang's auto rule, the explicit backends, and clear refusals."""

from __future__ import annotations

import asyncio

import pytest

from encoder_pod.errors import InvalidRequest
from encoder_pod.modality import Modality
from encoder_pod.protocol import EncodeRequest, ItemSpec
from encoder_pod.settings import load_settings
from encoder_pod.transfer.base import InlineTransfer
from encoder_pod.transfer.router import MooncakeTransfer, PulledTransfer, TransferRouter
from encoder_pod.transfer.zmq_push import ZmqTransfer

pytestmark = pytest.mark.unit


def _router(backend: str) -> TransferRouter:
    settings = load_settings(env={"ENCODER_TRANSFER_BACKEND": backend}).transfer
    return TransferRouter(settings, max_registrations=8)


def _request(host: str | None = "10.0.0.2", port: int | tuple[int, ...] | None = None) -> EncodeRequest:
    return EncodeRequest("r_local_part_0", Modality.IMAGE, (ItemSpec("x"),), 1, 0, host, port)


@pytest.mark.parametrize(
    "backend, port, chosen",
    [
        ("auto", None, PulledTransfer),  # zmq_to_scheduler (SGLang's auto) or mooncake: the ranks say which
        ("auto", 5000, ZmqTransfer),  # zmq_to_tokenizer
        ("auto", (5000, 5001), ZmqTransfer),  # a port per rank
        ("zmq_to_scheduler", None, ZmqTransfer),
        ("zmq_to_tokenizer", 5000, ZmqTransfer),
        ("mooncake", None, MooncakeTransfer),
    ],
)
def test_each_backend_delivers_what_sglang_asks_for(backend, port, chosen):
    router = _router(backend)
    try:
        assert isinstance(router.for_request(_request(port=port)), chosen)
        assert isinstance(router.for_request(_request(host=None)), InlineTransfer)  # not a prefill server: inline
    finally:
        asyncio.run(router.close())


def test_a_prefill_target_on_an_inline_pod_is_a_clear_400():
    router = _router("inline")
    with pytest.raises(InvalidRequest, match="transfer backend is inline.*cannot deliver to prefill_host '10.0.0.2'.*auto") as info:
        router.for_request(_request(port=5000))
    assert info.value.http_status == 400
    with pytest.raises(InvalidRequest, match="not used by the inline"):
        asyncio.run(router.control("scheduler_receive_url", {"req_id": "r", "receive_count": 1, "receive_url": "h:1"}))
    with pytest.raises(InvalidRequest, match="mooncake's.*ENCODER_TRANSFER_BACKEND=auto or mooncake"):
        asyncio.run(router.control("scheduler_receive_meta_data", {"req_id": "r", "part_idx": 0}))


def test_zmq_to_tokenizer_needs_its_one_port():
    router = _router("zmq_to_tokenizer")
    try:
        with pytest.raises(InvalidRequest, match="exactly one port, got none"):
            router.for_request(_request(port=None))
        with pytest.raises(InvalidRequest, match="mooncake's"):
            asyncio.run(router.control("send", {"req_id": "r"}))
    finally:
        asyncio.run(router.close())


def test_a_pod_without_the_mooncake_package_refuses_mooncake_pulls_with_a_clear_400(monkeypatch):
    """As on a pod installed without the [mooncake] extra: the import fails, the prefill rank is told why."""
    import sys

    monkeypatch.setitem(sys.modules, "mooncake.engine", None)  # makes "from mooncake.engine import ..." raise ImportError
    router = _router("auto")
    try:
        with pytest.raises(InvalidRequest, match="not available on this pod.*encoderpool\\[mooncake\\].*libibverbs1") as info:
            asyncio.run(router.control("scheduler_receive_meta_data", {"req_id": "r_local_part_0", "part_idx": 0}))
        assert info.value.http_status == 400
    finally:
        asyncio.run(router.close())
