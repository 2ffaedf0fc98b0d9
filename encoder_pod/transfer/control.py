"""A transfer backend's control operations: the routes its prefill ranks call back on.

Each backend declares its operations once, as :class:`ControlOp` values in its own module (the
receive-URL registration in :mod:`~encoder_pod.transfer.receive_urls`, mooncake's pulls in
:mod:`~encoder_pod.transfer.mooncake`), and :mod:`~encoder_pod.transfer.registry` lists them.
Every layer above routes by the operation's name: the HTTP edge builds one route per operation
from its path and methods, the gRPC face calls ``engine.control(name, body)``, a data-parallel
front sends one generic message (name + body) to the worker that holds the request's state, and
the :class:`~encoder_pod.transfer.router.TransferRouter` refuses an operation the pod's backend
does not serve, with the operation's one refusal, before it calls the handler.

Nothing here imports torch: the front and the HTTP edge read these declarations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from encoder_pod.errors import InternalError, InvalidRequest
from encoder_pod.settings import TransferBackend

Handler = Callable[[Any, dict[str, Any]], Awaitable[Any]]
"""``handler(owner, body)``: the operation's work on the backend object that holds its state."""


class UnknownControlOp(InternalError):
    """A control operation no backend declares: a bug (500), never a caller's mistake."""


def any_req_id(body: dict[str, Any]) -> str | None:
    """The body's ``req_id`` if it is a string (routing only: the handler validates it)."""
    req_id = body.get("req_id")
    return req_id if isinstance(req_id, str) else None


@dataclass(frozen=True)
class ControlOp:
    """One control operation of a backend: its route, who serves it, and how it is routed."""

    name: str
    """What every layer routes by (``engine.control(name, body)``; the HTTP route's name)."""
    path: str
    """The HTTP path (SGLang's)."""
    doc: str
    """One line for the route's OpenAPI description."""
    owner: type
    """The class of the backend object whose state the handler works on."""
    handler: Handler
    """``await handler(owner_instance, body)``: the answer's body."""
    served_by: frozenset[TransferBackend]
    """The TRANSFER_BACKEND values that serve it; any other refuses it with :attr:`refusal`."""
    refusal: str
    """The 400's message when the pod's backend does not serve it; ``{backend}`` is the pod's."""
    req_id_of: Callable[[dict[str, Any]], str | None] = any_req_id
    """The req_id a call is about, for a data-parallel front's routing to the worker holding its
    state (may raise InvalidRequest: a malformed body then never reaches a worker)."""
    methods: tuple[str, ...] = ("POST",)
    """The HTTP methods of its route."""
    ok_body: bool = False
    """True: the route answers ``{"status": "ok"}`` whatever the handler returns."""
    answer_model: Any = dict[str, Any]
    """The route's response model in OpenAPI; None for a route that answers ``null``."""

    def check(self, backend: TransferBackend) -> None:
        """Refuse (400, the one message) unless ``backend`` serves this operation."""
        if backend not in self.served_by:
            raise InvalidRequest(self.refusal.format(backend=backend.value))

    def http_answer(self, answer: Any) -> Any:
        """The route's JSON body for the handler's ``answer``."""
        return {"status": "ok"} if self.ok_body else answer


def lookup(ops: tuple[ControlOp, ...], name: str) -> ControlOp:
    """The operation called ``name``; UnknownControlOp (500) when none is."""
    for op in ops:
        if op.name == name:
            return op
    raise UnknownControlOp(f"unknown control operation {name!r:.80}; declared: {', '.join(o.name for o in ops)}")
