"""Tensor-parallel benchmark: one vision-tower forward at tp=1 against tp=T, same machine.

What tensor parallel buys is the latency (and memory) of ONE forward of a large tower, so this
times the sharded forward itself, the exact code the server runs (``shard_tower`` on a DeviceMesh),
without HTTP or preprocessing in the way: random weights, synthetic patches of ``--images`` images
of ``--side`` px per batch.

- ``--device cuda`` (default when a GPU is visible): Qwen2.5-VL-7B's real vision tower config
  (32 blocks, width 1280, 16 heads, SwiGLU 3420, windowed attention), bf16, nccl; tp=1, and tp=2
  (and 4) when that many GPUs are visible.
- ``--device cpu``: the same code on gloo with the ``moderate`` tower (fp32). For plumbing checks
  only: on CPU the processes share the same cores, so tp=2 is not expected to be faster.

Run: ``python -m bench.tp_bench [--device cuda] [--images 4] [--side 448] [--iters 20]``;
writes bench/results/tp_<device>.json. Numbers are not a test and never gate CI.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from bench.common import machine, write_json

QWEN25_VL_7B_VISION = {
    "depth": 32,
    "hidden_size": 1280,
    "intermediate_size": 3420,
    "num_heads": 16,
    "out_hidden_size": 3584,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "window_size": 112,
    "fullatt_block_indexes": [7, 15, 23, 31],
}
"""The vision tower of Qwen2.5-VL-7B-Instruct (its config.json's vision_config)."""

MODERATE = {**QWEN25_VL_7B_VISION, "depth": 4, "hidden_size": 384, "intermediate_size": 1024,
            "num_heads": 6, "out_hidden_size": 512, "fullatt_block_indexes": [1, 3]}


def _inputs(images: int, side: int, config: dict[str, Any], device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    patch, temporal = config["patch_size"], config["temporal_patch_size"]
    grid = side // patch
    rows = images * grid * grid
    generator = torch.Generator().manual_seed(0)
    pixels = torch.randn(rows, 3 * temporal * patch * patch, generator=generator).to(device, dtype)
    grid_thw = torch.tensor([[1, grid, grid]] * images, dtype=torch.long, device=device)
    return pixels, grid_thw


def _rank(rank: int, tp: int, args: argparse.Namespace, store_path: str, out: Any) -> None:
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

    from encoder_pod.parallel.tensor.sharding import shard_tower

    cuda = args.device == "cuda"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // tp))
    config = QWEN25_VL_7B_VISION if cuda else MODERATE
    dtype = torch.bfloat16 if cuda else torch.float32
    torch.manual_seed(0)  # every rank builds the same weights; sharding then keeps its slice
    model = Qwen2_5_VisionTransformerPretrainedModel(Qwen2_5_VLVisionConfig(**config)).to(device, dtype).eval()
    if tp > 1:
        dist.init_process_group(
            "nccl" if cuda else "gloo", store=dist.FileStore(store_path, tp), rank=rank, world_size=tp,
            timeout=datetime.timedelta(seconds=300), device_id=device if cuda else None,
        )
        from torch.distributed.device_mesh import init_device_mesh

        shard_tower(model, init_device_mesh(device.type, (tp,)))
    pixels, grid = _inputs(args.images, args.side, config, device, dtype)
    times = []
    with torch.inference_mode():
        for i in range(args.warmup + args.iters):
            if tp > 1:
                dist.barrier()
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            model(pixels, grid_thw=grid)
            if cuda:
                torch.cuda.synchronize()
            if i >= args.warmup:
                times.append(time.perf_counter() - start)
    if rank == 0:
        memory = torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None
        out.put({"tp": tp, "p50_ms": statistics.median(times) * 1000, "mean_ms": statistics.fmean(times) * 1000,
                 "min_ms": min(times) * 1000, "iters": len(times), "rank0_peak_gib": memory})
    if tp > 1:
        dist.destroy_process_group()


def run(tp: int, args: argparse.Namespace) -> dict[str, Any]:
    """One configuration: ``tp`` processes, rank 0's timings."""
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [ctx.Process(target=_rank, args=(r, tp, args, os.path.join(tmp, "store"), out)) for r in range(tp)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        if any(p.exitcode for p in procs):
            raise RuntimeError(f"tp={tp}: a rank failed ({[p.exitcode for p in procs]})")
    return out.get()


def main() -> None:
    """Parse, run tp=1 then every larger tp the devices allow, write the results."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--images", type=int, default=4, help="images per forward")
    parser.add_argument("--side", type=int, default=448, help="image side in pixels (multiple of 28)")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--max-tp", type=int, default=4)
    args = parser.parse_args()
    devices = torch.cuda.device_count() if args.device == "cuda" else 2
    sizes = [t for t in (1, 2, 4) if t <= min(devices, args.max_tp)]
    results = []
    for tp in sizes:
        result = run(tp, args)
        results.append(result)
        print(f"tp={tp}: p50 {result['p50_ms']:.1f} ms, mean {result['mean_ms']:.1f} ms", flush=True)
    tower = "qwen2.5-vl-7b vision, bf16" if args.device == "cuda" else "qwen2.5-vl moderate, fp32"
    path = write_json(f"tp_{args.device}", {"machine": machine(), "tower": tower, "images": args.images,
                                             "side": args.side, "results": results})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
