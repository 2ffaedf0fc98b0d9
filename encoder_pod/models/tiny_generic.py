"""Tiny random whole checkpoints of any transformers family, by shrinking its default config.

For the generic path's proof across families: no family code. The model type's default config is
shrunk *before* anything is built (depth to 2, widths to 64, heads to 4, vocabularies to
:data:`~encoder_pod.models.tiny_full.VOCAB_SIZE`; image sides to 8 patches, in the tower's
config and its image processor alike), counted on the meta device (a config that stays
large is refused, never allocated), then built with seeded weights and saved as the hub lays a
model out: sharded safetensors with an index, ``config.json`` last, and the family's own
processor (its PIL image processor with default settings, a byte tokenizer holding the special
tokens the processor names) saved by ``save_pretrained``.

A family that cannot be built this way raises :class:`TinyRefused` with the reason.
``python -m encoder_pod.models.tiny_generic ROOT TYPE...`` builds each type into ``ROOT/TYPE``
in this one process, freeing each model before the next, and prints one JSON line per type.
"""

from __future__ import annotations

import gc
import inspect
import json
import re
import sys
from pathlib import Path
from typing import Any, Iterator

import torch

from encoder_pod.models.servable import model_class
from encoder_pod.models.tiny_full import VOCAB_SIZE, byte_tokenizer, max_shard_size, randomize_scaled, seed_of
from encoder_pod.models.vision import save_atomically

MAX_PARAMETERS = 40_000_000
"""A shrunk config above this many parameters (on meta) is refused: its size is not the config's knobs."""

DEPTH = ("num_hidden_layers", "num_layers", "depth", "encoder_layers", "decoder_layers", "n_layers",
         "num_encoder_layers", "num_decoder_layers", "vision_layers", "text_layers", "projector_layers")
WIDTH = ("hidden_size", "embed_dim", "d_model", "n_embd", "projection_dim", "vision_embed_dim", "text_hidden_size",
         "output_hidden_size", "out_hidden_size", "projector_hidden_size", "mm_hidden_size")
FFN = ("intermediate_size", "ffn_dim", "mlp_dim", "encoder_ffn_dim", "decoder_ffn_dim", "moe_intermediate_size",
       "shared_expert_intermediate_size", "projector_intermediate_size")
HEADS = ("num_attention_heads", "num_heads", "encoder_attention_heads", "decoder_attention_heads", "n_head")
EXPERTS = ("num_experts", "n_routed_experts", "num_local_experts")
TOKEN_NAMES = ("image_token", "video_token", "audio_token", "boi_token", "eoi_token", "image_start_token",
               "image_end_token", "fake_image_token", "global_image_token", "start_image_token",
               "end_image_token", "image_break_token", "image_end_token")
EXTRA_SPECIALS = ("<image>", "<video>", "<audio>", "<start_of_image>", "<end_of_image>", "<image_soft_token>",
                  "<fake_token_around_image>", "<global-img>", "<|image_pad|>", "<|vision_start|>",
                  "<|vision_end|>", "<img>", "</img>", "<IMG_CONTEXT>", "[IMG]", "[IMG_BREAK]", "[IMG_END]",
                  "<|image|>", "<end_of_utterance>", "<s>", "</s>", "<unk>", "<pad>", "<eos>", "<bos>")


class TinyRefused(RuntimeError):
    """This family's tiny checkpoint cannot be built generically; the message says why."""


def _configs(config: Any) -> Iterator[Any]:
    """``config`` and every sub-config inside it, depth first."""
    from transformers import PretrainedConfig

    seen: set[int] = set()
    stack = [config]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        for value in vars(current).values():
            if isinstance(value, PretrainedConfig):
                stack.append(value)


def shrink(config: Any) -> Any:
    """``config`` made tiny in place (see the module docstring); returns it."""
    for sub in _configs(config):
        fields = vars(sub)
        for name in DEPTH:
            if isinstance(fields.get(name), int) and fields[name] > 2:
                setattr(sub, name, 2)
        layers = next((fields[n] for n in DEPTH if isinstance(fields.get(n), int)), None)
        if layers is not None and isinstance(fields.get("layer_types"), list):
            sub.layer_types = fields["layer_types"][:layers]
        for name in WIDTH:
            if isinstance(fields.get(name), int) and fields[name] > 64:
                setattr(sub, name, 64)
        for name in FFN:
            if isinstance(fields.get(name), int) and fields[name] > 128:
                setattr(sub, name, 128)
        for name in HEADS:
            if isinstance(fields.get(name), int) and fields[name] > 4:
                setattr(sub, name, 4)
        if isinstance(fields.get("num_key_value_heads"), int) and fields["num_key_value_heads"] > 2:
            sub.num_key_value_heads = 2
        if isinstance(fields.get("head_dim"), int) and fields["head_dim"] > 16:
            sub.head_dim = 16
        for name in EXPERTS:
            if isinstance(fields.get(name), int) and fields[name] > 4:
                setattr(sub, name, 4)
        if isinstance(fields.get("num_experts_per_tok"), int) and fields["num_experts_per_tok"] > 2:
            sub.num_experts_per_tok = 2
        if isinstance(fields.get("vocab_size"), int) and fields["vocab_size"] > VOCAB_SIZE:
            sub.vocab_size = VOCAB_SIZE
        for name, value in list(vars(sub).items()):
            if name.endswith("_token_id") and isinstance(value, int) and value >= VOCAB_SIZE:
                setattr(sub, name, 1)
    return config


