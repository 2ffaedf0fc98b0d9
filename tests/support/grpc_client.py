"""A gRPC client of the pod's SGLang face, from smg-grpc-proto's own generated stubs (tests, bench)."""

from __future__ import annotations

import time
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from smg_grpc_proto import sglang_encoder_pb2 as pb
from smg_grpc_proto import sglang_encoder_pb2_grpc as pb_grpc

MiB = 1024 * 1024


class GrpcClient:
    """One channel to ``127.0.0.1:port``: the SglangEncoder stub and the health stub."""

    def __init__(self, port: int, max_receive: int = 4 * MiB) -> None:
        self.target = f"127.0.0.1:{port}"
        # A channel that failed to connect waits out a growing reconnect backoff (1 s, x1.6, up to
        # 120 s) and fails every call meanwhile: a client polling a starting pod would miss its
        # loading phase altogether. Tests poll, so it retries within 100-250 ms.
        options = [("grpc.max_receive_message_length", max_receive), ("grpc.initial_reconnect_backoff_ms", 100),
                   ("grpc.min_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 250)]
        self.channel = grpc.insecure_channel(self.target, options=options)
        self.encoder = pb_grpc.SglangEncoderStub(self.channel)
        self.health_stub = health_pb2_grpc.HealthStub(self.channel)

    def health(self, service: str = "", timeout: float = 5) -> str:
        """The health status name (``SERVING``, ``NOT_SERVING``)."""
        status = self.health_stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout).status
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(status))

    def wait_serving(self, timeout: float = 180) -> None:
        """Poll health until SERVING."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = self.health()
                if last == "SERVING":
                    return
            except grpc.RpcError as exc:
                last = exc.code()
            time.sleep(0.1)
        raise TimeoutError(f"gRPC health never said SERVING (last: {last})")

    def encode(self, req_id: str, items: list[str], *, ports: list[int] | None = None, host: str = "127.0.0.1",
               num_parts: int = 1, part_idx: int = 0, modality: str | None = None, timeout: float = 60) -> Any:
        """One ``Encode`` call (the response; grpc.RpcError on a failed call)."""
        return self.encoder.Encode(self.encode_request(req_id, items, ports=ports, host=host, num_parts=num_parts,
                                                       part_idx=part_idx), timeout=timeout, metadata=self.metadata(modality))

    def encode_future(self, req_id: str, items: list[str], *, ports: list[int] | None = None, timeout: float = 120,
                      modality: str | None = None) -> Any:
        """An ``Encode`` call left running (``.cancel()``, ``.result()``)."""
        return self.encoder.Encode.future(self.encode_request(req_id, items, ports=ports), timeout=timeout,
                                          metadata=self.metadata(modality))

    @staticmethod
    def encode_request(req_id: str, items: list[str], *, ports: list[int] | None = None, host: str = "127.0.0.1",
                       num_parts: int = 1, part_idx: int = 0) -> pb.EncodeRequest:
        """An ``EncodeRequest`` as SGLang's gRPC client fills it in."""
        return pb.EncodeRequest(mm_items=items, req_id=req_id, num_parts=num_parts, part_idx=part_idx,
                                prefill_host=host, embedding_port=ports or [])

    @staticmethod
    def metadata(modality: str | None) -> tuple[tuple[str, str], ...] | None:
        """The call metadata naming a modality (none: IMAGE, as SGLang)."""
        return (("encoderpool-modality", modality),) if modality else None

    def close(self) -> None:
        """Close the channel."""
        self.channel.close()


def failure(call: Any) -> tuple[grpc.StatusCode, str, dict[str, str]]:
    """Run ``call()``, which must fail: its status code, details and trailing metadata."""
    try:
        call()
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or "", {m.key: m.value for m in exc.trailing_metadata() or ()}
    raise AssertionError("the call succeeded; a failure was expected")
