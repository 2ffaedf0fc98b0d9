"""Batch formation as a pure function: which waiting requests run together.

The policy, in order:

- **oldest first**: a new batch starts with the oldest waiting request, whatever its size, so
  nothing starves;
- **one modality** per batch; a modality that does not batch (video) runs **alone**;
- more requests of the batch's modality join in arrival order while the batch holds fewer than
  ``max_batch_size`` and their output rows fit the ``max_batch_tokens`` budget; one that does not
  fit is skipped (a later, smaller one may still join), so a request **larger than the budget runs
  alone**.

No clock, no queue, no metrics: the scheduler calls :func:`take_batch` with what is waiting and
applies the answer (the wait for more arrivals, ``MAX_WAIT_MS``, is the scheduler's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol, Sequence, TypeVar

from encoder_pod.modality import Modality
from encoder_pod.settings import BatchingSettings


class Batchable(Protocol):
    """What formation needs to know of a waiting request."""

    @property
    def modality(self) -> Modality:
        """Batches never mix modalities."""
        ...

    @property
    def tokens(self) -> int:
        """Output rows this request adds to a batch's budget."""
        ...


E = TypeVar("E", bound=Batchable)


@dataclass(frozen=True)
class BatchLimits:
    """The budget of one batch."""

    max_batch_size: int
    """Most requests per batch (ENCODER_MAX_BATCH_SIZE)."""
    max_batch_tokens: int
    """Most output rows per batch (ENCODER_MAX_BATCH_TOKENS); the first request may exceed it alone."""

    @classmethod
    def of(cls, settings: BatchingSettings) -> BatchLimits:
        """The limits the settings ask for."""
        return cls(settings.max_batch_size, settings.max_batch_tokens)


def take_batch(waiting: Iterable[E], limits: BatchLimits, started: Sequence[E] = ()) -> tuple[list[E], list[E]]:
    """(batch, still waiting) from ``waiting`` (oldest first), extending ``started`` if given.

    ``started`` is a batch already formed that waits for late arrivals (``MAX_WAIT_MS``): it is
    extended under the same rules, never reordered. Both lists keep arrival order.
    """
    rest = list(waiting)
    batch = list(started)
    if not batch:
        if not rest:
            return [], []
        batch.append(rest.pop(0))
    first = batch[0]
    if not first.modality.batchable:
        return batch, rest
    tokens = sum(e.tokens for e in batch)
    keep: list[E] = []
    for entry in rest:
        fits = entry.modality is first.modality and tokens + entry.tokens <= limits.max_batch_tokens
        if fits and len(batch) < limits.max_batch_size:
            batch.append(entry)
            tokens += entry.tokens
        else:
            keep.append(entry)
    return batch, keep
