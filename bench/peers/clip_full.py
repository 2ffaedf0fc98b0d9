"""Write a full ``CLIPModel`` checkpoint around the encoder pod's CLIP vision tower (a script).

infinity-emb serves CLIP as a ``CLIPModel`` (it calls ``get_image_features``, and its processor
needs a tokenizer), while the pod serves a ``CLIPVisionModel`` tower. This script, run with the
peer's own interpreter (``python bench/peers/clip_full.py --tower DIR --out DIR --keep-layers N``),
builds a ``CLIPModel`` whose vision tower is the pod checkpoint's embeddings, pre-layernorm and
first ``N`` encoder layers (the layers the pod computes for LLaVA's penultimate-layer output), its
post-layernorm, a seeded random 512-d visual projection, a one-layer text tower images never run,
and a byte-level tokenizer. Only torch, transformers and safetensors are imported.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, CLIPTokenizer
from transformers.models.clip.tokenization_clip import bytes_to_unicode

PROJECTION_SEED = 1234


def write_tokenizer_files(folder: Path) -> int:
    """A byte-level BPE vocabulary with no merges; returns its size."""
    chars = list(bytes_to_unicode().values())
    tokens = chars + [c + "</w>" for c in chars] + ["<|startoftext|>", "<|endoftext|>"]
    (folder / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(tokens)}))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    return len(tokens)


def build(tower: Path, out: Path, keep_layers: int) -> None:
    """Write the checkpoint into ``out`` (replaced if present)."""
    vision = json.loads((tower / "config.json").read_text())
    weights = load_file(str(tower / "model.safetensors"))
    vision_fields = ("hidden_size", "intermediate_size", "num_attention_heads", "image_size", "patch_size",
                     "hidden_act", "layer_norm_eps", "num_channels")
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    vocab = write_tokenizer_files(tmp)
    config = CLIPConfig(
        vision_config={**{k: vision[k] for k in vision_fields if k in vision}, "num_hidden_layers": keep_layers},
        text_config={"vocab_size": vocab, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
                     "num_attention_heads": 2, "max_position_embeddings": 77,
                     "bos_token_id": vocab - 2, "eos_token_id": vocab - 1, "pad_token_id": vocab - 1},
        projection_dim=int(vision.get("projection_dim", 512)),
    )
    torch.manual_seed(0)  # the text tower (never run for images) is deterministic too
    model = CLIPModel(config).eval()
    kept = {k: v for k, v in weights.items()
            if not k.startswith("encoder.layers.") or int(k.split(".")[2]) < keep_layers}
    model.vision_model.load_state_dict(kept, strict=True)
    generator = torch.Generator().manual_seed(PROJECTION_SEED)
    with torch.no_grad():
        proj = model.visual_projection.weight
        proj.copy_(torch.randn(proj.shape, generator=generator) * proj.shape[1] ** -0.5)
    model.save_pretrained(tmp)
    pre = json.loads((tower / "preprocessor_config.json").read_text())
    image_processor = CLIPImageProcessor(**{k: v for k, v in pre.items() if k != "image_processor_type"})
    tokenizer = CLIPTokenizer(str(tmp / "vocab.json"), str(tmp / "merges.txt"), pad_token="<|endoftext|>")
    CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def main() -> None:
    """Command line: --tower, --out, --keep-layers."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tower", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--keep-layers", type=int, required=True)
    args = parser.parse_args()
    build(args.tower, args.out, args.keep_layers)


if __name__ == "__main__":
    main()
