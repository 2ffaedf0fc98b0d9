"""Can this checkpoint be split over T ranks? Pure functions of config.json (no torch).

The front calls :func:`check_divisible` before any worker starts, so a model whose attention heads
or MLP width do not divide by the tensor-parallel size stops the pod at start with a message
naming the numbers, instead of crash-looping its workers. ``sharding`` checks the loaded modules
again (the authority), with the same wording.
"""

from __future__ import annotations

from typing import Any, Callable

from encoder_pod.settings import SettingsError

# model_type -> (config key of the attention heads, the MLP's hidden width from the config).
_FAMILIES: dict[str, tuple[str, Callable[[dict[str, Any]], int]]] = {
    "qwen2_vl_vision": ("num_heads", lambda c: int(int(c["embed_dim"]) * float(c["mlp_ratio"]))),
    "qwen2_5_vl_vision": ("num_heads", lambda c: int(c["intermediate_size"])),
    "clip_vision_model": ("num_attention_heads", lambda c: int(c["intermediate_size"])),
    "siglip_vision_model": ("num_attention_heads", lambda c: int(c["intermediate_size"])),
}

SUPPORTED = tuple(sorted(_FAMILIES))
"""The tower types tensor parallel can split."""

# A whole checkpoint's vision_config may not name its model_type (Qwen2-VL's released configs do not).
_WHOLE_TO_TOWER = {"qwen2_vl": "qwen2_vl_vision", "qwen2_5_vl": "qwen2_5_vl_vision"}


def tower_config(config: dict[str, Any]) -> dict[str, Any]:
    """The tower's config: ``config`` itself, or the ``vision_config`` of a whole multimodal checkpoint."""
    vision = config.get("vision_config")
    if config.get("model_type") in _FAMILIES or not isinstance(vision, dict):
        return config
    model_type = vision.get("model_type") or _WHOLE_TO_TOWER.get(str(config.get("model_type")))
    return {**vision, "model_type": model_type}


def split_sizes(config: dict[str, Any]) -> tuple[int, int]:
    """(attention heads, MLP hidden units) of a tower config; ValueError for other models."""
    config = tower_config(config)
    model_type = config.get("model_type")
    if model_type not in _FAMILIES:
        raise ValueError(
            f"tensor parallel supports {', '.join(SUPPORTED)} towers, not model_type {model_type!r}"
        )
    heads_key, mlp_width = _FAMILIES[model_type]
    return int(config[heads_key]), mlp_width(config)


def divisibility_problems(heads: int, mlp_hidden: int, tp_size: int) -> list[str]:
    """Human reasons why ``tp_size`` ranks cannot each hold whole heads and equal MLP shares."""
    problems = []
    if heads % tp_size:
        problems.append(f"{heads} attention heads do not divide by {tp_size}")
    if mlp_hidden % tp_size:
        problems.append(f"MLP hidden size {mlp_hidden} does not divide by {tp_size}")
    return problems


def check_divisible(config: dict[str, Any], tp_size: int) -> None:
    """:class:`SettingsError` naming ENCODER_TP_SIZE when this tower cannot be split ``tp_size`` ways."""
    if tp_size == 1:
        return
    try:
        heads, width = split_sizes(config)
    except (ValueError, KeyError, TypeError) as exc:
        raise SettingsError(f"invalid setting ENCODER_TP_SIZE / --tp-size: {tp_size}; {exc}") from None
    problems = divisibility_problems(heads, width, tp_size)
    if problems:
        raise SettingsError(
            f"invalid setting ENCODER_TP_SIZE / --tp-size: {tp_size}; this model cannot be split: "
            + "; ".join(problems)
        )
