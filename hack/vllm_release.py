"""Load vLLM 0.34.0's own source files, offline, without importing vllm (tests only).

Importing vllm pulls its whole GPU stack and pins torch and transformers releases other than the
project's, so this executes the release's *real source files* under their real module names
(the loader of hack/sglang_release.py): imports of other vllm modules become the few stand-ins
handed in below, or stand-ins that fail loudly when used; every other import runs for real. A
definition the harness asks for that the release no longer has fails loudly.

What runs is the release's code, unmodified:

- ``vllm/multimodal/hasher.py`` (``MultiModalHasher``), ``multimodal/media/base.py``
  (``MediaWithBytes``), ``multimodal/image.py`` and ``multimodal/media/image.py``
  (``ImageMediaIO.load_bytes``: how the OpenAI server decodes an image and what it hashes), and
  ``ProcessorInputs.get_mm_hashes`` of ``multimodal/processing/inputs.py`` (the uuid rule and
  the hash factors);
- ``config/ec_transfer.py`` (``ECTransferConfig``), ``distributed/ec_transfer/ec_connector/``
  ``base.py``, ``factory.py``, ``example_connector.py`` (``ECExampleConnector``) and
  ``ec_transfer_state.py``, and ``v1/worker/gpu/ec_connector.py`` (``ActiveECConnector``, the
  model runner's call order around the encoder).

Stand-ins (the release's real objects need CUDA or the whole engine): ``vllm.logger``,
``vllm.envs`` (only the defaults used here), ``SchedulerOutput``/``ECConnectorOutput``/
``ModelRunnerOutput`` records, ``gpu_sync_allowed`` (a CUDA sync guard: a no-op on CPU) and
``vllm.platforms.current_platform``, which on a CPU host is vLLM's ``CpuPlatform``
(``device_type`` "cpu", not CUDA-alike): the example connector then loads onto "cpu".
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sglang_release import Missing, _packages, class_from_methods, load_module  # noqa: E402

VERSION = "0.34.0"
SKIP = ("vllm",)

PACKAGES = ["vllm", "vllm.multimodal", "vllm.multimodal.media", "vllm.multimodal.processing", "vllm.config",
            "vllm.distributed", "vllm.distributed.ec_transfer", "vllm.distributed.ec_transfer.ec_connector",
            "vllm.v1", "vllm.v1.core", "vllm.v1.core.sched", "vllm.v1.worker", "vllm.v1.worker.gpu", "vllm.utils"]


def init_logger(name: str) -> logging.Logger:
    """vllm.logger.init_logger's stand-in (a standard logger of that name)."""
    return logging.getLogger(name)


@dataclass
class SchedulerOutput:
    """Record stand-in: the fields the EC path reads."""

    ec_connector_metadata: Any = None
    finished_req_ids: set[str] = field(default_factory=set)


@dataclass
class ECConnectorOutput:
    """Record stand-in (v1/outputs.py has the same four fields)."""

    finished_sending: set[str] | None = None
    finished_recving: set[str] | None = None
    ec_connector_stats: Any = None
    ec_connector_worker_meta: Any = None


class ModelRunnerOutput:
    """Record stand-in."""

    @staticmethod
    def with_ec_conn_output_only(output: Any) -> Any:
        return output


@dataclass
class Release:
    """The loaded modules."""

    site: Path
    hasher: types.ModuleType
    media_base: types.ModuleType
    image_io: types.ModuleType
    get_mm_hashes: Any
    ec_transfer_config: type
    base: types.ModuleType | None = None
    factory: types.ModuleType | None = None
    example: types.ModuleType | None = None
    state: types.ModuleType | None = None
    runner: types.ModuleType | None = None
    notes: list[str] = field(default_factory=list)


def _load(name: str, site: Path, provided: dict[str, Any], only: list[str] | None = None) -> types.ModuleType:
    path = site / (name.replace(".", "/") + ".py")
    if not path.is_file():
        raise SystemExit(f"vllm {VERSION} has no {path.relative_to(site)}: the harness needs updating")
    return load_module(name, path, provided, only=only, skip=SKIP)


def _envs() -> types.SimpleNamespace:
    # vllm/envs.py defaults of the two limits the loaded image code reads.
    return types.SimpleNamespace(VLLM_MAX_IMAGE_PIXELS=178_956_970, VLLM_MAX_MEDIA_REQUEST_DECODE_BYTES=0)


