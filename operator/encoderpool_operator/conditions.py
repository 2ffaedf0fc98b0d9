"""Conditions, timestamps, status patches and Events: the generic half of the pool's status.

Pure functions; ``status.py`` decides what the conditions say.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

READY, PROGRESSING, DEGRADED, SPEC_APPLIED = "Ready", "Progressing", "Degraded", "SpecApplied"


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to post on the pool."""

    type: str  # Normal | Warning
    reason: str
    message: str


def rfc3339(moment: datetime) -> str:
    """A timestamp as Kubernetes writes it (UTC, seconds, 'Z')."""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: Any) -> datetime | None:
    """An RFC 3339 timestamp from the API server, or None."""
    if not value:
        return None
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).astimezone(timezone.utc)


def condition(kind: str, true: bool, reason: str, message: str, generation: int) -> dict[str, Any]:
    """A metav1.Condition without its transition time (see :func:`stamp`)."""
    return {
        "type": kind,
        "status": "True" if true else "False",
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
    }


def stamp(conditions: list[dict[str, Any]], previous: dict[str, Any], now: datetime) -> list[dict[str, Any]]:
    """Set lastTransitionTime: kept from the previous condition of that type unless its status flipped."""
    before = {c.get("type"): c for c in previous.get("conditions") or []}
    out = []
    for cond in conditions:
        old = before.get(cond["type"]) or {}
        kept = old.get("lastTransitionTime") if old.get("status") == cond["status"] else None
        out.append({**cond, "lastTransitionTime": kept or rfc3339(now)})
    return out


def merge_patch(previous: dict[str, Any], new: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON merge patch body turning ``previous`` into ``new``; None when nothing changed."""
    if previous == new:
        return None
    # A merge patch removes a key only when told so with null.
    return {"status": {**{k: None for k in previous if k not in new}, **new}}


def transitions(previous: dict[str, Any], new: dict[str, Any], warnings: frozenset[str],
                quiet: frozenset[str]) -> list[Event]:
    """Events for a change of the pool's top-level reason (one per transition, never per resync)."""
    reason = str(new.get("reason") or "Unknown")
    if previous.get("reason") == reason or reason in quiet:
        return []
    kind = "Warning" if reason in warnings else "Normal"
    return [Event(kind, reason, str(new.get("message") or ""))]
