"""Whether this pod can serve a checkpoint, decided from its files before anything loads.

``encoder-pod serve`` asks :func:`refusal` first: a checkpoint that cannot be served (an
architecture transformers does not know, one that exists only as remote code, a model class
without feature methods, a processor that needs torchvision) stops the process at once with exit
code 3 and a message naming the model type and the reason, as a missing model path does, so that
Kubernetes restarts it visibly and the operator reports ``ModelLoadFailed`` quoting the message.
Otherwise the pod would start and fail only once its background load ran (after the imports and
the weights; behind a data-parallel front, in every worker).

Reads config.json and the processor files; imports transformers (its tables of known model types,
model classes and image processors), never torch weights.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from encoder_pod.models.checkpoint import read_config
from encoder_pod.models.family import FamilyRegistry

FEATURE_METHODS = ("get_image_features", "get_video_features", "get_audio_features")
"""The methods a model class computes the language model's multimodal rows with (the generic path)."""
LANGUAGE_MODEL_TABLES = ("MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES", "MODEL_FOR_MULTIMODAL_LM_MAPPING_NAMES",
                         "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES")
"""transformers' auto tables of models whose multimodal rows feed a language model."""


class CheckpointRefused(ValueError):
    """The checkpoint cannot be served by this pod; the message names its model type and why."""

    def __init__(self, model_type: str, reason: str) -> None:
        super().__init__(f"cannot serve model_type {model_type!r}: {reason}")
        self.model_type = model_type
        self.reason = reason


def model_class(config: Mapping[str, Any]) -> type | None:
    """The transformers class of a whole checkpoint: the one config.json names, else its model type's.

    Among the classes of the model type (image-text-to-text, multimodal LM, speech seq2seq, the
    base model), the first that has a feature method.
    """
    import transformers
    from transformers.models.auto import modeling_auto

    candidates = [name for name in config.get("architectures") or [] if isinstance(name, str)]
    model_type = str(config.get("model_type"))
    for table in (*LANGUAGE_MODEL_TABLES, "MODEL_MAPPING_NAMES"):
        named = getattr(modeling_auto, table, {}).get(model_type)
        candidates.extend([named] if isinstance(named, str) else list(named or ()))
    for name in dict.fromkeys(candidates):
        cls = getattr(transformers, name, None) if hasattr(transformers, name) else None
        if cls is not None and any(hasattr(cls, method) for method in FEATURE_METHODS):
            return cls
    return None


def _image_processor_needs_torchvision(model_dir: Path, model_type: str) -> str | None:
    """The image processor's name when only a torchvision variant of it exists, else None."""
    import transformers
    from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES

    variants = IMAGE_PROCESSOR_MAPPING_NAMES.get(model_type)
    has_pil = isinstance(variants, dict) and "pil" in variants
    file = Path(model_dir) / "preprocessor_config.json"
    content = json.loads(file.read_text()) if file.is_file() else {}
    named = content.get("image_processor_type") if isinstance(content, dict) else None
    if isinstance(named, str) and named:
        base = named.removesuffix("Pil").removesuffix("Fast")
        return None if hasattr(transformers, base + "Pil") or has_pil else base
    if isinstance(variants, dict) and variants and not has_pil:
        return str(variants.get("torchvision"))
    return None


def refusal(model_dir: Path, registry: FamilyRegistry) -> CheckpointRefused | None:
    """Why the checkpoint in ``model_dir`` cannot be served (None when it can)."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    config = read_config(model_dir)
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        return CheckpointRefused(str(model_type), "config.json names no model_type")
    if registry.recognise_all(model_dir, config):
        return None  # a hand-written adapter's (its own loading checks the rest)
    if model_type not in CONFIG_MAPPING_NAMES:
        auto_map = config.get("auto_map")
        if auto_map:
            named = ", ".join(sorted(auto_map)) if isinstance(auto_map, dict) else str(auto_map)
            return CheckpointRefused(
                model_type,
                f"the model exists only as remote code (config.json auto_map: {named}); this pod runs no "
                f"remote code, and transformers {transformers.__version__} has no such model type",
            )
        return CheckpointRefused(model_type, f"transformers {transformers.__version__} does not know this model type")
    cls = model_class(config)
    if cls is None:
        return CheckpointRefused(
            model_type,
            f"no transformers class of it ({', '.join(config.get('architectures') or []) or 'none named'}) "
            f"has {' / '.join(FEATURE_METHODS)}, the rows a language model consumes",
        )
    torchvision = _image_processor_needs_torchvision(Path(model_dir), model_type)
    if torchvision is not None:
        return CheckpointRefused(
            model_type, f"its image processor {torchvision} needs torchvision, which this pod does not install"
        )
    if not hasattr(cls, "get_image_features"):
        return CheckpointRefused(
            model_type, f"{cls.__name__} has only {' / '.join(m for m in FEATURE_METHODS if hasattr(cls, m))}; "
            "the generic path serves get_image_features (audio and video need a hand-written adapter)",
        )
    return None  # the generic path serves it
