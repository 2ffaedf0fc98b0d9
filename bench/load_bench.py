"""Model load: a whole checkpoint (tower weights only) against the tower saved alone, same model.

One Qwen2.5-VL with random weights is written twice into the cache, in bf16 as the hub publishes
checkpoints: whole (the moderate tower of the other benchmarks plus a language model about 8x its
size, sharded with an index) and as its tower saved alone (``model.visual.save_pretrained``, what
``make-tiny-model`` writes). Each is loaded as the pod loads it on a CPU, in fp32, each load in a
fresh process after its imports, reporting:

- load seconds (``load_adapter``: config, tower build, weights, processor);
- the process's peak RSS during the load (``VmHWM`` reset right before it) and its RSS growth,
  split into anonymous memory and file pages (``from_pretrained`` maps the shards: what it
  touches shows up as file pages, not as ``read()`` bytes);
- bytes the process read (``/proc/self/io`` ``rchar``) and bytes the pod's reader reports;

- the same after one encode (ready to serve: a lazily mapped tower pages its weights in then);

plus, for scale, ``Qwen2_5_VLForConditionalGeneration.from_pretrained`` of the whole checkpoint:
what serving it without the selective read would cost. The files are in the page cache after the
first round, so load times are CPU time (parsing, converting, copying), not disk time. bf16 to
fp32 is a conversion, so ``from_pretrained`` materialises every parameter of the whole model (as it
would copy every one to a GPU); were the file's dtype the serving dtype on CPU, it would map the
shards and untouched language-model weights would cost address space only.

Run: ``python -m bench.load_bench [--rounds 3]``; writes bench/results/load_cpu.json and .png.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.common import CACHE, RESULTS, machine, write_json

VISION = {"depth": 4, "hidden_size": 384, "intermediate_size": 1024, "num_heads": 6, "out_hidden_size": 512,
          "window_size": 112, "fullatt_block_indexes": [1, 3]}
TEXT = {"vocab_size": 32000, "hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 12,
        "num_attention_heads": 8, "num_key_value_heads": 8,
        "rope_parameters": {"rope_type": "default", "mrope_section": [8, 12, 12], "rope_theta": 1000000.0}}
KINDS = ("tower_only", "whole_selective", "whole_from_pretrained")


def write_pair(root: Path) -> tuple[Path, Path]:
    """(whole checkpoint, tower-only checkpoint) of one random Qwen2.5-VL, built once in the cache."""
    whole, tower = root / "qwen2_5_vl-whole-bf16", root / "qwen2_5_vl-tower-bf16"
    if (whole / "config.json").is_file() and (tower / "config.json").is_file():
        return whole, tower
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2VLImageProcessorPil

    from encoder_pod.models.tiny_full import image_processor_file, randomize_scaled, save_full
    from encoder_pod.models.qwen2_vl import qwen_tokenizer
    from encoder_pod.models.vision import save_atomically

    model = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(text_config=TEXT, vision_config=VISION))
    randomize_scaled(model, seed=7)
    model = model.to(torch.bfloat16)  # as the hub publishes them
    processor = Qwen2VLImageProcessorPil()
    files = {"preprocessor_config.json": image_processor_file(processor)}
    save_full(whole, model, qwen_tokenizer(), files)

    def write_tower(tmp: Path) -> None:
        model.model.visual.save_pretrained(tmp)
        (tmp / "preprocessor_config.json").write_text(json.dumps(files["preprocessor_config.json"]) + "\n")

    save_atomically(tower, write_tower)
    return whole, tower


_CHILD = """
import json, sys, time
kind, path = sys.argv[1], sys.argv[2]
def proc(name, field):
    for line in open(f"/proc/self/{name}"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * (1024 if name == "status" else 1)
import torch
from encoder_pod.models.registry import load_adapter
from encoder_pod.settings import load_settings
from transformers import Qwen2_5_VLForConditionalGeneration
before = {f: proc("status", f) for f in ("VmRSS", "RssAnon", "RssFile")}
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset the peak RSS (VmHWM): the peak below is the load's, not the imports'
read_before, started = proc("io", "rchar"), time.perf_counter()
reported = None
if kind == "whole_from_pretrained":
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    params = sum(p.numel() for p in model.parameters())
else:
    adapter = load_adapter(load_settings(env={"ENCODER_MODEL_PATH": path, "ENCODER_DEVICE": "cpu"}).model)
    params = adapter.info()["tower_parameters"]
    reported = adapter.weights.bytes_read
seconds = time.perf_counter() - started
after = {f: proc("status", f) for f in ("VmRSS", "RssAnon", "RssFile", "VmHWM")}
# Ready to serve: one encode of a 448x448 image (an mmap'd tower pages its weights in here).
if kind == "whole_from_pretrained":
    from transformers import Qwen2VLImageProcessorPil
    from PIL import Image
    out = Qwen2VLImageProcessorPil.from_pretrained(path)(images=[Image.new("RGB", (448, 448))], return_tensors="pt")
    with torch.inference_mode():
        model.get_image_features(out["pixel_values"], out["image_grid_thw"])
else:
    from PIL import Image
    from encoder_pod.models.base import MediaItem
    from encoder_pod.modality import Modality
    batch = adapter.preprocess([[MediaItem(Modality.IMAGE, Image.new("RGB", (448, 448)))]])
    adapter.forward(batch)
ready = {f: proc("status", f) for f in ("VmRSS", "RssAnon", "RssFile")}
print(json.dumps({"seconds": seconds, "ready_seconds": time.perf_counter() - started,
                  "rss_ready_growth": ready["VmRSS"] - before["VmRSS"], "rss_before": before["VmRSS"], "peak_rss": after["VmHWM"],
                  "rss_growth": after["VmRSS"] - before["VmRSS"], "anon_growth": after["RssAnon"] - before["RssAnon"],
                  "file_pages_growth": after["RssFile"] - before["RssFile"], "rchar": proc("io", "rchar") - read_before,
                  "reader_bytes": reported, "parameters": params}))
"""


def measure(kind: str, path: Path) -> dict[str, Any]:
    """One load of ``kind`` from ``path`` in a fresh process."""
    env = {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "2", "PATH": "/usr/bin:/bin"}
    run = subprocess.run([sys.executable, "-c", _CHILD, kind, str(path)], capture_output=True, text=True,
                         timeout=900, env=env, cwd=Path(__file__).resolve().parent.parent)
    if run.returncode:
        raise RuntimeError(f"{kind} load failed:\n{run.stderr[-2000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def _plot(results: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = ["tower alone", "whole, tower only", "whole, from_pretrained"]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    metrics = [("seconds", "load time (s)", 1), ("peak_growth", "peak RSS added by the load (MiB)", 2**20),
               ("parameters", "parameters materialised (M)", 1e6)]
    for ax, (key, title, scale) in zip(axes, metrics):
        values = [results[kind][key] / scale for kind in KINDS]
        ax.bar(labels, values, color=["#4c72b0", "#55a868", "#c44e52"])
        ax.set_title(title)
        ax.tick_params(axis="x", labelrotation=15, labelsize=8)
        for i, v in enumerate(values):
            ax.text(i, v, f"{v:.2f}" if key == "seconds" else f"{v:.1f}", ha="center", va="bottom", fontsize=8)
    fig.suptitle("Qwen2.5-VL, bf16 checkpoint served in fp32 on CPU (tower 10.7M params, whole 94M), median of rounds")
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main() -> None:
    """Write (once) the two checkpoints, load each kind in fresh processes, write the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    whole, tower = write_pair(CACHE / "bench-models")
    paths = {"tower_only": tower, "whole_selective": whole, "whole_from_pretrained": whole}
    rounds: dict[str, list[dict[str, Any]]] = {kind: [] for kind in KINDS}
    for _ in range(args.rounds):
        for kind in KINDS:  # alternating, so load on the shared machine hits every kind alike
            rounds[kind].append(measure(kind, paths[kind]))
    median = {kind: {key: statistics.median(r[key] for r in runs) if runs[0][key] is not None else None
                     for key in runs[0]} for kind, runs in rounds.items()}
    for values in median.values():
        values["peak_growth"] = values["peak_rss"] - values["rss_before"]
    sizes = {"whole_checkpoint_bytes": sum(p.stat().st_size for p in whole.glob("*.safetensors")),
             "tower_checkpoint_bytes": sum(p.stat().st_size for p in tower.glob("*.safetensors"))}
    data = {"machine": machine(), "model": {"vision": VISION, "text": TEXT, **sizes}, "median": median, "rounds": rounds}
    path = write_json("load_cpu", data)
    _plot(median, RESULTS / "load_cpu.png")
    print(json.dumps({"median": median, **sizes}, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    main()
