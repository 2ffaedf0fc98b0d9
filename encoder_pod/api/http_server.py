"""The HTTP edge: FastAPI routes over an :class:`Engine`, errors mapped in ONE table.

``create_app(settings, engine)`` builds the app; nothing happens at import. The engine is the
single-process runtime or the data-parallel front: the routes do not know which.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from encoder_pod.api.answer_counts import count_answer, counted
from encoder_pod.api.disconnects import CLIENT_GONE, GoneClients
from encoder_pod.api.engine import Engine
from encoder_pod.api.answers import answer_response
from encoder_pod.api.json_body import SMALL_BODY, parse_large
from encoder_pod.api.lifecycle import DrainGate, Lifecycle, check_ready
from encoder_pod.api.openapi import ENCODE_OPENAPI
from encoder_pod.api.vllm_chat import VllmFace
from encoder_pod.vllm_epd.storage import check_identifier
from encoder_pod.errors import EncoderError, FaceOff, InvalidRequest, PayloadTooLarge
from encoder_pod.json_limits import MAX_DEPTH, JsonTooDeep, nesting_over
from encoder_pod.metrics import EdgeMetrics
from encoder_pod.offload import Offload, freeze_startup_objects
from encoder_pod.settings import EncoderSettings, SettingsError
from encoder_pod.transfer.control import ControlOp
from encoder_pod.transfer.registry import CONTROL_OPS

if TYPE_CHECKING:
    from encoder_pod.api.grpc_server import GrpcFace  # the grpc extra: imported only when ENCODER_GRPC_PORT is set

log = logging.getLogger(__name__)
T = TypeVar("T")

CONTROL_BODY_LIMIT = 64 * 1024
"""Largest body of the small control endpoints (registration, profiling)."""
CONTROL_LIMIT_NAME = "the 64 KiB limit of control routes, not a setting"
"""How a control route's 413 names its limit."""

LOOP_WALK = 1024
"""Arrays and objects of a small body whose depth is checked on the loop (an /encode body has a
handful); a body with more is parsed again, depth-counting, on an offload thread."""

STOP_GRACE_S = 2.0
"""After the drain: how long forwards still running (their callers already answered) may take."""


def error_body(message: str, req_id: str | None) -> dict[str, Any]:
    """The error body every refusal carries (docs/api.md, Errors)."""
    return {"status": "error", "message": message, "req_id": req_id}


async def _read_bytes(request: Request, limit: int, limit_name: str) -> list[bytes]:
    """The body's chunks, refused with a 413 naming ``limit_name`` as soon as it is over ``limit``."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"body is {declared} bytes, above the limit of {limit} ({limit_name})")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"body is over the limit of {limit} bytes ({limit_name})")
        chunks.append(chunk)
    return chunks


async def _parse(chunks: list[bytes], offload: Offload) -> Any:
    """The JSON value of a body read by :func:`_read_bytes`; a large one is parsed on an offload thread.

    A small body is parsed on the loop and its depth checked there (:func:`nesting_over`, a walk
    of at most :data:`LOOP_WALK` arrays and objects); one found too deep, nested beyond what
    ``json.loads`` recurses into, or with too many arrays and objects to walk here, goes to the
    depth-counting parser off the loop, which names the level too deep.
    """
    try:
        if sum(map(len, chunks)) <= SMALL_BODY:
            try:
                value = json.loads(b"".join(chunks))
            except RecursionError:
                pass
            else:
                if nesting_over(value, MAX_DEPTH, most=LOOP_WALK) is False:
                    return value
        return await offload.run(parse_large, chunks)  # depth-counting; off the loop
    except JsonTooDeep as exc:
        raise InvalidRequest(f"body is refused: {exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"body is not valid JSON ({exc})") from None


async def _read_body(request: Request, limit: int, offload: Offload) -> Any:
    """An /encode body's JSON value (the loop stays free); over ``MAX_REQUEST_BYTES`` is a 413."""
    return await _parse(await _read_bytes(request, limit, "ENCODER_MAX_REQUEST_BYTES"), offload)


async def _discard_body(request: Request, limit: int) -> None:
    """Read and drop the body (up to ``limit``): answering before it is read would reset the connection."""
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return