def _processor_parts(model_type: str) -> tuple[Any, Any]:
    """(the processor class, its PIL image processor class) of ``model_type``."""
    import transformers
    from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    processor_name = PROCESSOR_MAPPING_NAMES.get(model_type)
    if not processor_name:
        raise TinyRefused(f"transformers names no processor for {model_type}")
    variants = IMAGE_PROCESSOR_MAPPING_NAMES.get(model_type)
    if not isinstance(variants, dict) or "pil" not in variants:
        raise TinyRefused(f"no PIL image processor for {model_type} (needs torchvision)")
    return getattr(transformers, processor_name), getattr(transformers, variants["pil"])


def _processor_geometry(accepts: Any, config: Any) -> dict[str, Any]:
    """The processor's own geometry arguments, agreeing with the tiny tower (a hub checkpoint's
    processor_config.json carries them; the processors' defaults are the real models')."""
    found = tiny_side(config)
    if found is None:
        return {}
    side, patch = found
    factor = next((int(vars(sub)[name]) for sub in _configs(config) for name in ("scale_factor", "downsample_factor")
                   if isinstance(vars(sub).get(name), (int, float)) and vars(sub)[name] >= 1), 1)
    values = {"img_size": side, "image_size": side, "patch_size": patch, "downsample_factor": factor,
              "image_seq_len": (side // patch) ** 2 // factor**2, "image_seq_length": (side // patch) ** 2 // factor**2,
              "num_image_tokens": (side // patch) ** 2 // factor**2}
    return {name: value for name, value in values.items() if name in accepts}


def make_processor(model_type: str, config: Any) -> Any:
    """The family's processor: its PIL image processor with defaults, a byte tokenizer with its tokens."""
    processor_cls, image_cls = _processor_parts(model_type)
    defaults = {
        name: param.default
        for name, param in inspect.signature(getattr(processor_cls, "__init__")).parameters.items()
        if isinstance(param.default, str) and name.endswith("token")
    }
    named = {name: defaults.get(name, value) for name, value in (
        ("image_token", "<image>"), ("boi_token", "<start_of_image>"), ("eoi_token", "<end_of_image>"),
        ("video_token", "<video>"), ("audio_token", "<audio>"),
    )}
    named.update({k: v for k, v in defaults.items() if k in TOKEN_NAMES})
    accepts = inspect.signature(getattr(processor_cls, "__init__")).parameters
    geometry = _processor_geometry(accepts, config)
    missing = re.compile(r"(?:has no attribute|missing required attribute) '?(\w+_token)'?")
    for _ in range(8):  # a token the processor reads from its tokenizer, added and tried again
        specials = sorted(set(EXTRA_SPECIALS) | set(defaults.values()) | set(named.values()))
        tokenizer = byte_tokenizer(specials, named, eos="</s>", pad="<pad>")
        tokenizer.bos_token, tokenizer.unk_token = "<s>", "<unk>"
        kwargs: dict[str, Any] = dict(geometry)
        if "qformer_tokenizer" in accepts:
            kwargs["qformer_tokenizer"] = tokenizer
        try:
            image_processor = image_cls()
            _small_image_processor(image_processor, config)
            return processor_cls(image_processor=image_processor, tokenizer=tokenizer, **kwargs)
        except Exception as exc:  # what the family's processor says about the parts it was given
            if "VIDEO_PROCESSOR_MAPPING" in str(exc):
                raise TinyRefused(f"{processor_cls.__name__} needs a video processor, and those need torchvision") from exc
            found = missing.search(str(exc))
            if found and found.group(1) not in named:
                named[found.group(1)] = f"<{found.group(1)}>"
                continue
            raise TinyRefused(f"{processor_cls.__name__} cannot be built offline: {type(exc).__name__}: {exc}") from exc
    raise TinyRefused(f"{processor_cls.__name__} reads more tokenizer attributes than a byte tokenizer has")


def _bind_tokens(config: Any, processor: Any) -> None:
    """Point the config's placeholder token ids at the tokenizer's (the processor writes those)."""
    tokenizer = processor.tokenizer
    ids = {}
    for name in ("image", "video", "audio", "boi", "eoi"):
        token = getattr(processor, f"{name}_token", None)
        if isinstance(token, str):
            ids[name] = int(tokenizer.convert_tokens_to_ids(token))
    image_id = getattr(processor, "image_token_id", None)
    if isinstance(image_id, int):
        ids["image"] = image_id
    for sub in _configs(config):
        for field in ("image_token_id", "image_token_index", "video_token_id", "video_token_index",
                      "audio_token_id", "audio_token_index", "boi_token_id", "boi_token_index",
                      "eoi_token_id", "eoi_token_index"):
            kind = field.split("_")[0]
            if field in vars(sub) and kind in ids:
                setattr(sub, field, ids[kind])


IMAGE_PATCHES = 8
"""Patches per side of a tiny tower's image (side = patch size x this): small, and divisible by the
pixel-shuffle and merge factors the families use (2, 4)."""


def tiny_side(config: Any) -> tuple[int, int] | None:
    """(side, patch size) of the tiny image: the vision tower's patch size x :data:`IMAGE_PATCHES`."""
    for sub in _configs(config):
        fields = vars(sub)
        if isinstance(fields.get("image_size"), int) and isinstance(fields.get("patch_size"), int):
            return fields["patch_size"] * IMAGE_PATCHES, fields["patch_size"]
    return None


def _small_image_processor(image_processor: Any, config: Any) -> None:
    """The image processor and the towers set to one small square side (default configs disagree)."""
    found = tiny_side(config)
    if found is None:
        return
    side, patch = found
    for sub in _configs(config):
        if isinstance(vars(sub).get("image_size"), int) and "patch_size" in vars(sub):
            sub.image_size = side
    for attr in ("size", "crop_size", "max_image_size"):
        value = getattr(image_processor, attr, None)
        if isinstance(value, dict):
            setattr(image_processor, attr, {k: side if isinstance(v, int) else v for k, v in value.items()})
        elif value is not None and hasattr(value, "__dict__"):
            for key, item in vars(value).items():
                if isinstance(item, int):
                    setattr(value, key, side)
    if hasattr(image_processor, "image_seq_length"):
        image_processor.image_seq_length = (side // patch) ** 2


def build_tiny(model_type: str, out: Path) -> dict[str, Any]:
    """Write the tiny checkpoint of ``model_type`` to ``out``; returns its facts, or raises :class:`TinyRefused`."""
    from transformers import AutoConfig

    from encoder_pod.models.parts import meta_model

    cls: Any = model_class({"model_type": model_type})
    if cls is None or not hasattr(cls, "get_image_features"):
        raise TinyRefused(f"no {model_type} class has get_image_features")
    try:
        config = shrink(AutoConfig.for_model(model_type))
    except Exception as exc:
        raise TinyRefused(f"its default config cannot be built: {type(exc).__name__}: {exc}") from exc
    processor = make_processor(model_type, config)
    _bind_tokens(config, processor)
    config.architectures = [cls.__name__]
    try:
        params = sum(p.numel() for p in meta_model(cls, config).parameters())
    except Exception as exc:
        raise TinyRefused(f"the shrunk config does not build: {type(exc).__name__}: {str(exc)[:200]}") from exc
    if params > MAX_PARAMETERS:
        raise TinyRefused(f"the shrunk config still has {params / 1e6:.0f}M parameters (limit {MAX_PARAMETERS // 10**6}M)")
    torch.manual_seed(seed_of(model_type))
    model = cls(config).eval()
    randomize_scaled(model, seed_of(model_type))

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp, max_shard_size=max_shard_size(model))
        processor.save_pretrained(tmp)

    try:
        save_atomically(Path(out), write)
    finally:
        del model
        gc.collect()
    return {"parameters": params, "class": cls.__name__, "processor": type(processor).__name__}


def feature_families() -> list[str]:
    """Every model type of the installed transformers in its language-model tables
    (:data:`~encoder_pod.models.servable.LANGUAGE_MODEL_TABLES`) that has a class with a feature method."""
    from transformers.models.auto import modeling_auto

    from encoder_pod.models.servable import LANGUAGE_MODEL_TABLES

    types = sorted({t for table in LANGUAGE_MODEL_TABLES for t in getattr(modeling_auto, table, {})})
    found = []
    for model_type in types:
        try:
            cls = model_class({"model_type": model_type})  # only a class with a feature method, else None
        except ImportError:  # a class whose backend (torchaudio ...) is absent: not servable here either
            continue
        if cls is not None:
            found.append(model_type)
    return found


def main(argv: list[str]) -> int:
    """``ROOT TYPE...``: build each into ROOT/TYPE, one JSON line per type on stdout."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    root, types = Path(argv[0]), argv[1:]
    for model_type in types:
        try:
            facts: dict[str, Any] = {"ok": True, **build_tiny(model_type, root / model_type)}
        except TinyRefused as exc:
            facts = {"ok": False, "reason": str(exc)}
        except Exception as exc:  # any other failure of the family's own code is its reason too
            facts = {"ok": False, "reason": f"{type(exc).__name__}: {str(exc)[:300]}"}
        print(json.dumps({"model_type": model_type, **facts}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
