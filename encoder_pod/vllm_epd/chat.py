"""What vLLM's EPD proxy sends an encoder instance: an OpenAI chat body carrying media parts.

``POST /v1/chat/completions`` with ``{"model", "messages": [{"role": "user", "content": [parts]}],
"stream": false}``, each part ``{"type": "image_url", "image_url": {"url": ...}, "uuid": ...}``
(``audio_url``, ``input_audio`` ``{"data", "format"}`` and ``video_url`` alike), and the
request's ``mm_processor_kwargs`` / ``media_io_kwargs`` passed through. Text parts and other
fields (``max_tokens``, ``priority``, ``session_id`` ...) are accepted and ignored: an encoder
instance samples nothing. Every refusal names the field, as ``messages[0].content[2].uuid``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from encoder_pod.errors import InvalidRequest

MEDIA_PARTS = {"image_url": "image", "audio_url": "audio", "input_audio": "audio", "video_url": "video"}
"""Content part types that carry a media item, and the item's modality (vLLM's names)."""
TEXT_PARTS = {"text", "input_text"}
MAX_ITEMS = 1024


@dataclass(frozen=True)
class ChatItem:
    """One media part of the body, in order of appearance."""

    field: str
    """Where it is in the body (``messages[0].content[1]``): every refusal about it names this."""
    modality: str
    source: str
    """The URL, data: URI or file path; for ``input_audio`` a data: URI of its base64."""
    uuid: str | None


@dataclass(frozen=True)
class ChatRequest:
    """A validated body."""

    model: str | None
    items: tuple[ChatItem, ...]
    mm_processor_kwargs: dict[str, Any]
    media_io_kwargs: dict[str, dict[str, Any]]


def _fail(field: str, reason: str) -> InvalidRequest:
    return InvalidRequest(f"field '{field}': {reason}")


def _source(part: dict[str, Any], kind: str, field: str) -> str:
    inner = part.get(kind)
    if kind == "input_audio":
        if not isinstance(inner, dict) or not isinstance(inner.get("data"), str) or not inner["data"]:
            raise _fail(f"{field}.input_audio.data", "required, the audio file as base64")
        fmt = inner.get("format") or "wav"
        return f"data:audio/{fmt};base64,{inner['data']}"
    url = inner.get("url") if isinstance(inner, dict) else inner
    if not isinstance(url, str) or not url.strip():
        raise _fail(f"{field}.{kind}.url", "required, a URL, a data: URI or a file: path")
    return url.strip()


def _kwargs(body: dict[str, Any], name: str) -> dict[str, Any]:
    value = body.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _fail(name, f"must be an object, got {type(value).__name__}")
    return value


def parse_chat(body: Any) -> ChatRequest:
    """Validate a chat body; :class:`InvalidRequest` names the field and the reason."""
    if not isinstance(body, dict):
        raise InvalidRequest(f"request body must be a JSON object, got {type(body).__name__}")
    if body.get("stream"):
        raise _fail("stream", "must be false: an encoder instance answers once every embedding is stored")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _fail("model", "must be a string")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _fail("messages", "required, a non-empty list of messages")
    items: list[ChatItem] = []
    for m, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _fail(f"messages[{m}]", "must be an object")
        content = message.get("content")
        if isinstance(content, str) or content is None:
            continue
        if not isinstance(content, list):
            raise _fail(f"messages[{m}].content", "must be a string or a list of content parts")
        for c, part in enumerate(content):
            field = f"messages[{m}].content[{c}]"
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise _fail(f"{field}.type", "required, the content part's type")
            kind = part["type"]
            if kind in TEXT_PARTS:
                continue
            if kind not in MEDIA_PARTS:
                raise _fail(f"{field}.type", f"{kind!r} is not a media part this encoder takes ({', '.join(sorted(MEDIA_PARTS))})")
            uuid = part.get("uuid")
            if uuid is not None and not isinstance(uuid, str):
                raise _fail(f"{field}.uuid", f"must be a string, got {type(uuid).__name__}")
            items.append(ChatItem(field, MEDIA_PARTS[kind], _source(part, kind, field), uuid))
    if not items:
        raise _fail("messages", "no media part (image_url, audio_url, input_audio, video_url): nothing to encode")
    if len(items) > MAX_ITEMS:
        raise _fail("messages", f"{len(items)} media parts, more than the limit of {MAX_ITEMS}")
    media_io = _kwargs(body, "media_io_kwargs")
    for modality, value in media_io.items():
        if not isinstance(value, dict):
            raise _fail(f"media_io_kwargs.{modality}", f"must be an object, got {type(value).__name__}")
    image_mode = (media_io.get("image") or {}).get("image_mode", "RGB")
    if image_mode != "RGB":
        raise _fail("media_io_kwargs.image.image_mode", f"only 'RGB' (vLLM's default) is served here, got {image_mode!r}")
    return ChatRequest(model, tuple(items), _kwargs(body, "mm_processor_kwargs"), media_io)
