"""Tower memory: peak RSS of serving a whole checkpoint the pod's way against ``from_pretrained`` of it.

For each family (``paligemma``: the generic path; ``llava``: a hand-written adapter) one random
whole checkpoint is written into the cache, bf16 as the hub publishes them: the family's tiny
tower and projector (its own tiny builder: :mod:`encoder_pod.models.tiny_generic` for the
generic family, ``make-tiny-model --full`` for the adapter's) with the language model enlarged
to :data:`TEXT` (about 150M parameters, 300 MB), so the language model is almost all of it, as in
a real VLM. Each side runs in a fresh process; after the same imports its peak RSS is reset
(``/proc/self/clear_refs``), then it

- **pod**: loads the checkpoint with the pod's own loader (``load_adapter``: the family's adapter,
  or the generic path; encoder side only) and encodes one image (``preprocess`` + ``forward``);
- **whole**: ``from_pretrained`` of the family's transformers class (the whole model), its
  ``AutoProcessor``, and the same image through ``get_image_features``;

and reports the peak RSS the load and the encode added (``VmHWM`` minus the RSS after the
imports), and, at the end, how much of the RSS added is anonymous memory and how much file pages
(the touched pages of a mapped shard), and the address space added. The ratio pod / whole of the
peak is taken per family and dtype within one run: ``float32`` (the pod's CPU default:
``from_pretrained`` converts every bf16 tensor, so it materialises the whole model) and
``bfloat16`` (the file's own dtype, ``from_pretrained``'s best case on CPU: it maps the shards,
and the language model's pages, never touched by the feature method, stay out of RSS while
the mapping holds them as address space; on a GPU they would be copied to the device).

Run: ``python -m bench.tower_memory [--rounds 3]``; writes bench/results/tower_memory.json and .png.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence

from bench.common import CACHE, RESULTS, machine, write_json

FAMILIES = {"paligemma": "generic", "llava": "hand-written"}
"""Family -> the pod's path for it."""
DTYPES = ("float32", "bfloat16")
SIDES = ("pod", "whole")
TEXT = {"vocab_size": 32000, "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
        "num_attention_heads": 12, "num_key_value_heads": 4, "head_dim": 64}
"""The language model of every bench checkpoint (about 150M parameters)."""
IMAGE = (64, 48)
MEASURES = ("rss_before", "load_growth", "peak_growth", "anon_growth", "file_growth", "address_space_growth", "parameters")
"""What each side reports (bytes, but ``parameters``); ``*_growth`` is over the RSS (or size) after the imports."""


def enlarge(config: Mapping[str, Any], text: Mapping[str, Any] = TEXT) -> dict[str, Any]:
    """A whole model's config dict with its language model's size set to ``text``'s.

    The text config's fields that ``text`` names (``head_dim`` even where absent, since a width
    change would otherwise change it); a top-level ``projection_dim`` (the projector's output, the
    language model's width: PaliGemma) follows the new width, in the vision config too.
    """
    out = dict(config)
    text_config = dict(out["text_config"])
    for name, value in text.items():
        if name in text_config or name == "head_dim":
            text_config[name] = value
    out["text_config"] = text_config
    if "projection_dim" in out:
        out["projection_dim"] = text["hidden_size"]
        if isinstance(out.get("vision_config"), Mapping) and "projection_dim" in out["vision_config"]:
            out["vision_config"] = {**out["vision_config"], "projection_dim": text["hidden_size"]}
    return out


def _tiny(family: str, out: Path) -> None:
    """The family's own tiny whole checkpoint (the tower and processor the bench keeps)."""
    if FAMILIES[family] == "generic":
        from encoder_pod.models.tiny_generic import build_tiny

        build_tiny(family, out)
    else:
        from encoder_pod.models.family import Layout
        from encoder_pod.models.registry import make_tiny_model

        make_tiny_model(family, out, layout=Layout.FULL)


