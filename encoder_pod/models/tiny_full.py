"""Tiny whole multimodal checkpoints (``make-tiny-model --full``), laid out as the hub's are.

Each family builds its own ``...ForConditionalGeneration`` from a tiny config with seeded random
weights and hands it here with its tokenizer and processor files. What is written is what a user
downloads from the hub: the safetensors shards (many small ones, so the encoder's selective read is
real) with ``model.safetensors.index.json``, ``config.json``, a ``tokenizer.json`` that tokenizes
any text (one token per byte, the family's special tokens atomic), ``preprocessor_config.json``
and, where the family has them, ``video_preprocessor_config.json`` and ``processor_config.json``.
Offline: the tokenizer is built with ``tokenizers``, nothing is downloaded.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from torch import nn

from encoder_pod.models.vision import save_atomically

VOCAB_SIZE = 4096
"""Text vocabulary of the tiny language models: the 256 byte tokens, the specials, and spare rows
(the embedding matrix is what makes the language model the bulk of a tiny checkpoint, as of a real one)."""

SHARDS = 16
"""About this many shards per tiny checkpoint: the tower's tensors span several of them."""


def byte_tokenizer(specials: Sequence[str], named: Mapping[str, str], *, eos: str, pad: str) -> Any:
    """A fast tokenizer over the 256 byte symbols (no merges) plus ``specials`` as atomic tokens.

    ``named`` (``{"image_token": "<|image_pad|>"}``) become attributes (``tokenizer.image_token``,
    ``tokenizer.image_token_id``), which the families' processors read.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    core = Tokenizer(models.BPE(vocab={symbol: i for i, symbol in enumerate(alphabet)}, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(list(dict.fromkeys([pad, eos, *specials, *named.values()])))
    return PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token=eos, pad_token=pad, extra_special_tokens=dict(named)
    )


def token_ids(tokenizer: Any, tokens: Sequence[str]) -> dict[str, int]:
    """Each token's id (for the model config's ``image_token_id`` and friends)."""
    return {token: int(tokenizer.convert_tokens_to_ids(token)) for token in tokens}


@torch.no_grad()
def randomize_scaled(model: nn.Module, seed: int) -> None:
    """Seeded weights of a working scale: matrices ~ N(0, 1/fan_in), norm scales near 1, the rest small.

    Every tensor differs from a fresh init (some inits are zero, e.g. Gemma 3's projection: a
    test on zeros could not fail), and activations stay O(1) through the tiny towers.
    """
    generator = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        noise = torch.randn(param.shape, generator=generator, dtype=torch.float32)
        if param.dim() >= 2:
            value = noise / max(param[0].numel(), 1) ** 0.5
        elif "norm" in name.lower() and name.endswith("weight"):
            value = 1.0 + 0.1 * noise
        else:
            value = 0.1 * noise
        param.copy_(value.to(param.dtype))


def seed_of(name: str) -> int:
    """A stable seed per family name."""
    return zlib.crc32(name.encode())


def max_shard_size(model: nn.Module, shards: int = SHARDS) -> int:
    """Bytes per shard that split ``model``'s weights into about ``shards`` files."""
    total = sum(p.numel() * p.element_size() for p in model.state_dict().values())
    return max(total // shards, 1024)


def save_full(
    out: Path,
    model: Any,
    tokenizer: Any,
    files: Mapping[str, Mapping[str, Any]],
    extra: Mapping[str, bytes] | None = None,
) -> None:
    """Write ``model`` sharded with its index, the tokenizer, ``files`` (name -> JSON) and ``extra`` bytes.

    ``config.json`` lands last (:func:`~encoder_pod.models.vision.save_atomically`), so a directory
    holding one is complete.
    """

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one bar per save on the tests' and the CLI's stderr otherwise

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp, max_shard_size=max_shard_size(model))
        if not (tmp / "model.safetensors.index.json").is_file():
            raise RuntimeError(f"{type(model).__name__} was saved unsharded; the tiny checkpoint must have an index")
        tokenizer.save_pretrained(tmp)
        for name, content in files.items():
            (tmp / name).write_text(json.dumps(content, indent=2, sort_keys=True) + "\n")
        for name, data in (extra or {}).items():
            (tmp / name).write_bytes(data)

    save_atomically(out, write)


def image_processor_file(processor: Any) -> dict[str, Any]:
    """``preprocessor_config.json`` of an image processor, as ``save_pretrained`` of it alone writes it."""
    content = processor.to_dict()
    # The PIL class records its torchvision twin's name, as the hub's files do.
    content["image_processor_type"] = type(processor).__name__.removesuffix("Pil")
    return content
