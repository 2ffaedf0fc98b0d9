"""What a model replica reports about itself, as typed fields (no torch here).

The runtime builds a :class:`ReplicaReport` from its adapter, batcher and cache; a data-parallel
worker sends it to its front in every heartbeat, and the front, the faces and ``/server_info``
read its attributes, never the keys of a display dict. ``/server_info`` renders each with its
``to_json`` (the same JSON as before these types existed).

An adapter's family-specific facts (its checkpoint files, weights read, audio windows, deepstack
layout ...) are shown and never read by code: they stay a JSON mapping, :attr:`ModelFacts.details`.

What *determines* a model's rows is declared apart, by the adapter: :class:`ModelIdentity`, which
the embedding cache's namespace hashes. A fact shown in ``/server_info`` changes no cache key.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping

from encoder_pod.modality import Modality


@dataclass(frozen=True)
class TensorParallelFacts:
    """The tensor-parallel group one rank 0 leads."""

    tp_size: int
    label: str
    follower_pids: tuple[int, ...]
    steps: int
    """Forwards the group has dispatched."""

    def to_json(self) -> dict[str, Any]:
        """As ``/server_info`` shows it."""
        return {"tp_size": self.tp_size, "label": self.label, "follower_pids": list(self.follower_pids), "steps": self.steps}


@dataclass(frozen=True)
class ModelFacts:
    """The loaded model: what serving reads, plus the family's display-only facts."""

    family: str
    """The family's name, e.g. ``qwen2_vl``."""
    modalities: tuple[Modality, ...]
    """What it encodes, in name order."""
    dtype: str
    """``bfloat16``, ``float32`` ..."""
    hidden_size: int
    """Width of one output row."""
    details: Mapping[str, Any]
    """Every other fact ``/server_info`` shows (JSON values; read by no code)."""
    tensor_parallel: TensorParallelFacts | None = None
    """Its group, when the model is split over several ranks."""

    def to_json(self) -> dict[str, Any]:
        """``/server_info``'s ``model``."""
        out = {
            **self.details,
            "family": self.family,
            "modalities": [m.value for m in self.modalities],
            "dtype": self.dtype,
            "hidden_size": self.hidden_size,
        }
        if self.tensor_parallel is not None:
            out["tensor_parallel"] = self.tensor_parallel.to_json()
        return out


FileFact = tuple[str, str] | tuple[str, int, int]
"""One checkpoint file: (relative path, sha256 hex) when small, (relative path, size, mtime ns) when large."""


@dataclass(frozen=True)
class ModelIdentity:
    """What determines the rows a loaded model computes for an item (the adapter declares it).

    Two models with equal identities (and equal pod-wide facts: tensor-parallel size, video
    sampling; ``encoder_pod.cache.keys``) compute the same rows, so they may share cached rows.
    What the processor does is in the files (its config, the tokenizer's); no adapter setting
    changes rows today (``ENCODER_IMAGE_PROCESSOR_USE_GPU`` has one allowed value). A family whose
    rows come to depend on a setting declares it here, or its cached rows go stale.
    """

    family: str
    """The adapter (its code: slicing, layout of a row, how media become inputs)."""
    architecture: str | None
    """The checkpoint's transformers class (config.json ``architectures[0]``)."""
    layout: str
    """A tower saved alone, or read out of a whole checkpoint."""
    files: tuple[FileFact, ...]
    """Every file of the checkpoint: configs and processor files by content, weights by name, size, time."""
    dtype: str
    device: str
    """``cpu`` or ``cuda:N``: kernels, hence roundings, differ."""


@dataclass(frozen=True)
class CacheFacts:
    """One replica's embedding cache: budget, fill and counters."""

    enabled: bool
    budget_bytes: int
    bytes: int
    entries: int
    in_flight: int
    evictions: int
    refused_too_large: int
    hits: int
    misses: int
    single_flight_waits: int

    @property
    def fill(self) -> float:
        """Bytes held over the budget (0 without one)."""
        return round(self.bytes / self.budget_bytes, 4) if self.budget_bytes else 0.0

    def to_json(self) -> dict[str, Any]:
        """``/server_info``'s ``cache`` of one replica."""
        return {
            "enabled": self.enabled,
            "budget_bytes": self.budget_bytes,
            "bytes": self.bytes,
            "fill": self.fill,
            "entries": self.entries,
            "in_flight": self.in_flight,
            "evictions": self.evictions,
            "refused_too_large": self.refused_too_large,
            "hits": self.hits,
            "misses": self.misses,
            "single_flight_waits": self.single_flight_waits,
        }


@dataclass(frozen=True)
class ReplicaReport:
    """What one replica's heartbeat tells the data-parallel front (state and health travel beside it)."""

    queue_depth: int
    """Requests admitted and not yet in a batch."""
    inflight: int
    """Requests admitted and not yet answered."""
    model: ModelFacts | None
    """None until the model is loaded."""
    cache: CacheFacts

    def to_wire(self) -> dict[str, Any]:
        """Plain msgpack values (the inverse of :meth:`from_wire`)."""
        out = asdict(self)
        if self.model is not None:
            out["model"]["modalities"] = [m.value for m in self.model.modalities]
        return out

    @classmethod
    def from_wire(cls, raw: Any) -> "ReplicaReport":
        """The report of a Status's ``report`` field; ValueError or TypeError if malformed."""
        model = raw["model"]
        if model is not None:
            tp = model["tensor_parallel"]
            model = ModelFacts(
                family=model["family"],
                modalities=tuple(Modality(m) for m in model["modalities"]),
                dtype=model["dtype"],
                hidden_size=model["hidden_size"],
                details=dict(model["details"]),
                tensor_parallel=(
                    TensorParallelFacts(**{**tp, "follower_pids": tuple(tp["follower_pids"])}) if tp is not None else None
                ),
            )
        return cls(raw["queue_depth"], raw["inflight"], model, CacheFacts(**raw["cache"]))
