"""Transfer control operations are declared once: the HTTP routes and the refusals come from the registry."""

from __future__ import annotations

import asyncio

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from encoder_pod.api.http_server import create_app
from encoder_pod.errors import InvalidRequest
from encoder_pod.metrics import ReplicaMetrics
from encoder_pod.runtime import EncoderRuntime
from encoder_pod.settings import TransferBackend, load_settings
from encoder_pod.transfer.control import UnknownControlOp
from encoder_pod.transfer.registry import CONTROL_OPS, control_op
from encoder_pod.transfer.router import TransferRouter

pytestmark = pytest.mark.unit

SGLANG_ROUTES = {"/scheduler_receive_url", "/scheduler_receive_meta_data", "/send"}


def _runtime(backend: TransferBackend) -> EncoderRuntime:
    return EncoderRuntime(load_settings(env={"ENCODER_TRANSFER_BACKEND": backend.value}), ReplicaMetrics())


def test_every_registered_operation_is_a_route_with_its_methods_and_names_are_unique():
    runtime = _runtime(TransferBackend.AUTO)
    app = create_app(runtime.settings, runtime)
    routes = {r.path: r for r in app.routes if isinstance(r, APIRoute)}
    assert len({op.name for op in CONTROL_OPS}) == len({op.path for op in CONTROL_OPS}) == len(CONTROL_OPS)
    assert {op.path for op in CONTROL_OPS} == SGLANG_ROUTES  # SGLang's prefill ranks call exactly these
    for op in CONTROL_OPS:
        assert routes[op.path].methods == set(op.methods) and routes[op.path].name == op.name
        assert control_op(op.name) is op
    asyncio.run(runtime.shutdown(0))


@pytest.mark.parametrize(
    ("op", "backend"),
    [(op, backend) for op in CONTROL_OPS for backend in TransferBackend if backend not in op.served_by],
    ids=lambda v: getattr(v, "name", None) or v.value,
)
def test_an_operation_the_pods_backend_does_not_serve_answers_its_declared_refusal(op, backend):
    runtime = _runtime(backend)
    client = TestClient(create_app(runtime.settings, runtime))
    answer = client.request(op.methods[0], op.path, json={"req_id": "r", "receive_count": 1, "receive_url": "h:1", "part_idx": 0})
    assert answer.status_code == 400
    assert answer.json() == {"status": "error", "message": op.refusal.format(backend=backend.value), "req_id": None}
    asyncio.run(runtime.shutdown(0))


def test_every_backend_serves_or_refuses_every_operation_with_one_message_per_operation():
    """The refusal is the operation's, whichever layer meets it first (no backend has its own wording)."""
    for op in CONTROL_OPS:
        for backend in TransferBackend:
            router = TransferRouter(load_settings(env={"ENCODER_TRANSFER_BACKEND": backend.value}).transfer, max_registrations=4)
            try:
                if backend not in op.served_by:
                    with pytest.raises(InvalidRequest) as info:
                        asyncio.run(router.control(op.name, {"req_id": "r"}))
                    assert info.value.http_status == 400 and info.value.message == op.refusal.format(backend=backend.value)
            finally:
                asyncio.run(router.close())


def test_an_unknown_operation_is_an_explicit_error_not_another_one():
    router = TransferRouter(load_settings(env={}).transfer, max_registrations=4)
    try:
        with pytest.raises(UnknownControlOp, match="unknown control operation 'scheduler_receive'") as info:
            asyncio.run(router.control("scheduler_receive", {"req_id": "r", "receive_count": 1, "receive_url": "h:1"}))
        assert info.value.http_status == 500
    finally:
        asyncio.run(router.close())
