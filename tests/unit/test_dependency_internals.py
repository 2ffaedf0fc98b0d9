"""What the code uses of its dependencies beyond their public API: pinned, and checked here.

encoder_pod/api/connections.py subclasses uvicorn's HTTP protocol classes (their callbacks and
per-connection attributes are not a public API), encoder_pod/server.py overrides hooks of
``uvicorn.Server``, encoder_pod/models calls private helpers of transformers, and two modules
build on undocumented parts of the standard library (``json.scanner``, ``pickle._Pickler``).
Each such dependency is pinned to one version in pyproject.toml (not a range; uv.lock pins the
rest), and this module checks that what the code relies on is still there, in the shape it is
used: a release that moves it fails here, at ``make test``, instead of at run time as connections
that never time out or a drain that drops requests. The behaviour itself is tested end to end
(tests/integration: the connection limits, the drain, every model family).

Moving a pin: change it in pyproject.toml, ``make lock``, and re-read the code named in each test
against the new release before changing the expectation here.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import inspect
import io
import json.decoder
import json.scanner
import pickle
import re
import tomllib
from pathlib import Path
from typing import Any

import h11
import pytest
import uvicorn
from uvicorn.protocols.http import h11_impl, httptools_impl
from uvicorn.server import ServerState

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
# The distributions whose internals the code uses, and where.
INTERNALS_USED = {
    "uvicorn": "encoder_pod/api/connections.py (HTTP protocol subclasses), encoder_pod/server.py (Server hooks)",
    "transformers": "encoder_pod/models (private output-length helpers of the audio towers)",
}


def pinned_versions() -> dict[str, str]:
    """``name -> version`` of every ``name==version`` requirement in pyproject.toml's dependencies."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = {}
    for requirement in project["dependencies"]:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)==([^;\s]+)(\s*;.*)?", requirement.strip())
        if match:
            pins[match.group(1).lower()] = match.group(2)
    return pins


@pytest.mark.parametrize("dist", sorted(INTERNALS_USED))
def test_a_dependency_whose_internals_are_used_is_pinned_and_installed_at_its_pin(dist: str) -> None:
    pins = pinned_versions()
    assert dist in pins, f"{dist} must be pinned (==) in pyproject.toml: the code uses its internals ({INTERNALS_USED[dist]})"
    installed = importlib.metadata.version(dist)
    assert installed == pins[dist], (
        f"{dist} {installed} is installed, pyproject.toml pins {pins[dist]}: re-check {INTERNALS_USED[dist]} "
        "against this release, then move the pin (and `make lock`)"
    )


def _protocol(cls: type[asyncio.Protocol]) -> Any:
    """One of uvicorn's HTTP protocols, built as uvicorn builds it per connection."""

    async def app(scope: Any, receive: Any, send: Any) -> None:  # pragma: no cover - never called
        raise AssertionError

    config = uvicorn.Config(app, http=cls, lifespan="off", log_level="warning")
    config.load()
    return cls(config=config, server_state=ServerState(), app_state={}, _loop=asyncio.new_event_loop())


# What _ConnectionLimits (encoder_pod/api/connections.py) overrides and calls, on both protocols.
PROTOCOL_METHODS = ("connection_made", "data_received", "connection_lost", "on_response_complete", "send_400_response")


@pytest.mark.parametrize("cls", [h11_impl.H11Protocol, httptools_impl.HttpToolsProtocol], ids=lambda c: c.__name__)
def test_uvicorns_http_protocols_have_what_the_connection_limits_override(cls: type[asyncio.Protocol]) -> None:
    for method in PROTOCOL_METHODS:
        assert callable(getattr(cls, method, None)), f"{cls.__name__}.{method} is gone"
    proto = _protocol(cls)
    try:
        # Read by _ConnectionLimits: the server's set of open connections, the loop, the transport slot.
        assert isinstance(proto.connections, set)
        assert isinstance(proto.loop, asyncio.AbstractEventLoop)
        assert "transport" in vars(proto)
        assert proto.cycle is None, "no request cycle before the first request"
    finally:
        proto.loop.close()
    source = inspect.getsource(inspect.getmodule(cls))  # type: ignore[arg-type]
    # uvicorn answers an unparsable request through send_400_response (overridden: a lingering
    # close) and tells the protocol a response ended through on_response_complete (the header clock).
    assert "self.send_400_response(" in source
    assert "on_response=self.on_response_complete" in source


def test_the_h11_protocol_keeps_its_h11_connection() -> None:
    """LimitedH11Protocol asks ``self.conn.their_state`` whether the client owes a request's head."""
    proto = _protocol(h11_impl.H11Protocol)
    try:
        assert isinstance(proto.conn, h11.Connection) and proto.conn.their_state is h11.IDLE
    finally:
        proto.loop.close()


def test_the_httptools_protocol_has_the_parser_callbacks_the_head_bound_wraps() -> None:
    """LimitedHttpToolsProtocol counts a head's bytes between these callbacks, and reads ``cycle.response_complete``."""
    for callback in ("on_headers_complete", "on_message_complete"):
        assert callable(getattr(httptools_impl.HttpToolsProtocol, callback, None)), callback
    assert "self.response_complete = False" in inspect.getsource(httptools_impl.RequestResponseCycle.__init__)


def test_uvicorns_server_has_the_hooks_the_drain_overrides() -> None:
    """encoder_pod.server._Server: capture_signals, handle_exit, should_exit, startup and the graceful timeout."""
    server = uvicorn.Server(uvicorn.Config(lambda *a: None, lifespan="off"))
    assert server.should_exit is False
    assert list(inspect.signature(uvicorn.Server.handle_exit).parameters) == ["self", "sig", "frame"]
    assert list(inspect.signature(uvicorn.Server.startup).parameters) == ["self", "sockets"]
    assert "with self.capture_signals():" in inspect.getsource(uvicorn.Server.serve)
    assert "self.handle_exit" in inspect.getsource(uvicorn.Server.capture_signals)
    assert "self.config.timeout_graceful_shutdown" in inspect.getsource(uvicorn.Server.shutdown)
    assert "self.should_exit" in inspect.getsource(uvicorn.Server.on_tick)
    # The drain's Listener (stop_accepting, close_connections): the asyncio servers uvicorn made,
    # its set of open connections, and each protocol's shutdown (close if idle, else close after the answer).
    assert "self.servers = [server]" in inspect.getsource(uvicorn.Server.startup)
    assert isinstance(server.server_state.connections, set)
    for cls in (h11_impl.H11Protocol, httptools_impl.HttpToolsProtocol):
        assert "self.transport.close()" in inspect.getsource(cls.shutdown), cls


def test_the_standard_library_internals_still_exist() -> None:
    """json_limits builds the pure-Python JSON scanner; sglang_frames subclasses the pure-Python pickler."""
    assert callable(json.scanner.py_make_scanner)  # type: ignore[attr-defined]
    assert callable(json.decoder.JSONArray) and callable(json.decoder.JSONObject)  # type: ignore[attr-defined]
    pickler = pickle._Pickler(io.BytesIO(), 4)  # type: ignore[attr-defined]
    for method in ("save", "save_global", "write", "memoize"):
        assert callable(getattr(pickler, method, None)), method
