"""The hand-written ZMTP of the push sender: framing and the peer's handshake (the wire itself is
exercised against libzmq receivers in the integration tier)."""

from __future__ import annotations

import struct

import pytest

from encoder_pod.transfer.push_connection import parse_endpoint
from encoder_pod.transfer.zmtp import GREETING, PeerHandshake, ProtocolError, message_segments, ready_command
from encoder_pod.errors import TransferFailed


def _greeting(mechanism: bytes = b"NULL", major: int = 3) -> bytes:
    return bytes([0xFF, *bytes(8), 0x7F, major, 1]) + mechanism.ljust(20, b"\x00") + bytes(32)


def test_greeting_and_ready_are_what_the_spec_says():
    assert len(GREETING) == 64 and GREETING[:1] == b"\xff" and GREETING[9:12] == b"\x7f\x03\x00"
    assert GREETING[12:16] == b"NULL"
    assert ready_command() == b"\x04\x1a\x05READY\x0bSocket-Type\x00\x00\x00\x04PUSH"


def test_frames_carry_more_flags_and_long_sizes_without_copying_bodies():
    big = bytearray(300)
    segments = message_segments([b"head", memoryview(big)])
    assert bytes(segments[0]) == b"\x01\x04" and bytes(segments[1]) == b"head"
    assert bytes(segments[2]) == b"\x02" + struct.pack(">Q", 300)
    big[0] = 7
    assert segments[3][0] == 7  # a view of the caller's buffer
    assert [bytes(s) for s in message_segments([b""])] == [b"\x00\x00"]


def test_handshake_accepts_a_pull_peer_in_any_pieces():
    wire = _greeting() + b"\x04\x1a\x05READY\x0bSocket-Type\x00\x00\x00\x04PULL"
    shake = PeerHandshake()
    for i in range(0, len(wire), 7):
        assert not shake.done
        shake.feed(wire[i : i + 7])
    assert shake.done and shake.peer_type == b"PULL"


@pytest.mark.parametrize(
    "wire, says",
    [
        (b"HTTP/1.1 400 Bad Request\r\n", "not a ZMTP peer"),
        (_greeting(major=2), "not a ZMTP 3 peer"),
        (_greeting(b"PLAIN"), "PLAIN security mechanism"),
        (_greeting() + b"\x04\x1a\x05READY\x0bSocket-Type\x00\x00\x00\x04PUSH", "a PUSH socket, not PULL"),
        (_greeting() + b"\x00\x05hello", "expected the peer's READY command"),
        (_greeting() + b"\x04\x06\x05HELLO", "expected READY"),
    ],
)
def test_handshake_names_what_is_wrong_with_the_peer(wire, says):
    with pytest.raises(ProtocolError, match=says):
        PeerHandshake().feed(wire)


@pytest.mark.parametrize("text", ["127.0.0.1:5000", "tcp://host", "tcp://:5", "tcp://h:0", "tcp://h:x", "ipc://a:1"])
def test_bad_endpoints_are_refused(text):
    with pytest.raises(TransferFailed, match="not a tcp://host:port endpoint"):
        parse_endpoint(text)


def test_endpoints_parse_with_ipv6_brackets():
    assert parse_endpoint("tcp://[::1]:5000") == ("::1", 5000)
    assert parse_endpoint("tcp://prefill-0.svc:31000") == ("prefill-0.svc", 31000)
