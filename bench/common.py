"""Shared pieces of the benchmarks: checkpoints in the cache, machine facts, result files
(latency statistics are the load generator's: :mod:`testkit.load`)."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any

CACHE = Path(os.environ.get("ENCODERPOOL_CACHE", Path.home() / ".cache" / "encoderpool"))
RESULTS = Path(__file__).resolve().parent / "results"


def checkpoint(arch: str, preset: str = "moderate") -> Path:
    """A random-weight checkpoint in the cache, built once."""
    from encoder_pod.models.registry import make_tiny_model

    out = CACHE / "models" / f"{arch}-{preset}"
    if not (out / "config.json").is_file():
        make_tiny_model(arch, out, preset=preset)
    return out


def machine() -> dict[str, Any]:
    """Facts about where the numbers were taken."""
    import torch

    return {
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def write_json(name: str, data: dict[str, Any]) -> Path:
    """Write ``bench/results/<name>.json``."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path
