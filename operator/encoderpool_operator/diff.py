"""Is a child already as the operator wants it? (pure functions)

A child needs no write when the live object carries the hash of the manifest we would apply
(nothing in our manifest changed since the last apply) and still holds every value of that
manifest (nobody edited a field we own). Fields the API server filled in or other managers own
are ignored, as server-side apply itself ignores them.
"""

from __future__ import annotations

from typing import Any

from encoderpool_operator import names
from encoderpool_operator.specmodels import parse_quantity

ZERO_VALUES: tuple[Any, ...] = (None, False, 0, "", {}, [])


def _same_scalar(live: Any, want: Any) -> bool:
    if live == want or str(live) == str(want):
        return True
    try:  # quantities come back canonical: 2147483648 -> "2Gi", "1000m" -> "1"
        return parse_quantity(live) == parse_quantity(want)
    except (TypeError, ValueError):
        return False


def contains(live: Any, want: Any) -> bool:
    """Whether ``live`` holds every value of ``want`` (dicts by key, lists of objects by any match).

    A key missing from ``live`` equals a zero value in ``want``: the API server omits false, 0 and
    empty values of optional fields.
    """
    if isinstance(want, dict):
        if not isinstance(live, dict):
            return live is None and not want
        return all(contains(live[k], v) if k in live else v in ZERO_VALUES for k, v in want.items())
    if isinstance(want, list):
        if not isinstance(live, list):
            return live is None and not want
        if all(isinstance(item, dict) for item in want):
            return all(any(contains(item_live, item) for item_live in live if isinstance(item_live, dict))
                       for item in want)
        return len(live) == len(want) and all(_same_scalar(a, b) for a, b in zip(live, want))
    return _same_scalar(live, want)


def first_difference(live: Any, want: Any, path: str = "") -> str | None:
    """The first path where ``live`` does not hold ``want`` (for logs), or None."""
    if isinstance(want, dict) and isinstance(live, dict):
        for key, value in want.items():
            if key not in live:
                if value not in ZERO_VALUES:
                    return f"{path}.{key}"
                continue
            found = first_difference(live[key], value, f"{path}.{key}")
            if found:
                return found
        return None
    if isinstance(want, list) and isinstance(live, list) and all(isinstance(i, dict) for i in want):
        for i, item in enumerate(want):
            if not any(contains(other, item) for other in live if isinstance(other, dict)):
                match = live[i] if i < len(live) else None
                return first_difference(match, item, f"{path}[{i}]") or f"{path}[{i}]"
        return None
    return None if contains(live, want) else (path or ".")


def applied_hash(obj: dict[str, Any] | None) -> str | None:
    """The manifest hash a live child carries, if any."""
    return ((obj or {}).get("metadata") or {}).get("annotations", {}).get(names.MANIFEST_HASH_ANNOTATION)


def up_to_date(live: dict[str, Any] | None, want: dict[str, Any], ignore: tuple[tuple[str, ...], ...] = ()) -> bool:
    """Whether ``live`` needs no apply of ``want``. ``ignore``: paths the cluster is known to drop."""
    if live is None or applied_hash(live) != applied_hash(want):
        return False
    return contains(live, without(want, ignore))


def without(obj: dict[str, Any], paths: tuple[tuple[str, ...], ...]) -> dict[str, Any]:
    """A copy of ``obj`` without the given key paths."""
    if not paths:
        return obj
    out = dict(obj)
    for path in paths:
        node: dict[str, Any] = out
        for key in path[:-1]:
            child = node.get(key)
            if not isinstance(child, dict):
                break
            node[key] = dict(child)
            node = node[key]
        else:
            node.pop(path[-1], None)
    return out
