"""When to form the next batch: late, when the model is about to need it (pure, no clock of its own).

A batch formed early holds only the requests waiting then; everything that arrives while it
waits for the model queues behind it. So the scheduler forms batch *k+1* while batch *k*'s forward
runs, but only at the last moment that still hides its preprocessing behind that forward:

    due = (when the model will be free) - (preprocessing estimate) x (1 + PREPROCESS_SLACK) - HANDOFF_S

Requests that arrive before ``due`` join it. When the forward's length is unknown (no forward
seen yet) the model is taken to be free only once it is: the batch forms then, without overlap.
When the preprocessing estimate exceeds the forward, ``due`` is already past when the forward
starts: preprocessing overlaps all of it (it pays most then). ``MAX_WAIT_MS`` only ever makes a
batch that is not full later: it is not committed before its oldest request waited that long.

The estimates are :class:`ServiceEstimate` lines fitted to what the stages took, per batch
token count, weighted to the recent past (the machine's load changes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

HANDOFF_S = 0.001
"""Seconds from committing a batch to its preprocessing starting, and from its end to the forward."""

PREPROCESS_SLACK = 0.25
"""Fraction of the preprocessing estimate added as margin (a late batch idles the model)."""


@dataclass
class ServiceEstimate:
    """Seconds a stage takes for a batch of ``tokens`` output rows: a least-squares line
    ``a + b * tokens`` over past batches, each older one weighted ``decay`` times less."""

    decay: float = 0.9
    """Weight kept by the history at each new observation (about 1/(1-decay) batches remembered)."""
    _sums: list[float] = field(default_factory=lambda: [0.0] * 5, init=False, repr=False)  # weight, x, y, x*x, x*y

    def observe(self, tokens: int, seconds: float) -> None:
        """Record one batch of ``tokens`` rows that took ``seconds``."""
        x, y = float(tokens), max(float(seconds), 0.0)
        self._sums = [s * self.decay + v for s, v in zip(self._sums, (1.0, x, y, x * x, x * y))]

    @property
    def known(self) -> bool:
        """True once a batch was observed."""
        return self._sums[0] > 0

    def predict(self, tokens: int) -> float:
        """Estimated seconds for a batch of ``tokens`` rows (0 before any observation)."""
        w, sx, sy, sxx, sxy = self._sums
        if w <= 0:
            return 0.0
        mx, my = sx / w, sy / w
        var = sxx / w - mx * mx
        if var <= (0.05 * mx) ** 2 + 1e-12:  # one batch size seen: proportional to rows
            return my * tokens / mx if mx > 0 else my
        slope = (sxy / w - mx * my) / var
        if slope <= 0:  # noise said more rows take less time: no trend
            return my
        return max(my + slope * (tokens - mx), 0.0)


def formation_due(
    *, model_free_at: float, preprocess_s: float, oldest_submitted: float, max_wait_s: float, full: bool
) -> float:
    """The monotonic time at which a candidate batch should be committed (``-inf``: at once).

    ``model_free_at``: when the forward in progress should end (``-inf`` when the model is idle,
    ``inf`` while a forward of unknown length runs); ``preprocess_s``: the estimate for this
    candidate; ``oldest_submitted``: when its oldest request joined the queue; ``full``: the
    candidate cannot grow (``MAX_BATCH_SIZE`` requests, or a modality that runs alone).
    """
    due = model_free_at - preprocess_s * (1 + PREPROCESS_SLACK) - HANDOFF_S
    if not full and max_wait_s > 0:
        due = max(due, oldest_submitted + max_wait_s)
    return due


@dataclass
class Pacing:
    """What one scheduler knows of its two stages' durations."""

    preprocess: ServiceEstimate = field(default_factory=ServiceEstimate)
    forward: ServiceEstimate = field(default_factory=ServiceEstimate)

    def forward_end(self, started: float, tokens: int) -> float:
        """When a forward of ``tokens`` rows begun at ``started`` should end (``inf`` before any was seen)."""
        return started + self.forward.predict(tokens) if self.forward.known else math.inf
