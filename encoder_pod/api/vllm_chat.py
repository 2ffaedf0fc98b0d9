"""``POST /v1/chat/completions``: the pod as the encoder instance of vLLM's EPD (docs/vllm.md).

vLLM's proxy sends each encoder instance the media parts of a chat request; the instance encodes
them, publishes every item's embedding where the consumers' EC connector finds it, and answers
with ``ec_transfer_params``: per identifier, the item's modality, its positions in the body and
the placeholder metadata the consumer needs. Here the publication is a file of the
``ECExampleConnector`` layout (:mod:`encoder_pod.vllm_epd.storage`), written before the answer.

The items go through the engine as /encode bodies, one per modality, answered inline: the same
admission, batching, cache, validation and errors as /encode (an item's error names its content
part instead of ``mm_items[i]``). Before that each item is fetched here, decoded as vLLM decodes
it (the identifier's hash needs the raw bytes and what decoding did; the encoder gets the upright
RGB pixels vLLM's processor would see) and its identifier computed.

This front door sits on the engine's /encode entry; when the engine offers a typed per-item entry
the body-building below (:meth:`VllmFace._encode_modality`) is the one part to replace.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid as uuid_module
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pybase64

from encoder_pod.api.engine import Engine
from encoder_pod.errors import EncoderError, InvalidRequest, ItemError, MediaError, NotReady
from encoder_pod.media.sources import MediaSources
from encoder_pod.settings import EncoderSettings
from encoder_pod.vllm_epd.chat import ChatItem, ChatRequest, parse_chat
from encoder_pod.vllm_epd.families import VLLM_FAMILIES, VllmFamily, item_metadata
from encoder_pod.vllm_epd.images import background_colour, pod_bytes, vllm_image
from encoder_pod.vllm_epd.mm_hash import hash_factors, identifier, needs_uuid
from encoder_pod.vllm_epd.storage import EcStore, cast_rows, check_identifier

_ITEM_INDEX = re.compile(r"^mm_items\[(\d+)\]: ")
MODALITY = {"image": "IMAGE", "audio": "AUDIO", "video": "VIDEO"}
SWEEP_EVERY_S = 30.0


@dataclass
class _Prepared:
    """One item, fetched and named."""

    item: ChatItem
    identifier: str
    payload: str
    """The item as the engine's /encode body carries it."""


