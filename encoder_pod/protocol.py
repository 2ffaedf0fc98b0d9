"""The /encode request body (SGLang's contract), parsed into a typed request.

Parsing is by hand rather than a pydantic model so that every rejection names the field and
the reason in words a caller understands (``field 'part_idx': 3 is not below num_parts 2``).
Unknown fields (``time_stats_json``, ``encoder_url``, ...) are accepted and ignored, as SGLang's
own client sends them.

Items are what SGLang's prefill sends (``_encoder_media_item``): a bare string, or an object with
``url`` and the item's options: ``content_hash`` (``sha256:<64 hex>``, verified against the bytes),
and the processor options SGLang forwards (``detail``, ``max_dynamic_patch``, ``preprocess_kwargs``,
``max_long_side_pixel``, or any other key), which its encoder ignores for the families served here
(only the server-wide processor config applies), and so does this pod: they are kept, not used.
``hashes`` is carried as given (SGLang accepts a list, a string or an integer).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from encoder_pod.errors import InvalidRequest
from encoder_pod.modality import Modality

MAX_REQ_ID_LEN = 512
MAX_ITEMS = 1024
_CONTENT_HASH = re.compile(r"sha256:[0-9a-f]{64}")


@dataclass(frozen=True)
class ItemSpec:
    """Where one media item comes from: a URL, a data: URI, raw base64, or a file path."""

    source: str
    options: dict[str, Any] = field(default_factory=dict)
    """The item object's other keys (processor options SGLang forwards; accepted, not applied)."""
    content_hash: str | None = None
    """``sha256:<64 lower-case hex>`` the item's bytes must have."""


@dataclass(frozen=True)
class EncodeRequest:
    """A validated /encode request."""

    req_id: str
    modality: Modality
    items: tuple[ItemSpec, ...]
    num_parts: int = 1
    part_idx: int = 0
    prefill_host: str | None = None
    embedding_port: int | tuple[int, ...] | None = None
    encoder_idx: Any = None
    hashes: tuple[Any, ...] | None = None

    @property
    def ports(self) -> tuple[int, ...]:
        """Every port the embedding goes to (one for zmq_to_tokenizer, one per TP rank otherwise)."""
        if self.embedding_port is None:
            return ()
        if isinstance(self.embedding_port, int):
            return (self.embedding_port,)
        return self.embedding_port


def _fail(name: str, reason: str, req_id: str | None = None) -> InvalidRequest:
    return InvalidRequest(f"field '{name}': {reason}", req_id=req_id)


def _int_field(body: dict[str, Any], name: str, default: int, req_id: str | None) -> int:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(name, f"must be an integer, got {type(value).__name__}", req_id)
    return value


def _flatten(items: list[Any], out: list[Any], depth: int = 0) -> None:
    for item in items:
        if isinstance(item, list) and depth < 4:
            _flatten(item, out, depth + 1)
        else:
            out.append(item)


def _parse_items(raw: Any, req_id: str | None) -> tuple[ItemSpec, ...]:
    if not isinstance(raw, list):
        got = "missing" if raw is None else f"got {type(raw).__name__}"
        raise _fail("mm_items", f"must be a non-empty list of items, {got}", req_id)
    flat: list[Any] = []
    _flatten(raw, flat)
    if not flat:
        raise _fail("mm_items", "must not be empty", req_id)
    if len(flat) > MAX_ITEMS:
        raise _fail("mm_items", f"{len(flat)} items, more than the limit of {MAX_ITEMS}", req_id)
    return tuple(_parse_item(index, item, req_id) for index, item in enumerate(flat))


def _parse_item(index: int, item: Any, req_id: str | None) -> ItemSpec:
    if isinstance(item, dict):
        url = item.get("url")
        options = {k: v for k, v in item.items() if k not in ("url", "content_hash")}
        content_hash = item.get("content_hash")
    else:
        url, options, content_hash = item, {}, None
    if not isinstance(url, str) or not url.strip():
        what = "an object without 'url'" if isinstance(item, dict) and "url" not in item else type(url).__name__
        raise InvalidRequest(
            f"mm_items[{index}]: must be a URL, data: URI, base64 string or file path (or an object with 'url'), got {what}",
            req_id=req_id,
        )
    if content_hash is not None:
        text = content_hash.strip().lower() if isinstance(content_hash, str) else ""
        if not _CONTENT_HASH.fullmatch(text):
            raise InvalidRequest(f"mm_items[{index}]: content_hash must use the form 'sha256:<64 hex digits>'", req_id=req_id)
        content_hash = text
    return ItemSpec(url.strip(), options, content_hash)


def _parse_port(value: Any, name: str, req_id: str | None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise _fail(name, f"ports must be integers in 1..65535, got {value!r}", req_id)
    return value


def _parse_ports(value: Any, req_id: str | None) -> int | tuple[int, ...] | None:
    if value is None:
        return None
    if isinstance(value, list):
        if not value:
            raise _fail("embedding_port", "an empty list names no receiver", req_id)
        return tuple(_parse_port(v, "embedding_port", req_id) for v in value)
    return _parse_port(value, "embedding_port", req_id)


def parse_encode_request(body: Any) -> EncodeRequest:
    """Validate an /encode body; raise :class:`InvalidRequest` naming the field and the reason."""
    if not isinstance(body, dict):
        raise InvalidRequest(f"request body must be a JSON object, got {type(body).__name__}")
    req_id = body.get("req_id")
    if not isinstance(req_id, str) or not req_id:
        raise _fail("req_id", "required, a non-empty string")
    if len(req_id) > MAX_REQ_ID_LEN:
        raise _fail("req_id", f"longer than {MAX_REQ_ID_LEN} characters", req_id[:64])
    if "modality" not in body or body["modality"] is None:
        raise _fail("modality", "required; one of IMAGE, AUDIO, VIDEO", req_id)
    try:
        modality = Modality.parse(body["modality"])
    except ValueError as exc:
        raise _fail("modality", str(exc), req_id) from None
    items = _parse_items(body.get("mm_items"), req_id)
    num_parts = _int_field(body, "num_parts", 1, req_id)
    part_idx = _int_field(body, "part_idx", 0, req_id)
    if num_parts < 1:
        raise _fail("num_parts", f"must be at least 1, got {num_parts}", req_id)
    if not 0 <= part_idx < num_parts:
        raise _fail("part_idx", f"must be in 0..{num_parts - 1} (num_parts is {num_parts}), got {part_idx}", req_id)
    prefill_host = body.get("prefill_host")
    if prefill_host is not None and (not isinstance(prefill_host, str) or not prefill_host.strip()):
        raise _fail("prefill_host", "must be a host name or address", req_id)
    hashes = body.get("hashes")
    if hashes is not None and not isinstance(hashes, (list, str, int)):
        raise _fail("hashes", f"must be a list, a string or an integer (as SGLang accepts), got {type(hashes).__name__}", req_id)
    if isinstance(hashes, (str, int)):
        hashes = [hashes]
    return EncodeRequest(
        req_id=req_id,
        modality=modality,
        items=items,
        num_parts=num_parts,
        part_idx=part_idx,
        prefill_host=prefill_host.strip() if prefill_host else None,
        embedding_port=_parse_ports(body.get("embedding_port"), req_id),
        encoder_idx=body.get("encoder_idx"),
        hashes=tuple(hashes) if hashes is not None else None,
    )
