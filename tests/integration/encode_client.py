"""Small helpers to call /encode and read inline embeddings back."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np

from encoder_pod.transfer.inline import decode_embedding


def encode(base_url: str, req_id: str, items: list[Any], modality: str = "IMAGE", timeout: float = 120, **extra: Any) -> httpx.Response:
    """POST one /encode request."""
    body = {"req_id": req_id, "mm_items": items, "modality": modality, **extra}
    return httpx.post(base_url + "/encode", json=body, timeout=timeout)


def embedding(resp: httpx.Response) -> np.ndarray:
    """The inline embedding of a 200 response."""
    assert resp.status_code == 200, resp.text
    return decode_embedding(resp.json()["embedding"])


def encode_concurrently(base_url: str, bodies: list[dict[str, Any]], timeout: float = 120) -> list[httpx.Response]:
    """POST every body at once (one thread each) and return the responses in order."""
    def post(body: dict[str, Any]) -> httpx.Response:
        return httpx.post(base_url + "/encode", json=body, timeout=timeout)

    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(post, bodies))
