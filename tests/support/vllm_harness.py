"""vLLM's own code for the interop tests: the 0.34.0 wheel's sources, loaded without importing vllm.

The wheel is fetched ``--no-deps`` and its Python sources unpacked into a cache outside the repo
by hack/vllm-wheel.sh (once per machine; offline afterwards); hack/vllm_release.py executes the
needed files under their real module names. Loaded once per test process (the module names are
vllm's own, so one release per process).
"""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path
from typing import Any

from encoder_pod.settings import VLLM_RELEASES

REPO = Path(__file__).resolve().parents[2]


def install_release(release: str = VLLM_RELEASES[-1]) -> Path:
    """The release's unpacked source directory (downloads what the cache lacks; raises if it cannot)."""
    proc = subprocess.run(["bash", str(REPO / "hack/vllm-wheel.sh"), release], capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"hack/vllm-wheel.sh could not fetch vllm {release} (needs the package index once):\n{proc.stderr[-2000:]}")
    return Path(proc.stdout.split()[-1])


@functools.cache
def vllm_release() -> Any:
    """hack/vllm_release.Release with the hasher, image decoding and EC connector modules loaded."""
    sys.path.insert(0, str(REPO / "hack"))
    import vllm_release as loader  # type: ignore[import-not-found]

    release = loader.load_release(install_release())
    loader.load_connectors(release)
    release.loader = loader
    return release