def write_checkpoint(family: str, root: Path) -> Path:
    """The bench checkpoint of ``family`` in ``root`` (built once): its tiny tower, the :data:`TEXT` LM."""
    out = root / f"{family}-tower-memory-bf16"
    if (out / "config.json").is_file():
        return out
    import torch
    from transformers import AutoConfig

    from encoder_pod.models.parts import empty_model
    from encoder_pod.models.servable import model_class
    from encoder_pod.models.tiny_full import max_shard_size, randomize_scaled, seed_of
    from encoder_pod.models.vision import save_atomically

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    with tempfile.TemporaryDirectory() as tmp:
        tiny = Path(tmp) / family
        _tiny(family, tiny)
        tiny_config = AutoConfig.from_pretrained(tiny)
        config = type(tiny_config).from_dict(enlarge(tiny_config.to_dict()))
        cls: Any = model_class(config.to_dict())
        model = empty_model(lambda: cls(config)).eval()
        randomize_scaled(model, seed_of(family))
        model = model.to(torch.bfloat16)  # as the hub publishes them

        def write(target: Path) -> None:
            model.save_pretrained(target, max_shard_size=max_shard_size(model))
            for name in tiny.iterdir():  # the tiny checkpoint's tokenizer and processor files
                if name.suffix != ".safetensors" and name.name not in ("config.json", "model.safetensors.index.json"):
                    shutil.copy(name, target / name.name)

        save_atomically(out, write)
    return out


_CHILD = """
import json, sys
side, path, dtype, width, height = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
import inspect
import torch
from PIL import Image
from transformers import AutoProcessor
from encoder_pod.models.base import MediaItem
from encoder_pod.models.generic import feature_rows
from encoder_pod.models.registry import load_adapter
from encoder_pod.models.servable import model_class
from encoder_pod.modality import Modality
from encoder_pod.settings import load_settings
image = Image.new("RGB", (width, height), (90, 140, 200))
before = {f: status(f) for f in ("VmRSS", "RssAnon", "RssFile", "VmSize")}
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset the peak RSS (VmHWM): the peak below is the load's and the encode's, not the imports'
if side == "pod":
    env = {"ENCODER_MODEL_PATH": path, "ENCODER_DEVICE": "cpu", "ENCODER_DTYPE": dtype}
    adapter = load_adapter(load_settings(env=env).model)
    loaded = status("VmRSS")
    rows = adapter.forward(adapter.preprocess([[MediaItem(Modality.IMAGE, image)]]))
    params = adapter.info()["tower_parameters"]
else:
    config = json.load(open(path + "/config.json"))
    model = model_class(config).from_pretrained(path, dtype=getattr(torch, dtype)).eval()
    loaded = status("VmRSS")
    processor = AutoProcessor.from_pretrained(path)
    encoded = processor(text=[processor.image_token], images=[image], return_tensors="pt")
    accepts = inspect.signature(model.get_image_features).parameters
    kwargs = {k: (v.to(model.dtype) if v.is_floating_point() else v) for k, v in encoded.items()
              if k in accepts and k not in ("input_ids", "attention_mask")}
    with torch.inference_mode():
        rows = feature_rows(model.get_image_features(**kwargs))
    params = sum(p.numel() for p in model.parameters())
end = {f: status(f) for f in ("VmHWM", "RssAnon", "RssFile", "VmSize")}
print(json.dumps({"rss_before": before["VmRSS"], "load_growth": loaded - before["VmRSS"],
                  "peak_growth": end["VmHWM"] - before["VmRSS"], "anon_growth": end["RssAnon"] - before["RssAnon"],
                  "file_growth": end["RssFile"] - before["RssFile"], "address_space_growth": end["VmSize"] - before["VmSize"],
                  "rows": list(rows.shape), "parameters": params}))
"""


def measure(side: str, path: Path, dtype: str) -> dict[str, Any]:
    """One load and encode of ``side`` in a fresh process."""
    env = {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "2", "PATH": "/usr/bin:/bin"}
    run = subprocess.run([sys.executable, "-c", _CHILD, side, str(path), dtype, *map(str, IMAGE)],
                         capture_output=True, text=True, timeout=900, env=env,
                         cwd=Path(__file__).resolve().parent.parent)
    if run.returncode:
        raise RuntimeError(f"{side} ({path.name}, {dtype}) failed:\n{run.stderr[-3000:]}")
    return dict(json.loads(run.stdout.strip().splitlines()[-1]))


