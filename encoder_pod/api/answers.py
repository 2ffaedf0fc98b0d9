"""Which rendering of an inline answer a caller gets: content negotiation on ``Accept``.

JSON is the default (curl, ``*/*``, no header, or nothing this pod can write); a caller that
prefers ``application/octet-stream`` gets the project's wire format in one body, one that prefers
``application/x-msgpack`` (or ``application/msgpack``, ``application/vnd.msgpack``) a msgpack map
(:mod:`encoder_pod.transfer.inline` defines all three). Quality values count (``q=0`` refuses a
type); among equal ones an exact type beats a wildcard, then the first listed wins. Errors and the
``null`` of a pushed answer are JSON whatever the caller asked.
"""

from __future__ import annotations

from enum import Enum

from fastapi.responses import JSONResponse
from starlette.responses import Response

from encoder_pod.api.json_body import PiecesResponse
from encoder_pod.offload import Offload
from encoder_pod.transfer.inline import InlineAnswer


class AnswerFormat(str, Enum):
    """A rendering of the inline answer, named by the media type it is sent as."""

    JSON = "application/json"
    BINARY = "application/octet-stream"
    MSGPACK = "application/x-msgpack"


MEDIA_TYPES: dict[str, AnswerFormat] = {
    "application/json": AnswerFormat.JSON,
    "application/octet-stream": AnswerFormat.BINARY,
    "application/x-msgpack": AnswerFormat.MSGPACK,
    "application/msgpack": AnswerFormat.MSGPACK,
    "application/vnd.msgpack": AnswerFormat.MSGPACK,
}
"""Media types an ``Accept`` header may name, and the rendering each one gets."""

_WILDCARDS = ("*/*", "application/*")

LOOP_JSON_BYTES = 256 * 1024
"""JSON answers of an embedding up to this size are rendered on the loop: their base64 takes
about 30 us (pybase64), less loop time than handing them to a thread and back."""


def _quality(params: list[str]) -> float:
    for param in params:
        name, _, value = param.partition("=")
        if name.strip().lower() == "q":
            try:
                return min(max(float(value), 0.0), 1.0)
            except ValueError:
                return 0.0
    return 1.0


def negotiate(accept: str | None) -> AnswerFormat:
    """The rendering an ``Accept`` header asks for (JSON unless a binary type is preferred)."""
    best, best_rank = AnswerFormat.JSON, (0.0, 0, 0)
    for position, media_range in enumerate((accept or "").split(",")):
        media_type, *params = media_range.split(";")
        media_type = media_type.strip().lower()
        wildcard = media_type in _WILDCARDS
        fmt = AnswerFormat.JSON if wildcard else MEDIA_TYPES.get(media_type)
        quality = _quality(params)
        if fmt is None or quality <= 0:
            continue
        rank = (quality, 0 if wildcard else 1, -position)
        if rank > best_rank:
            best, best_rank = fmt, rank
    return best


async def answer_response(answer: InlineAnswer | None, accept: str | None, offload: Offload) -> Response:
    """The HTTP response of an /encode answer: ``null`` once pushed, else the inline body as negotiated.

    JSON needs base64 of the whole embedding: a large one is rendered on an ``offload`` thread,
    one up to :data:`LOOP_JSON_BYTES` here. The binary bodies only pack a small header around the
    tensor's bytes, so they are rendered here.
    """
    if answer is None:
        return JSONResponse(None)
    fmt = negotiate(accept)
    if fmt is AnswerFormat.JSON:
        small = memoryview(answer.data).nbytes <= LOOP_JSON_BYTES
        pieces = answer.render_json() if small else await offload.run(answer.render_json)
    elif fmt is AnswerFormat.BINARY:
        pieces = answer.render_binary()
    else:
        pieces = answer.render_msgpack()
    return PiecesResponse(pieces, media_type=fmt.value, headers={"vary": "accept"})
