"""The serving contract every adapter implements: measure / preprocess / forward / postprocess / warmup.

The split lets the batch worker run CPU preprocessing of the next batch while this batch's
forward runs. An adapter never sees HTTP, queues or transports: it turns decoded media into
embeddings and says how many output rows each item produced.

:class:`EncoderAdapter` is the Protocol the runtime, the batcher and the media decoders use;
:class:`BaseAdapter` is the base class of the families' adapters (strict loading, slicing,
warmup, /server_info facts). Which checkpoints a family serves and how its test checkpoints are
written is not part of serving: that is the family's (``encoder_pod.models.family``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, Sequence

import torch

from encoder_pod.errors import SliceMismatch
from encoder_pod.facts import ModelFacts, ModelIdentity
from encoder_pod.modality import Modality
from encoder_pod.models.checkpoint import Checkpoint, file_facts, read_config
from encoder_pod.models.hub import hub_origin
from encoder_pod.models.parts import parameter_count
from encoder_pod.models.weights import ReadReport
from encoder_pod.settings import ModelSettings

__all__ = [
    "BaseAdapter",
    "EncodedPart",
    "EncoderAdapter",
    "MediaItem",
    "PreparedBatch",
    "VideoClip",
    "check_loading_info",
    "read_config",
    "slice_output",
    "warm_up",
]


_TYPED_FACTS = frozenset({"family", "modalities", "dtype", "hidden_size"})
"""The facts of :meth:`BaseAdapter.info` that :class:`ModelFacts` carries as fields."""


@dataclass(frozen=True)
class VideoClip:
    """Decoded video frames, (T, H, W, 3) uint8 RGB, sampled at ``fps``."""

    frames: Any
    fps: float
    """Sampled frames per second of source time (frames / duration)."""
    indices: tuple[int, ...] | None = None
    """Position of each frame in the source (presentation order); None when unknown."""
    source_fps: float | None = None
    """The source's own frame rate; None when unknown."""

    def timestamps(self) -> list[float]:
        """Seconds of source time of each frame (from the source positions when known)."""
        if self.indices is not None and self.source_fps:
            return [index / self.source_fps for index in self.indices]
        return [i / self.fps for i in range(len(self.frames))]


@dataclass(frozen=True)
class MediaItem:
    """One decoded media item.

    ``data`` is a PIL RGB image (IMAGE), a float32 mono waveform at the adapter's sample rate
    (AUDIO, numpy 1-D), or a :class:`VideoClip` (VIDEO).
    """

    modality: Modality
    data: Any


@dataclass
class PreparedBatch:
    """Model inputs for one batch plus the slicing plan promised by preprocessing."""

    inputs: dict[str, Any]
    item_tokens: list[list[int]]
    """Per request, per item: output rows the forward will produce for that item."""
    item_grids: list[list[list[int]]] = field(default_factory=list)
    """Per request, per item: the item's grid (t, h, w), tile count or feature length."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Batch-level facts the forward needs (not sent anywhere)."""
    request_extras: list[dict[str, Any]] = field(default_factory=list)
    """Per request: facts the prefill side reads besides rows and grids (:attr:`EncodedPart.extras`)."""

    @property
    def total_tokens(self) -> int:
        """Rows the forward must produce for the whole batch."""
        return sum(sum(tokens) for tokens in self.item_tokens)


@dataclass
class EncodedPart:
    """One request's share of a batch output."""

    embedding: torch.Tensor
    """(rows, hidden), contiguous, on CPU."""
    item_tokens: list[int]
    item_grids: list[list[int]]
    extras: dict[str, Any] = field(default_factory=dict)
    """Facts the prefill side reads besides rows and grids: ``second_per_grid_ts`` (one float per
    video item: Qwen2.5-VL, Qwen2.5-Omni, Qwen3-Omni) or ``video_timestamps`` (one list of seconds
    per video item, one per temporal grid: Qwen3-VL, Qwen3.5). Empty for everything else."""