def summarize(rounds: Sequence[Mapping[str, Mapping[str, Any]]]) -> dict[str, Any]:
    """Medians per side over rounds (``[{side: measurement}]``) and the ratios pod / whole.

    ``ratio_peak`` is the median of the per-round ratios (each round's two sides ran back to back),
    not the ratio of the medians. The two sides must have returned the same rows' shape.
    """
    for r in rounds:
        if r["pod"]["rows"] != r["whole"]["rows"]:
            raise ValueError(f"the pod returned rows {r['pod']['rows']}, from_pretrained {r['whole']['rows']}")
    out: dict[str, Any] = {side: {key: statistics.median(r[side][key] for r in rounds)
                                  for key in MEASURES}
                           for side in SIDES}
    out["rows"] = rounds[0]["pod"]["rows"]
    out["ratio_peak"] = statistics.median(r["pod"]["peak_growth"] / r["whole"]["peak_growth"] for r in rounds)
    out["ratio_parameters"] = out["pod"]["parameters"] / out["whole"]["parameters"]
    return out


def _plot(results: Mapping[str, Mapping[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(results)
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.38
    for i, (side, label, color) in enumerate((("pod", "pod's loader (encoder side)", "#55a868"),
                                              ("whole", "from_pretrained (whole model)", "#c44e52"))):
        values = [results[k][side]["peak_growth"] / 2**20 for k in keys]
        xs = [x + (i - 0.5) * width for x in range(len(keys))]
        ax.bar(xs, values, width, label=label, color=color)
        for x, v in zip(xs, values):
            ax.text(x, v, f"{v:.0f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(keys)))
    ax.set_xticklabels([f"{k}\nratio {results[k]['ratio_peak']:.3f}" for k in keys], fontsize=8)
    ax.set_ylabel("peak RSS added by load + one encode (MiB)")
    ax.set_title("Whole bf16 checkpoints (tiny tower, ~150M-parameter LM) on CPU, median of rounds")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main() -> None:
    """Write (once) each family's checkpoint, measure both sides per dtype in fresh processes, write results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    args = parser.parse_args()
    root = CACHE / "bench-models"
    paths = {family: write_checkpoint(family, root) for family in args.families}
    raw: dict[str, list[dict[str, Any]]] = {}
    for _ in range(args.rounds):
        for family in args.families:
            for dtype in args.dtypes:
                # Sides back to back, their order alternating by round (a shared machine's drift hits both).
                order = SIDES if len(raw.get(f"{family}/{dtype}", [])) % 2 == 0 else SIDES[::-1]
                raw.setdefault(f"{family}/{dtype}", []).append({side: measure(side, paths[family], dtype) for side in order})
    results = {key: {"path": FAMILIES[key.split("/")[0]], **summarize(rounds)} for key, rounds in raw.items()}
    sizes = {family: sum(p.stat().st_size for p in path.glob("*.safetensors")) for family, path in paths.items()}
    data = {"machine": machine(), "text_config": TEXT, "image": IMAGE, "checkpoint_bytes": sizes,
            "results": results, "rounds": raw}
    path = write_json("tower_memory", data)
    _plot(results, RESULTS / "tower_memory.png")
    for key, r in results.items():
        pod, whole = r["pod"], r["whole"]
        print(f"{key:20s} peak +{pod['peak_growth'] / 2**20:6.1f} MiB (pod) vs +{whole['peak_growth'] / 2**20:6.1f} MiB "
              f"(from_pretrained), ratio {r['ratio_peak']:.3f}; anon/file/address space added "
              f"{pod['anon_growth'] / 2**20:.0f}/{pod['file_growth'] / 2**20:.0f}/{pod['address_space_growth'] / 2**20:.0f} "
              f"vs {whole['anon_growth'] / 2**20:.0f}/{whole['file_growth'] / 2**20:.0f}/"
              f"{whole['address_space_growth'] / 2**20:.0f} MiB; rows {r['rows']}")
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    main()