def load_release(site: Path) -> Release:
    """vLLM's hashing, image decoding and EC connector code from the unpacked wheel at ``site``."""
    import safetensors.torch  # noqa: F401 - example_connector.py reaches it as safetensors.torch

    _packages(PACKAGES)
    envs = _envs()
    sys.modules["vllm.envs"] = envs  # type: ignore[assignment]
    common = {"init_logger": init_logger, "envs": envs}
    media_base = _load("vllm.multimodal.media.base", site, common, only=["_T", "MediaWithBytes", "MediaDecodedBudget"])
    image = _load("vllm.multimodal.image", site, common)
    image_io = _load("vllm.multimodal.media.image", site,
                     {**common, "convert_image_mode": image.convert_image_mode, "normalize_image": image.normalize_image,
                      "open_image": image.open_image, "MediaDecodedBudget": media_base.MediaDecodedBudget,
                      "MediaIO": _media_io_base(), "MediaWithBytes": media_base.MediaWithBytes},
                     only=["ImageMediaIO"])
    hasher = _load("vllm.multimodal.hasher", site, {**common, "MMHasherAlgorithm": str, "MediaWithBytes": media_base.MediaWithBytes})
    inputs_path = site / "vllm/multimodal/processing/inputs.py"
    scoped = load_module("vllm.multimodal.processing.inputs", inputs_path, {}, only=["_HF_MODALITY_PROCESSOR_KWARGS"], skip=SKIP)
    namespace = {"MultiModalHasher": hasher.MultiModalHasher, "_HF_MODALITY_PROCESSOR_KWARGS": scoped._HF_MODALITY_PROCESSOR_KWARGS,
                 "MMHasherAlgorithm": str, "MultiModalHashes": dict}
    inputs_cls = class_from_methods(inputs_path, "ProcessorInputs", ["get_mm_hashes"], namespace, "ProcessorInputsHashes")
    ec_config = _load("vllm.config.ec_transfer", site, {"config": dataclasses.dataclass, "CompileFactors": dict},
                      only=["ECProducer", "ECConsumer", "ECRole", "ECTransferConfig"])
    return Release(site, hasher, media_base, image_io, inputs_cls.get_mm_hashes, ec_config.ECTransferConfig)


def _media_io_base() -> type:
    class MediaIO:  # the abstract base of media/base.py; ImageMediaIO only calls its __init__
        def __init__(self) -> None:
            pass

        def __class_getitem__(cls, item: Any) -> type:
            return cls

    return MediaIO


def load_connectors(release: Release) -> Release:
    """The EC connector modules, registered under their real names so the factory imports them."""
    site = release.site
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = types.SimpleNamespace(  # type: ignore[attr-defined]
        device_type="cpu", is_cuda_alike=lambda: False, current_device=lambda: 0)
    sys.modules["vllm.platforms"] = platforms
    records = {"init_logger": init_logger, "SchedulerOutput": SchedulerOutput, "ECConnectorOutput": ECConnectorOutput,
               "ModelRunnerOutput": ModelRunnerOutput, "EMPTY_MODEL_RUNNER_OUTPUT": None,
               "gpu_sync_allowed": contextlib.nullcontext, "is_list_of": lambda v, t: isinstance(v, list) and all(isinstance(x, t) for x in v)}
    base = _load("vllm.distributed.ec_transfer.ec_connector.base", site, records)
    with_base = {**records, "ECConnectorBase": base.ECConnectorBase, "ECConnectorRole": base.ECConnectorRole,
                 "ECConnectorMetadata": base.ECConnectorMetadata}
    factory = _load("vllm.distributed.ec_transfer.ec_connector.factory", site, with_base)
    utils = _load("vllm.distributed.ec_transfer.ec_connector.utils", site, records,
                  only=["logger", "PlaceholderMetadataResolver", "collect_ec_item_metadata"])
    example = _load("vllm.distributed.ec_transfer.ec_connector.example_connector", site,
                    {**with_base, "PlaceholderMetadataResolver": utils.PlaceholderMetadataResolver,
                     "collect_ec_item_metadata": utils.collect_ec_item_metadata, "VllmConfig": Missing("VllmConfig")})
    state = _load("vllm.distributed.ec_transfer.ec_transfer_state", site,
                  {**with_base, "ECConnectorFactory": factory.ECConnectorFactory})
    transfer_pkg = sys.modules["vllm.distributed.ec_transfer"]
    transfer_pkg.get_ec_transfer = state.get_ec_transfer  # type: ignore[attr-defined]
    transfer_pkg.has_ec_transfer = state.has_ec_transfer  # type: ignore[attr-defined]
    runner = _load("vllm.v1.worker.gpu.ec_connector", site,
                   {**with_base, "get_ec_transfer": state.get_ec_transfer, "has_ec_transfer": state.has_ec_transfer,
                    "VllmConfig": Missing("VllmConfig")})
    release.base, release.factory, release.example, release.state, release.runner = base, factory, example, state, runner
    release.notes.append("current_platform is a CPU platform stand-in (device 'cpu'); CUDA-only paths do not run")
    return release


def vllm_config(release: Release, **ec: Any) -> Any:
    """A VllmConfig stand-in carrying the release's real ``ECTransferConfig(**ec)``."""
    return types.SimpleNamespace(ec_transfer_config=release.ec_transfer_config(**ec),
                                 model_config=types.SimpleNamespace(model="tiny", is_encoder_decoder=False))
