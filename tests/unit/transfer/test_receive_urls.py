"""zmq_to_scheduler registrations: validation, either order, timeout cleanup, bounds."""

from __future__ import annotations

import asyncio

import pytest

from encoder_pod.errors import InvalidRequest, Overloaded, TransferFailed
from encoder_pod.transfer.receive_urls import ReceiveUrlTable, parse_receive_url, parse_registration

pytestmark = pytest.mark.unit


def reg(req_id="r", count=2, url="10.0.0.1:5000", **extra):
    return parse_registration({"req_id": req_id, "receive_count": count, "receive_url": url, **extra})


@pytest.mark.parametrize("url, endpoint", [
    ("10.0.0.1:5000", "tcp://10.0.0.1:5000"),
    ("prefill-0.svc:1", "tcp://prefill-0.svc:1"),
    ("[::1]:7", "tcp://[::1]:7"),
    ("tcp://h:9", "tcp://h:9"),
])
def test_receive_url_forms(url, endpoint):
    assert parse_receive_url(url) == endpoint


@pytest.mark.parametrize("url", ["", "host", "host:0", "host:70000", "::1:5", "[nope]:5", "a/b:5", 5])
def test_bad_receive_urls_name_the_field(url):
    with pytest.raises(InvalidRequest, match="receive_url"):
        parse_receive_url(url)


@pytest.mark.parametrize("body, field", [
    ({"receive_count": 1, "receive_url": "h:1"}, "req_id"),
    ({"req_id": "r", "receive_count": 0, "receive_url": "h:1"}, "receive_count"),
    ({"req_id": "r", "receive_count": True, "receive_url": "h:1"}, "receive_count"),
    ({"req_id": "r", "receive_count": 1, "receive_url": "h:1", "modality": "SMELL"}, "modality"),
])
def test_bad_registrations_name_the_field(body, field):
    with pytest.raises(InvalidRequest, match=field):
        parse_registration(body)


def test_registration_before_and_after_the_delivery_waits():
    async def main():
        table = ReceiveUrlTable(ttl=5, max_entries=8)
        table.register(reg(url="h:1"))
        waiter = asyncio.ensure_future(table.wait("r", 2))
        await asyncio.sleep(0.01)
        assert not waiter.done()
        table.register(reg(url="h:1"))  # a retry is harmless
        table.register(reg(url="h:2"))
        assert await waiter == ("tcp://h:1", "tcp://h:2")
        assert len(table) == 0

    asyncio.run(main())


def test_timeout_names_the_setting_and_forgets_the_entry():
    async def main():
        table = ReceiveUrlTable(ttl=5, max_entries=8)
        table.register(reg(url="h:1"))
        with pytest.raises(TransferFailed, match="only 1 of 2 .*ENCODER_SEND_TIMEOUT"):
            await table.wait("r", 0.05)
        assert len(table) == 0

    asyncio.run(main())


def test_disagreeing_and_surplus_registrations_are_400():
    table = ReceiveUrlTable(ttl=5, max_entries=8)
    table.register(reg(count=1, url="h:1"))
    with pytest.raises(InvalidRequest, match="disagrees"):
        table.register(reg(count=2, url="h:2"))
    with pytest.raises(InvalidRequest, match="one too many"):
        table.register(reg(count=1, url="h:2"))


def test_table_is_bounded_and_stale_entries_are_swept():
    table = ReceiveUrlTable(ttl=0.0, max_entries=1)
    table.register(reg("a"))
    table.register(reg("b"))  # "a" is past its ttl, swept first
    assert len(table) == 1
    table = ReceiveUrlTable(ttl=60, max_entries=1)
    table.register(reg("a"))
    with pytest.raises(Overloaded, match="ENCODER_MAX_QUEUE"):
        table.register(reg("b"))


def test_error_before_registration_is_deferred_until_complete():
    sent = []
    table = ReceiveUrlTable(ttl=5, max_entries=8)
    assert table.take_or_defer("r", sent.append) is None
    table.register(reg(url="h:1"))
    assert sent == []
    table.register(reg(url="h:2"))
    assert sent == [("tcp://h:1", "tcp://h:2")] and len(table) == 0
