"""The families' real HF processors, built without torchvision, for counting placeholder tokens.

transformers 5.23 cannot build a processor that declares a ``video_processor`` when torchvision is
absent (this project does not install it), even with ``video_processor=None``: the class check looks
``VideoProcessorMixin`` up on a module where it only exists with torchvision. The subclasses here
let exactly that one argument be ``None``; the image/audio placeholder expansion, the tokenizer and
the image processor are the real ones. Video placeholders, which need the real video processor,
are not counted with these.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import torch


def without_video(processor_cls: type) -> type:
    """``processor_cls`` accepting ``video_processor=None`` (its default here) and never building one."""

    def __init__(self: Any, *args: Any, video_processor: Any = None, **kwargs: Any) -> None:
        processor_cls.__init__(self, *args, video_processor=video_processor, **kwargs)

    def check_argument_for_proper_class(self: Any, name: str, argument: Any) -> Any:
        if name == "video_processor" and argument is None:
            return type(None)
        return processor_cls.check_argument_for_proper_class(self, name, argument)

    # The sub-processors a processor has are read off its __init__'s signature: keep the real one.
    __init__.__signature__ = inspect.signature(processor_cls.__init__)  # type: ignore[attr-defined]
    namespace = {"__init__": __init__, "check_argument_for_proper_class": check_argument_for_proper_class}
    return type(processor_cls.__name__, (processor_cls,), namespace)


def tokenizer(ckpt: Path) -> Any:
    """The checkpoint's own tokenizer."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(ckpt)


def count(input_ids: torch.Tensor, token_id: int) -> list[int]:
    """Placeholder tokens per prompt (one prompt per row)."""
    return [int((row == token_id).sum()) for row in input_ids]