class EncoderAdapter(Protocol):
    """What serving needs of a loaded encoder (the runtime, the batcher, the media decoders)."""

    @property
    def name(self) -> str:
        """The family's name, e.g. ``qwen2_vl`` (/server_info, logs)."""
        ...

    @property
    def modalities(self) -> frozenset[Modality]:
        """The modalities this model encodes."""
        ...

    def measure(self, item: MediaItem) -> int:
        """Validate one decoded item and return the output rows it will produce.

        Raises :class:`~encoder_pod.errors.MediaError` with a human reason when the model cannot
        take the item (400 naming it); anything else it raises is a fault (500).
        """
        ...

    def preprocess(self, requests: Sequence[Sequence[MediaItem]]) -> PreparedBatch:
        """ONE processor call for every item of every request in the batch (CPU work)."""
        ...

    def forward(self, batch: PreparedBatch) -> torch.Tensor:
        """ONE forward for the batch; returns (total rows, hidden) with rows in item order."""
        ...

    def postprocess(self, output: torch.Tensor, batch: PreparedBatch) -> list[EncodedPart]:
        """Slice the output back per request by output rows, never by item count."""
        ...

    def warmup(self) -> None:
        """Run one real encode so the first request pays no lazy initialisation."""
        ...

    def health_item(self, modality: Modality) -> MediaItem:
        """A tiny valid item (a 32x32 image, 10 ms of audio) for health encodes."""
        ...

    @property
    def sample_rate(self) -> int | None:
        """Audio sample rate the model expects (decoders resample to it), or None."""
        ...

    @property
    def hidden_size(self) -> int:
        """Width of one output row."""
        ...

    def facts(self) -> ModelFacts:
        """What serving and /server_info know of the model (typed; the family's own facts as details)."""
        ...

    def identity(self) -> ModelIdentity:
        """What determines the rows this model computes (the embedding cache's namespace hashes it)."""
        ...


