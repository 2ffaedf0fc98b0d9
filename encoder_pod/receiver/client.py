"""The prefill side's client: split a request's media items over several encoders and post the parts.

Two ways to assign items. By default (:func:`plan_parts`) assignment follows SGLang's receiver, so a mixed deployment numbers parts the same way: per
modality (in order of first appearance), the items are cut into contiguous chunks as even as
possible over the encoders, the encoders that get the extra item rotate from one modality to the
next, and part indices run modality by modality, encoder by encoder, skipping encoders with no
items. Part ``k`` is posted as ``<request_id>_local_part_<k>``; the receiver strips that suffix to
group the parts again.

With cache affinity (:func:`plan_affinity_parts`, ``EncoderClient(..., affinity=True)``) each item
goes to the encoder the rendezvous rule of :mod:`encoder_pod.rendezvous` picks for it, so a
repeated item reaches the pod whose embedding cache holds it; consecutive items (per modality) that
go to the same encoder form one part, so parts merged in ``part_idx`` order keep the items' order.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Any, Sequence

import httpx

from encoder_pod import json_limits
from encoder_pod.modality import Modality
from encoder_pod.rendezvous import affinity_key, choose, item_source
from encoder_pod.receiver.answers import ACCEPT, decode_answer
from encoder_pod.receiver.assembly import ReceivedEmbedding, merge_parts
from encoder_pod.receiver.errors import DispatchError
from encoder_pod.receiver.wire import PART_SUFFIX

OFFLOAD_BYTES = 1 << 20
"""Inline answers larger than this are decoded on a thread."""


@dataclass(frozen=True)
class PartPlan:
    """One /encode call: which encoder gets which items as which part."""

    request_id: str
    part_idx: int
    num_parts: int
    modality: Modality
    encoder_idx: int
    encoder_url: str
    items: tuple[Any, ...]

    @property
    def req_id(self) -> str:
        """The per-part id posted to the encoder."""
        return f"{self.request_id}{PART_SUFFIX}{self.part_idx}"

    def body(self, prefill_host: str | None, embedding_port: int | list[int] | None) -> dict[str, Any]:
        """The /encode JSON body of this part."""
        return {
            "req_id": self.req_id,
            "mm_items": list(self.items),
            "modality": self.modality.value,
            "num_parts": self.num_parts,
            "part_idx": self.part_idx,
            "prefill_host": prefill_host,
            "embedding_port": embedding_port,
            "encoder_idx": self.encoder_idx,
        }


def _assignments(counts: dict[Modality, int], n_encoders: int, rng: random.Random | None) -> dict[Modality, list[int]]:
    order = list(range(n_encoders))
    if rng is not None:
        rng.shuffle(order)
    out: dict[Modality, list[int]] = {}
    offset = 0
    for modality, count in counts.items():
        base, extra = divmod(count, n_encoders)
        per_encoder = [0] * n_encoders
        for i in range(n_encoders):
            per_encoder[order[(offset + i) % n_encoders]] = base + (1 if i < extra else 0)
        out[modality] = per_encoder
        offset = (offset + extra) % n_encoders
    return out


def plan_parts(
    request_id: str,
    items: Sequence[tuple[Modality | str, Any]],
    encoder_urls: Sequence[str],
    *,
    rng: random.Random | None = None,
) -> list[PartPlan]:
    """Split ``(modality, item)`` pairs over ``encoder_urls``; ``rng`` shuffles like SGLang does (None: no shuffle)."""
    if not encoder_urls:
        raise ValueError("no encoder URLs to split items over")
    by_modality = _by_modality(items)
    assigned = _assignments({m: len(v) for m, v in by_modality.items()}, len(encoder_urls), rng)
    num_parts = sum(1 for counts in assigned.values() for c in counts if c)
    plans: list[PartPlan] = []
    for modality, modality_items in by_modality.items():
        start = 0
        for encoder_idx, count in enumerate(assigned[modality]):
            if not count:
                continue
            plans.append(
                PartPlan(
                    request_id=request_id,
                    part_idx=len(plans),
                    num_parts=num_parts,
                    modality=modality,
                    encoder_idx=encoder_idx,
                    encoder_url=encoder_urls[encoder_idx].rstrip("/"),
                    items=tuple(modality_items[start : start + count]),
                )
            )
            start += count
    return plans


def _by_modality(items: Sequence[tuple[Modality | str, Any]]) -> dict[Modality, list[Any]]:
    by_modality: dict[Modality, list[Any]] = {}
    for modality, item in items:
        by_modality.setdefault(Modality.parse(modality.value if isinstance(modality, Modality) else modality), []).append(item)
    return by_modality


def plan_affinity_parts(request_id: str, items: Sequence[tuple[Modality | str, Any]], encoder_urls: Sequence[str]) -> list[PartPlan]:
    """Split ``(modality, item)`` pairs by cache affinity: each item to the encoder the rendezvous
    rule picks (:func:`~encoder_pod.rendezvous.choose`), consecutive items of one modality
    for the same encoder in one part; modalities in order of first appearance."""
    if not encoder_urls:
        raise ValueError("no encoder URLs to split items over")
    runs: list[tuple[Modality, int, list[Any]]] = []
    for modality, modality_items in _by_modality(items).items():
        for item in modality_items:
            encoder_idx = choose(affinity_key(*item_source(item)), encoder_urls)
            if runs and runs[-1][0] is modality and runs[-1][1] == encoder_idx:
                runs[-1][2].append(item)
            else:
                runs.append((modality, encoder_idx, [item]))
    return [
        PartPlan(request_id, part_idx, len(runs), modality, encoder_idx, encoder_urls[encoder_idx].rstrip("/"), tuple(run))
        for part_idx, (modality, encoder_idx, run) in enumerate(runs)
    ]


def _error_message(response: httpx.Response) -> str:
    try:
        body = json_limits.loads(response.content)
    except ValueError:
        return response.text[:500]
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return body["message"]
    return response.text[:500]


class EncoderClient:
    """Posts the parts of requests to encoder pods (one shared HTTP connection pool).

    ``affinity=True`` assigns items by cache affinity (:func:`plan_affinity_parts`) instead of
    SGLang's even split; keep :attr:`encoder_urls` to the pool's ready endpoints (an
    ``EncoderPool``'s ``status.endpoints``) and only the keys of an endpoint that comes or goes move.
    """

    def __init__(
        self,
        encoder_urls: Sequence[str],
        *,
        timeout: float = 180.0,
        http: httpx.AsyncClient | None = None,
        affinity: bool = False,
    ) -> None:
        self.encoder_urls = list(encoder_urls)
        """The encoders items are split over (replace the list when the pool's endpoints change)."""
        self.affinity = affinity
        self._own_http = http is None
        self._http = http or httpx.AsyncClient(timeout=timeout)

    async def _post(self, plan: PartPlan, path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> httpx.Response:
        url = f"{plan.encoder_url}{path}"
        try:
            response = await self._http.post(url, json=body, headers=headers)
        except httpx.HTTPError as exc:
            raise DispatchError(
                f"{url} unreachable for {plan.req_id!r}: {type(exc).__name__}: {exc}", req_id=plan.req_id, status=502, encoder_url=plan.encoder_url
            ) from None
        if response.status_code != 200:
            raise DispatchError(
                f"{url} answered {response.status_code} for {plan.req_id!r}: {_error_message(response)}",
                req_id=plan.req_id,
                status=response.status_code,
                encoder_url=plan.encoder_url,
            )
        return response

    async def dispatch(
        self,
        request_id: str,
        items: Sequence[tuple[Modality | str, Any]],
        *,
        prefill_host: str,
        embedding_port: int | list[int] | None = None,
        receive_urls: Sequence[str] = (),
        rng: random.Random | None = None,
    ) -> list[PartPlan]:
        """Post every part (and, with ``receive_urls``, register them for zmq_to_scheduler).

        ``embedding_port`` is where encoders push (an int for zmq_to_tokenizer, a list for
        zmq_to_scheduler). With ``receive_urls`` ("host:port" per prefill rank) and no port, each
        part is first registered through ``/scheduler_receive_url``, concurrently with ``/encode``.
        Waits for every call; raises the first :class:`DispatchError`. With :attr:`affinity`, ``rng``
        is not used (the assignment is the rendezvous rule's).
        """
        plans = self._plan(request_id, items, rng)
        calls = [self._post(p, "/encode", p.body(prefill_host, embedding_port)) for p in plans]
        for plan in plans:
            for url in receive_urls:
                payload = {"req_id": plan.req_id, "receive_count": len(receive_urls), "receive_url": url, "modality": plan.modality.value}
                calls.append(self._post(plan, "/scheduler_receive_url", payload))
        results = await asyncio.gather(*calls, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return plans

    def _plan(self, request_id: str, items: Sequence[tuple[Modality | str, Any]], rng: random.Random | None) -> list[PartPlan]:
        if self.affinity:
            return plan_affinity_parts(request_id, items, self.encoder_urls)
        return plan_parts(request_id, items, self.encoder_urls, rng=rng)

    async def encode(
        self,
        request_id: str,
        items: Sequence[tuple[Modality | str, Any]],
        *,
        answer: str = "binary",
        rng: random.Random | None = None,
    ) -> ReceivedEmbedding:
        """Encode ``items`` with the embedding in the answers (no receiver socket): parts as for
        :meth:`dispatch`, each answered inline as ``answer`` asks (``binary``: the wire format,
        ``msgpack``, or ``json``), decoded as strictly as a push and merged in part order.
        Raises :class:`DispatchError` for a part the encoder refused, a ``MalformedMessage`` for an
        answer that cannot be read."""
        headers = {"accept": ACCEPT[answer]}
        plans = self._plan(request_id, items, rng)
        responses = await asyncio.gather(*[self._post(p, "/encode", p.body(None, None), headers) for p in plans])
        parts = []
        for response in responses:
            content_type, body = response.headers.get("content-type"), response.content
            if len(body) > OFFLOAD_BYTES:  # the caller's loop stays free while a large answer is decoded
                parts.append(await asyncio.to_thread(decode_answer, content_type, body))
            else:
                parts.append(decode_answer(content_type, body))
        return merge_parts(request_id, parts)

    async def aclose(self) -> None:
        """Close the HTTP client if this object created it."""
        if self._own_http:
            await self._http.aclose()

    async def __aenter__(self) -> "EncoderClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