class VllmFace:
    """The vLLM encoder-instance contract over an :class:`Engine` (one per pod process)."""

    def __init__(self, settings: EncoderSettings, engine: Engine) -> None:
        vllm = settings.vllm
        assert vllm.vllm_storage_path is not None
        self._engine = engine
        self._settings = settings
        self.store = EcStore(vllm.vllm_storage_path, vllm.vllm_storage_max_mb << 20, vllm.vllm_storage_ttl)
        self._sources = MediaSources(settings.media, max_bytes=settings.server.max_request_bytes)
        self._exec = ThreadPoolExecutor(settings.media.mm_load_workers, thread_name_prefix="vllm-media")
        self._model_id = vllm.vllm_model_id or settings.model.model_path
        self._swept = time.monotonic()

    def close(self) -> None:
        """Stop the face's threads."""
        self._exec.shutdown(wait=False, cancel_futures=True)

    def _family(self, chat: ChatRequest) -> tuple[str, VllmFamily, str]:
        model = self._engine.model_facts()
        if model is None:
            raise NotReady("model is still loading")
        name = model.family
        family = VLLM_FAMILIES.get(name)
        if family is None:
            raise InvalidRequest(f"this pod serves {name}, which no vLLM EPD consumer splices in: /v1/chat/completions serves "
                                 f"{', '.join(sorted(VLLM_FAMILIES))}")
        takes = {m.value for m in model.modalities}
        for item in chat.items:
            if MODALITY[item.modality] not in takes:
                raise InvalidRequest(f"field '{item.field}': {name} takes no {item.modality} items ({', '.join(sorted(takes))} only)")
        return name, family, model.dtype

    async def complete(self, body: Any) -> dict[str, Any]:
        """Encode and publish every media item of ``body``; the chat answer with ``ec_transfer_params``."""
        chat = parse_chat(body)
        self._check_kwargs(chat)
        name, family, model_dtype = self._family(chat)
        loop = asyncio.get_running_loop()
        prepared = await asyncio.gather(*[loop.run_in_executor(self._exec, self._prepare, chat, item) for item in chat.items])
        chat_id = f"chatcmpl-{uuid_module.uuid4().hex}"
        by_modality: dict[str, list[int]] = {}
        for index, item in enumerate(chat.items):
            by_modality.setdefault(item.modality, []).append(index)
        results = await asyncio.gather(*[self._encode_modality(chat_id, modality, [prepared[i] for i in indices])
                                         for modality, indices in by_modality.items()])
        rows: dict[int, tuple[int, list[int], Any, tuple[int, ...]]] = {}
        dtype = self._settings.vllm.vllm_dtype
        writes = []
        for indices, (answer_meta, slices) in zip(by_modality.values(), results):
            for index, (count, grid, data, shape) in zip(indices, slices):
                rows[index] = (count, grid, data, shape)
                to = model_dtype if dtype == "auto" else dtype
                writes.append(loop.run_in_executor(self._exec, self._write, prepared[index].identifier, data,
                                                   answer_meta["embedding"]["dtype"], to, shape))
        await asyncio.gather(*writes)  # every file is whole under its final name before the answer
        self._maybe_sweep(loop)
        params: dict[str, Any] = {}
        for index, item in enumerate(chat.items):
            count, grid, _, _ = rows[index]
            entry = params.setdefault(prepared[index].identifier, {"modality": item.modality, "item_indices": []})
            entry["metadata"] = item_metadata(family, item.modality, count, grid)
            entry["item_indices"].append(index)
        return _answer(chat_id, chat.model or name, params, sum(r[0] for r in rows.values()))

    def _check_kwargs(self, chat: ChatRequest) -> None:
        if chat.mm_processor_kwargs:
            raise InvalidRequest("field 'mm_processor_kwargs': request-level processor kwargs are not applied by this encoder "
                                 "(its processor config is the checkpoint's): the consumer would size other placeholders")
        for modality, value in chat.media_io_kwargs.items():
            if value and modality != "image" and any(item.modality == modality for item in chat.items):
                raise InvalidRequest(f"field 'media_io_kwargs.{modality}': not applied to {modality} items by this encoder")
        for item in chat.items:
            if item.modality == "video":
                raise InvalidRequest(f"field '{item.field}': video items are not served through the vLLM face: vLLM samples "
                                     "frames with its own loader (and Qwen3-VL adds text embeddings), so the consumer's "
                                     "placeholders would not match; send video to the consumer itself")

    def _prepare(self, chat: ChatRequest, item: ChatItem) -> _Prepared:
        """Fetch, decode and name one item (a media thread)."""
        factors = hash_factors(item.modality, chat.mm_processor_kwargs, chat.media_io_kwargs)
        background = background_colour(chat.media_io_kwargs.get("image"), "media_io_kwargs.image")
        try:
            data = self._sources.fetch(item.source)
            if item.modality == "image":
                decoded = vllm_image(data, self._settings.media.max_image_pixels, background)
                name = identifier(self._settings.vllm.vllm_mm_hasher_algorithm, self._model_id, "image", item.uuid,
                                  decoded.hash_item, factors)
                data = pod_bytes(decoded)
            else:
                if item.uuid is None:
                    raise InvalidRequest(f"field '{item.field}.uuid': required for {item.modality} items: "
                                         f"{needs_uuid(item.modality)}, which this encoder cannot reproduce")
                name = identifier(self._settings.vllm.vllm_mm_hasher_algorithm, self._model_id, item.modality, item.uuid, None, factors)
        except MediaError as exc:
            raise InvalidRequest(f"field '{item.field}': {exc.message}") from None
        check_identifier(name, f"{item.field}.uuid")
        return _Prepared(item, name, "data:;base64," + pybase64.b64encode(data).decode("ascii"))

    async def _encode_modality(self, chat_id: str, modality: str, items: list[_Prepared]) -> tuple[dict[str, Any], list[Any]]:
        """One /encode body through the engine; per item (rows, grid, bytes, shape)."""
        body = {"req_id": f"{chat_id}-{modality}", "modality": MODALITY[modality], "mm_items": [p.payload for p in items]}
        try:
            answer = await self._engine.encode(body)
        except EncoderError as err:
            raise _renamed(err, items) from None
        assert answer is not None  # no prefill_host: answered inline
        meta = answer.meta
        counts, grids = meta["item_token_counts"], meta["item_grids"]
        shape = meta["embedding"]["shape"]
        width, size = int(shape[1]), _SIZES[meta["embedding"]["dtype"]]
        view = memoryview(answer.data).cast("B")
        slices, start = [], 0
        for count, grid in zip(counts, grids):
            nbytes = int(count) * width * size
            slices.append((int(count), list(grid), view[start : start + nbytes], (int(count), width)))
            start += nbytes
        return meta, slices

    def _write(self, name: str, data: memoryview, dtype: str, to: str, shape: tuple[int, ...]) -> None:
        cast, cast_dtype = cast_rows(data, dtype, to)
        self.store.write(name, cast, cast_dtype, shape)

    def _maybe_sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        now = time.monotonic()
        if now - self._swept >= SWEEP_EVERY_S:
            self._swept = now
            loop.run_in_executor(self._exec, self.store.sweep)


_SIZES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


def _renamed(err: EncoderError, items: list[_Prepared]) -> EncoderError:
    """An /encode error about ``mm_items[i]`` as one about the chat body's content part (the kind kept)."""
    match = _ITEM_INDEX.match(err.message)
    index = err.index if isinstance(err, ItemError) else int(match.group(1)) if match else None
    if index is None or not 0 <= index < len(items):
        err.req_id = None
        return err
    reason = err.reason if isinstance(err, ItemError) else err.message[match.end():] if match else err.message
    return EncoderError.from_kind(err.kind, f"field '{items[index].item.field}': {reason}")


def _answer(chat_id: str, model: str, params: dict[str, Any], prompt_tokens: int) -> dict[str, Any]:
    """An OpenAI chat completion with nothing sampled, plus ``ec_transfer_params`` (what the proxy reads)."""
    return {
        "id": chat_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 0, "total_tokens": prompt_tokens},
        "kv_transfer_params": None,
        "ec_transfer_params": params,
    }