async def _read_object(request: Request, limit: int, offload: Offload, empty_ok: bool = False) -> dict[str, Any]:
    """A JSON object body (small control endpoints); an empty body is ``{}`` when ``empty_ok``."""
    chunks = await _read_bytes(request, limit, CONTROL_LIMIT_NAME)
    if empty_ok and not b"".join(chunks).strip():
        return {}
    payload = await _parse(chunks, offload)
    if not isinstance(payload, dict):
        raise InvalidRequest("body must be a JSON object")
    return payload


async def _until_disconnect(request: Request) -> None:
    # The body is fully read, so the next ASGI message is the client's disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass


def error_response(exc: Exception, path: str, gone: GoneClients) -> Response:
    """The one place where exceptions become status codes (the routes' handlers and :class:`EncodeRoute`)."""
    if isinstance(exc, ClientDisconnect):
        gone.record(path)  # nobody reads the answer: 499 is what the metrics and the log record
        return Response(status_code=CLIENT_GONE)
    if isinstance(exc, EncoderError):
        headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after is not None else None
        return JSONResponse(error_body(exc.message, exc.req_id), status_code=exc.http_status, headers=headers)
    log.error("internal error on %s", path, exc_info=exc)
    return JSONResponse(error_body(f"internal error: {type(exc).__name__}: {exc}", None), status_code=500)


def _install_error_table(app: FastAPI, gone: GoneClients) -> None:
    """:func:`error_response` for every route of ``app``."""

    async def handle(request: Request, exc: Exception) -> Response:
        return error_response(exc, request.url.path, gone)

    for kind in (ClientDisconnect, EncoderError, Exception):
        app.add_exception_handler(kind, handle)


