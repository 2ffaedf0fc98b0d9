"""What each stack should answer for one image, from Hugging Face's own model, and the comparison.

The reference is ``CLIPVisionModel`` loaded in full from the pod's checkpoint with
``output_hidden_states=True`` (nothing trimmed, nothing of the pod's code), fp32 on the CPU:

- patch rows: ``hidden_states[-2][0, 1:]``, what the pod, the ceiling and the Ray replica serve;
- the contrastive embedding infinity-emb serves for the same tower: ``post_layernorm`` of
  ``hidden_states[-2][0, 0]`` (CLS), times the visual projection of the full checkpoint, L2
  normalised.
"""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

import numpy as np

FEATURE_LAYER = -2
"""The hidden state the pod serves for CLIP (LLaVA's ``vision_feature_layer``)."""


def reference_outputs(tower: Path, full: Path | None, image_uri: str) -> dict[str, np.ndarray]:
    """``{"rows": (196, hidden)}`` and, with ``full``, ``{"pooled": (projection_dim,)}``."""
    import torch
    from PIL import Image
    from safetensors.torch import load_file
    from transformers import CLIPImageProcessorPil, CLIPVisionModel

    image = Image.open(io.BytesIO(base64.b64decode(image_uri.split(",", 1)[1]))).convert("RGB")
    processor = CLIPImageProcessorPil.from_pretrained(tower)
    model = CLIPVisionModel.from_pretrained(tower, dtype=torch.float32).eval()
    with torch.inference_mode():
        out = model(pixel_values=processor(images=[image], return_tensors="pt")["pixel_values"],
                    output_hidden_states=True)
        hidden = out.hidden_states[FEATURE_LAYER][0]
        result = {"rows": hidden[1:].numpy().copy()}
        if full is not None:
            projection = load_file(str(full / "model.safetensors"))["visual_projection.weight"]
            tower_module = getattr(model, "vision_model", model)
            pooled = tower_module.post_layernorm(hidden[0]) @ projection.T
            result["pooled"] = (pooled / pooled.norm()).numpy().copy()
    return result


def decode_rows(body: dict[str, Any]) -> np.ndarray:
    """The patch rows of a pod-style inline answer (bf16 widened to fp32)."""
    from encoder_pod.transfer.inline import decode_embedding

    return np.asarray(decode_embedding(body["embedding"]), dtype=np.float32)


def decode_infinity(body: dict[str, Any]) -> np.ndarray:
    """The vector of an OpenAI-style embeddings answer with ``encoding_format: base64``."""
    return np.frombuffer(base64.b64decode(body["data"][0]["embedding"]), dtype="<f4").astype(np.float32)


def compare(name: str, what: str, got: np.ndarray, want: np.ndarray, tolerance: float) -> dict[str, Any]:
    """A record of one comparison: shapes, max abs diff, and whether it is within ``tolerance``."""
    same_shape = tuple(got.shape) == tuple(want.shape)
    diff = float(np.max(np.abs(got - want))) if same_shape else float("inf")
    return {"stack": name, "compared": what, "shape": list(got.shape), "reference_shape": list(want.shape),
            "max_abs_diff": diff, "reference_max_abs": float(np.max(np.abs(want))),
            "tolerance": tolerance, "equal": bool(same_shape and diff <= tolerance)}
