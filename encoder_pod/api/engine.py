"""What the HTTP edge needs from whatever encodes: one runtime, or a data-parallel front."""

from __future__ import annotations

from typing import Any, Protocol

from prometheus_client import CollectorRegistry

from encoder_pod.facts import ModelFacts
from encoder_pod.transfer.inline import InlineAnswer


class Engine(Protocol):
    """The surface behind the routes; implemented by EncoderRuntime and the DP front."""

    @property
    def registry(self) -> CollectorRegistry:
        """The registry ``/metrics`` renders; the HTTP edge registers its own families on it."""
        ...

    async def start(self) -> None:
        """Begin loading; must return quickly (the server answers 503 meanwhile)."""

    def begin_drain(self) -> None:
        """The pod drains (``encoder_pod.drain``): say so in ``/server_info``; everything admitted keeps
        going (new requests are refused at the faces, which wait for what is in flight). Idempotent."""

    async def shutdown(self, grace: float) -> None:
        """Answer whatever is left 503, let started forwards finish within ``grace`` s, release everything."""

    async def encode(self, body: object) -> InlineAnswer | None:
        """Answer one /encode body (the inline answer, or None once pushed); raises EncoderError."""

    async def health(self) -> None:
        """Raise NotReady (or Draining) unless a real encode succeeded recently; answers from state at once."""

    def metrics_text(self) -> bytes:
        """Prometheus text exposition."""

    def info(self) -> dict[str, Any]:
        """/server_info body."""

    def model_facts(self) -> ModelFacts | None:
        """The served model's facts (None while it loads)."""

    async def start_profile(self, options: dict[str, Any]) -> dict[str, Any]:
        """Start profiling."""

    async def stop_profile(self) -> dict[str, Any]:
        """Stop profiling."""

    async def control(self, op: str, payload: dict[str, Any]) -> Any:
        """A transfer backend's control operation by name (:mod:`encoder_pod.transfer.registry`):
        the answer's body; refused (400, the operation's message) where this pod's backend does not serve it."""