def _lifespan(
    engine: Engine, settings: EncoderSettings, offload: Offload, grpc_face: GrpcFace | None
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await engine.start()
        if grpc_face is not None:
            await grpc_face.start()
        freeze_startup_objects()  # the web stack; a local model is frozen once it is loaded
        yield
        # The drain (encoder_pod.server) already waited for what was admitted: stop promptly.
        if grpc_face is not None:
            await grpc_face.stop(grace=STOP_GRACE_S)
        await engine.shutdown(grace=STOP_GRACE_S)
        if app.state.vllm_face is not None:
            app.state.vllm_face.close()
        offload.close()

    return lifespan


def _grpc_face(settings: EncoderSettings, engine: Engine, lifecycle: Lifecycle, metrics: EdgeMetrics) -> GrpcFace | None:
    """SGLang's gRPC face when ``ENCODER_GRPC_PORT`` is set (the ``grpc`` extra), else None."""
    if not settings.server.grpc_port:
        return None
    try:
        from encoder_pod.api.grpc_server import GrpcFace
    except ImportError as exc:
        raise SettingsError(
            f"invalid setting ENCODER_GRPC_PORT / --grpc-port: the gRPC face needs the grpc extra "
            f"(pip install 'encoderpool[grpc]'): {exc}"
        ) from None
    return GrpcFace(settings, engine, lifecycle, metrics)


class PodApp(FastAPI):
    """The FastAPI app with ``POST /encode`` served in front of its whole stack (:class:`EncodeRoute`).

    FastAPI's own layers (its telemetry hooks, the error and body-limit middleware, the router)
    took about 5% of the event loop's time per /encode request under py-spy on the 2-core bench
    machine; /encode needs none of them.
    """

    encode_route: EncodeRoute | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self.encode_route
        if route is not None and scope["type"] == "http" and scope["path"] == "/encode":
            await route(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)


def create_app(settings: EncoderSettings, engine: Engine, lifecycle: Lifecycle | None = None) -> PodApp:
    """The encoder pod's HTTP app over ``engine``; ``lifecycle`` is the drain state the server drives."""
    offload = Offload(name="http-offload")
    lifecycle = lifecycle or Lifecycle()
    metrics = EdgeMetrics(engine.registry, settings.admission.max_queue)  # one set of answer counters, every face
    grpc_face = _grpc_face(settings, engine, lifecycle, metrics)
    app = PodApp(title="encoderpool encoder pod", version="0.1.0", lifespan=_lifespan(engine, settings, offload, grpc_face))
    app.state.engine = engine
    app.state.lifecycle = lifecycle
    app.state.grpc = grpc_face
    gone = GoneClients()
    app.add_middleware(DrainGate, lifecycle=lifecycle)
    _install_error_table(app, gone)
    app.encode_route = EncodeRoute(settings=settings, engine=engine, offload=offload, lifecycle=lifecycle, gone=gone,
                                   metrics=metrics)
    _document_encode(app)
    _install_probes(app, engine, lifecycle)
    _install_control(app, engine, offload)
    _install_vllm(app, settings, engine, offload, metrics, lifecycle)
    return app


class EncodeRoute:
    """``POST /encode`` as plain ASGI, called by :class:`PodApp` before any of FastAPI's layers.

    The hot path crosses no router, exception middleware or handler wrapper: at concurrency 1 on
    the 2-core bench machine those layers cost 0.5-0.9 ms per request. It does itself what they
    do for every other route: the drain gate (:class:`DrainGate`) and the error table
    (:func:`error_response`).
    """

    def __init__(self, *, settings: EncoderSettings, engine: Engine, offload: Offload,
                 lifecycle: Lifecycle, gone: GoneClients, metrics: EdgeMetrics) -> None:
        self._settings = settings
        self._engine = engine
        self._offload = offload
        self._lifecycle = lifecycle
        self._gone = gone
        self._metrics = metrics
        self._drain_timeout = settings.drain_timeout_s()
        self._gated = DrainGate(self._answer, lifecycle)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer one /encode request (the drain gate first)."""
        await self._gated(scope, receive, send)

    async def _answer(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        if request.method != "POST":
            response: Response = JSONResponse({"detail": "Method Not Allowed"}, status_code=405, headers={"allow": "POST"})
        else:
            response = await self._encode(request)
        await response(scope, receive, send)

    async def _encode(self, request: Request) -> Response:
        """Encode a request's media items and deliver the embedding (SGLang's /encode)."""
        started = time.perf_counter()
        failed: Exception | None = None
        req_id, lifecycle = None, self._lifecycle
        try:
            if lifecycle.arrived_draining(request.scope):  # new work during a drain; earlier arrivals go on
                await _discard_body(request, self._settings.server.max_request_bytes)
                raise lifecycle.refusal()
            body = await _read_body(request, self._settings.server.max_request_bytes, self._offload)
            req_id = body.get("req_id") if isinstance(body, dict) else None
            answer = await until_stopped(request, lifecycle, self._drain_timeout, self._engine.encode(body))
            return await answer_response(answer, request.headers.get("accept"), self._offload)
        except Exception as exc:  # noqa: BLE001 - every failure is answered by the error table
            if isinstance(exc, EncoderError):
                exc.req_id = exc.req_id or (req_id if isinstance(req_id, str) else None)
            failed = exc
            return error_response(exc, "/encode", self._gone)
        finally:
            count_answer(self._metrics, failed, started)


async def until_stopped(request: Request, lifecycle: Lifecycle, drain_timeout: float, work: Awaitable[T]) -> T:
    """``work`` (a request's encode, its body already read) in this task, cancelled when the client
    goes away (raises :class:`ClientDisconnect`) or the drain runs out of time (raises its 503).

    Cancelling the encode is what frees what the request held: its admission slot, and its queue
    entry, which the batcher then drops before compute (``encoder_dropped_requests_total``).
    """
    task = asyncio.current_task()
    assert task is not None
    stopped: list[str] = []

    def stop(reason: str) -> Callable[[asyncio.Future[Any]], None]:
        def callback(future: asyncio.Future[Any]) -> None:
            if not future.cancelled() and not stopped:
                stopped.append(reason)
                task.cancel()
        return callback

    watcher = asyncio.ensure_future(_until_disconnect(request))
    watcher.add_done_callback(stop("client gone"))
    expired, on_expiry = lifecycle.expired, stop("drain expired")
    expired.add_done_callback(on_expiry)
    try:
        return await work
    except asyncio.CancelledError:
        if not stopped:
            raise  # the server itself is stopping this task
        task.uncancel()
        if stopped[0] == "drain expired":  # answered, not dropped
            raise lifecycle.expiry_error(drain_timeout) from None
        raise ClientDisconnect() from None
    finally:
        stopped.append("answered")  # from here on, neither may cancel this task
        expired.remove_done_callback(on_expiry)
        watcher.cancel()


def _document_encode(app: FastAPI) -> None:
    """/encode in the app's OpenAPI document (it is served by :class:`EncodeRoute`, not a route)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = build()
        schema["paths"]["/encode"] = {"post": {
            "summary": "Encode",
            "description": "Encode a request's media items and deliver the embedding (SGLang's /encode).",
            "operationId": "encode_encode_post",
            **ENCODE_OPENAPI,
        }}
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def _install_probes(app: FastAPI, engine: Engine, lifecycle: Lifecycle) -> None:
    async def ready() -> Response:
        await check_ready(engine, lifecycle)
        return Response(status_code=200)

    @app.get("/livez")
    async def livez() -> dict[str, str]:
        """Liveness: 200 whenever this process's event loop answers; touches no engine, queue or model."""
        return {"status": "alive"}

    @app.get("/health")
    async def health() -> Response:
        """Readiness: 200 when a real tiny encode (or live traffic) succeeded recently; 503 loading, failed or draining."""
        return await ready()

    @app.get("/health_generate")
    async def health_generate() -> Response:
        """Same probe as /health (SGLang's name)."""
        return await ready()

    @app.get("/metrics")
    async def metrics_route() -> Response:
        """Prometheus text exposition."""
        return Response(engine.metrics_text(), media_type="text/plain; version=0.0.4")

    @app.get("/server_info")
    async def server_info() -> dict[str, Any]:
        """State, model facts, queue and the effective settings."""
        return engine.info()


def _install_vllm(app: FastAPI, settings: EncoderSettings, engine: Engine, offload: Offload, metrics: EdgeMetrics,
                  lifecycle: Lifecycle) -> None:
    """vLLM's encoder-instance contract (docs/vllm.md); off, with a 404 saying so, without a storage path."""
    face = VllmFace(settings, engine) if settings.vllm.vllm_storage_path else None
    drain_timeout = settings.drain_timeout_s()
    app.state.vllm_face = face
    off = "the vLLM face is off on this pod: set ENCODER_VLLM_STORAGE_PATH (--vllm-storage-path) to serve it"

    def active() -> VllmFace:
        if face is None:
            raise FaceOff(off)
        return face

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        """vLLM's EPD proxy: encode the body's media parts, store each embedding for the consumers, answer ec_transfer_params."""
        async with counted(metrics):  # counted as /encode is; what it raises goes on to the error table
            vllm = active()
            if lifecycle.arrived_draining(request.scope):  # new work during a drain, refused as /encode refuses it
                await _discard_body(request, settings.server.max_request_bytes)
                raise lifecycle.refusal()
            body = await _read_body(request, settings.server.max_request_bytes, offload)
            # Stopped as /encode is: a client gone while its items are queued takes them out of the queue.
            return JSONResponse(await until_stopped(request, lifecycle, drain_timeout, vllm.complete(body)))

    @app.api_route("/v1/ec_cache/{identifier}", methods=["GET", "HEAD"])
    async def ec_cache(identifier: str, request: Request) -> Response:
        """A stored embedding's safetensors file (the network connector's read); 404 when absent."""
        vllm = active()
        check_identifier(identifier, "identifier")  # one safe path component: nothing outside the store is read
        if request.method == "HEAD":
            found = await offload.run(vllm.store.has, identifier)
            return Response(status_code=200 if found else 404)
        data = await offload.run(vllm.store.read, identifier)
        if data is None:
            raise FaceOff(f"no stored embedding {identifier[:80]!r} on this pod")
        return Response(data, media_type="application/octet-stream")


def _install_control(app: FastAPI, engine: Engine, offload: Offload) -> None:
    for op in CONTROL_OPS:  # each backend's routes, as its module declares them
        app.add_api_route(
            op.path, _control_route(op, engine, offload), methods=list(op.methods), name=op.name, description=op.doc,
            response_model=op.answer_model,
        )

    @app.api_route("/start_profile", methods=["GET", "POST"])
    async def start_profile(request: Request) -> dict[str, Any]:
        """Start the torch profiler (output_dir, num_steps, activities, with_stack, record_shapes); GET or POST as SGLang."""
        return await engine.start_profile(await _read_object(request, CONTROL_BODY_LIMIT, offload, empty_ok=True))

    @app.api_route("/stop_profile", methods=["GET", "POST"])
    async def stop_profile() -> dict[str, Any]:
        """Stop the profiler and write the trace."""
        return await engine.stop_profile()


def _control_route(op: ControlOp, engine: Engine, offload: Offload) -> Callable[[Request], Awaitable[Any]]:
    async def route(request: Request) -> Any:
        return op.http_answer(await engine.control(op.name, await _read_object(request, CONTROL_BODY_LIMIT, offload)))

    return route
