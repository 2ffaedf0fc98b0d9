"""Cache affinity: which encoder an item goes to, so a repeated item reaches the pod that holds it.

Pure and torch-free: the receiver library's client and the data-parallel front both apply it.

The rule (rendezvous, or highest-random-weight, hashing), for anyone who routes items over a
pool, e.g. from an ``EncoderPool``'s ``status.endpoints``:

1. The item's **affinity key** (:func:`affinity_key`) is the 32 bytes of its ``content_hash``
   (``sha256:<64 hex>``) when it names one, else ``sha256(b"source:" + <the item string,
   UTF-8>)``, where the item string is the URL, data: URI, base64 text or path as sent (the
   ``url`` of an object item).
2. Each ready endpoint's **score** for that key (:func:`score`) is the first 8 bytes, big-endian,
   of ``sha256(<endpoint URL, UTF-8, without a trailing '/'> + b"\\n" + key)``.
3. The item goes to the endpoint with the highest score (:func:`choose`); equal scores, which
   do not happen in practice, go to the smaller URL.

Adding an endpoint to N moves only the keys the new one wins, about 1/(N+1) of them, all to the
new endpoint; removing one moves only its own keys. Everyone who applies the rule to the same
endpoint list agrees, with no shared state. Routing by the item string is a proxy for routing by
content (the pod's own cache key is the sha256 of the bytes): an item sent once as a URL and once
as a data: URI is still served correctly, it may just miss the cache once; a client that sends
``content_hash`` gets affinity by content.
"""

from __future__ import annotations

import hashlib
from typing import Any, Mapping, Sequence

__all__ = ["affinity_key", "choose", "item_source", "score"]


def item_source(item: Any) -> tuple[str, str | None]:
    """An /encode item's (string, content_hash): a plain string, or an object with ``url``."""
    if isinstance(item, Mapping):
        content_hash = item.get("content_hash")
        return str(item.get("url", "")), content_hash.strip().lower() if isinstance(content_hash, str) else None
    return str(item), None


def affinity_key(source: str, content_hash: str | None = None) -> bytes:
    """The item's affinity key (rule 1)."""
    if content_hash is not None and content_hash.startswith("sha256:") and len(content_hash) == 71:
        try:
            return bytes.fromhex(content_hash[7:])
        except ValueError:
            pass  # malformed: the pod refuses it anyway; route it by its string
    return hashlib.sha256(b"source:" + source.strip().encode("utf-8", "surrogatepass")).digest()


def score(endpoint: str, key: bytes) -> int:
    """``endpoint``'s score for ``key`` (rule 2)."""
    return int.from_bytes(hashlib.sha256(endpoint.rstrip("/").encode() + b"\n" + key).digest()[:8], "big")


def choose(key: bytes, endpoints: Sequence[str]) -> int:
    """Index in ``endpoints`` of the one that gets ``key`` (rule 3)."""
    if not endpoints:
        raise ValueError("no endpoints to choose from")
    return max(range(len(endpoints)), key=lambda i: (score(endpoints[i], key), _reverse(endpoints[i].rstrip("/"))))


def _reverse(text: str) -> tuple[int, ...]:
    """Sorts the smaller string last, so ``max`` picks it on equal scores."""
    return tuple(-ord(c) for c in text) + (0,)
