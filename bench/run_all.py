"""``make bench``: every benchmark that runs on this machine, one after the other."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

BENCHES = ["bench.core_bench", "bench.dp_bench", "bench.health_bench", "bench.load_bench", "bench.tower_memory"]

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    for name in BENCHES:
        if (Path(__file__).resolve().parent / (name.split(".")[1] + ".py")).exists():
            print(f">> {name}")
            sys.argv = [name]
            runpy.run_module(name, run_name="__main__")