class BaseAdapter(ABC):
    """Base of the families' adapters: loads the explicit HF class and its processor from a checkpoint.

    Implements :class:`EncoderAdapter`; subclasses provide ``load``, ``measure``, ``preprocess``,
    ``forward``, ``health_item`` and ``hidden_size``.
    """

    name: ClassVar[str]
    """The family's name, e.g. ``qwen2_vl``."""
    modalities: ClassVar[frozenset[Modality]]

    def __init__(self, checkpoint: Checkpoint, settings: ModelSettings, device: torch.device, dtype: torch.dtype):
        self.checkpoint = checkpoint
        self.model_dir = Path(checkpoint.path)
        self.settings = settings
        self.device = device
        self.dtype = dtype
        self.weights: ReadReport | None = None
        """What loading read from the checkpoint (set by ``load``)."""

    @abstractmethod
    def load(self) -> None:
        """Load the encoder's weights strictly (raise on missing or unexpected ones); set :attr:`weights`."""

    @classmethod
    def weight_keys(cls, checkpoint: Checkpoint, keys: Sequence[str]) -> list[str]:
        """Which of the checkpoint's tensors ``load`` reads (a tower checkpoint: all of them)."""
        return list(keys)

    # --- per item, before batching ---------------------------------------------------------
    @abstractmethod
    def measure(self, item: MediaItem) -> int:
        """As :meth:`EncoderAdapter.measure`."""

    # --- per batch --------------------------------------------------------------------------
    @abstractmethod
    def preprocess(self, requests: Sequence[Sequence[MediaItem]]) -> PreparedBatch:
        """ONE processor call for every item of every request in the batch (CPU work)."""

    @abstractmethod
    def forward(self, batch: PreparedBatch) -> torch.Tensor:
        """ONE forward for the batch; returns (total rows, hidden) with rows in item order."""

    def postprocess(self, output: torch.Tensor, batch: PreparedBatch) -> list[EncodedPart]:
        """Slice the output back per request by output rows, never by item count."""
        return slice_output(output, batch)

    def warmup(self) -> None:
        """Run one real encode so the first request pays no lazy initialisation."""
        warm_up(self)

    @abstractmethod
    def health_item(self, modality: Modality) -> MediaItem:
        """A tiny valid item (a 32x32 image, 10 ms of audio) for health encodes."""

    # --- facts for /server_info and the media decoders --------------------------------------
    @property
    def sample_rate(self) -> int | None:
        """Audio sample rate the model expects, or None for vision-only models."""
        return None

    @property
    @abstractmethod
    def hidden_size(self) -> int:
        """Width of one output row."""

    def encoder_modules(self) -> list[torch.nn.Module | torch.nn.Parameter]:
        """The loaded modules whose parameters are the served encoder (tower, projector ...)."""
        return [module for module in (getattr(self, "model", None),) if module is not None]

    def embedding_layout(self) -> list[str]:
        """What one output row holds, left to right (``merger`` then ``deepstack_<k>`` for Qwen3-VL)."""
        return ["rows"]

    def identity(self) -> ModelIdentity:
        """As :meth:`EncoderAdapter.identity`: the family, the checkpoint and its files, dtype and
        device. Reads the checkpoint's small files: call once per load."""
        return ModelIdentity(
            family=self.name,
            architecture=self.checkpoint.architecture,
            layout=self.checkpoint.layout.value,
            files=file_facts(self.model_dir),
            dtype=str(self.dtype).removeprefix("torch."),
            device=str(self.device),
        )

    def facts(self) -> ModelFacts:
        """As :meth:`EncoderAdapter.facts`: the typed facts, and every other fact of :meth:`info` as details."""
        return ModelFacts(
            family=self.name,
            modalities=tuple(sorted(self.modalities, key=lambda m: m.value)),
            dtype=str(self.dtype).removeprefix("torch."),
            hidden_size=self.hidden_size,
            details={k: v for k, v in self.info().items() if k not in _TYPED_FACTS},
        )

    def info(self) -> dict[str, Any]:
        """Every fact /server_info shows about the model (subclasses add their family's)."""
        weights = self.weights.as_dict() if self.weights is not None else None
        return {
            "arch": self.name,
            "family": self.name,
            "model_dir": str(self.model_dir),
            "hub": hub_origin(self.model_dir),
            "layout": self.checkpoint.layout.value,
            "architecture": self.checkpoint.architecture,
            "modalities": sorted(m.value for m in self.modalities),
            "hidden_size": self.hidden_size,
            "output_width": self.hidden_size,
            "embedding_layout": self.embedding_layout(),
            "sample_rate": self.sample_rate,
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            "tower_parameters": parameter_count(*self.encoder_modules()),
            "weights_bytes_loaded": weights["bytes_read"] if weights else None,
            "weights": weights,
        }


def warm_up(adapter: EncoderAdapter) -> None:
    """One real encode of the adapter's health item, through its own four stages."""
    item = adapter.health_item(sorted(adapter.modalities, key=lambda m: m.value)[0])
    adapter.measure(item)
    batch = adapter.preprocess([[item]])
    adapter.postprocess(adapter.forward(batch), batch)


def slice_output(output: torch.Tensor, batch: PreparedBatch) -> list[EncodedPart]:
    """One :class:`EncodedPart` per request, cut by output rows; :class:`SliceMismatch` if they do not add up."""
    if output.shape[0] != batch.total_tokens:
        raise SliceMismatch(expected=batch.total_tokens, produced=int(output.shape[0]))
    output = output.detach().to("cpu")
    parts: list[EncodedPart] = []
    start = 0
    grids = batch.item_grids or [[[] for _ in tokens] for tokens in batch.item_tokens]
    extras = batch.request_extras or [{} for _ in batch.item_tokens]
    for tokens, item_grids, extra in zip(batch.item_tokens, grids, extras):
        rows = sum(tokens)
        parts.append(EncodedPart(output[start : start + rows].contiguous(), list(tokens), item_grids, dict(extra)))
        start += rows
    return parts


def check_loading_info(name: str, info: dict[str, list[str]]) -> None:
    """Fail loudly on missing or unexpected weights (AutoModel-style silent random init is a bug)."""
    problems = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    if problems:
        detail = "; ".join(f"{k}: {sorted(map(str, v))[:8]}" for k, v in problems.items())
        raise RuntimeError(f"checkpoint does not match {name}: {detail}")
