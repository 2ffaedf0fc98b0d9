"""A ZMQ PULL receiver that accepts connections and then reads nothing until told to resume."""

from __future__ import annotations

import time
from collections import Counter

import zmq

from encoder_pod.receiver.wire import decode_message


class StallingReceiver:
    """What a wedged prefill server looks like to a pusher: connected, not reading.

    A tiny RCVHWM and RCVBUF make the connection fill after a few messages, so later pushes stall.
    """

    def __init__(self) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.PULL)
        self.sock.setsockopt(zmq.RCVHWM, 1)
        self.sock.setsockopt(zmq.RCVBUF, 4096)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.port = self.sock.bind_to_random_port("tcp://127.0.0.1")

    def resume(self, quiet_s: float = 3.0, timeout: float = 120.0) -> Counter[tuple[str, int]]:
        """Read until nothing came for ``quiet_s``: (req_id, part_idx) -> times each embedding arrived."""
        got: Counter[tuple[str, int]] = Counter()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.sock.poll(int(quiet_s * 1000)):
            header, _ = decode_message(self.sock.recv_multipart(copy=False))
            if not header.is_error:
                got[(header.req_id, header.part_idx)] += 1
        return got

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()
