"""Which device, and how many CPU threads, each data-parallel worker gets.

Pure functions of the settings and the environment, decided by the front before any worker
starts. The front never imports torch (it must stay light and never touch a GPU), so GPUs are
counted from ``CUDA_VISIBLE_DEVICES`` or the ``/dev/nvidiaN`` device files.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from encoder_pod.settings import ModelSettings, ParallelSettings, SettingsError

_NVIDIA_DEV = re.compile(r"nvidia(\d+)$")


@dataclass(frozen=True)
class Placement:
    """One rank's share of the machine."""

    rank: int
    device: str
    """``cuda`` (one GPU, seen by the worker as cuda:0) or ``cpu``."""
    num_threads: int
    """torch intra-op threads of the worker."""
    env: dict[str, str] = field(default_factory=dict)
    """Variables set in the worker before torch is imported."""

    def describe(self) -> str:
        """A short human description for logs and /server_info."""
        if self.device == "cuda":
            return f"GPU {self.env['CUDA_VISIBLE_DEVICES']}, {self.num_threads} CPU threads"
        return f"CPU, {self.num_threads} threads"


def visible_gpus(environ: Mapping[str, str], dev_dir: Path = Path("/dev")) -> list[str]:
    """GPU ids this process may use, without initialising CUDA."""
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [d.strip() for d in listed.split(",") if d.strip() and d.strip() != "-1"]
    try:
        found = [int(m.group(1)) for p in dev_dir.iterdir() if (m := _NVIDIA_DEV.match(p.name))]
    except OSError:
        return []
    return [str(i) for i in sorted(found)]


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def plan(parallel: ParallelSettings, model: ModelSettings, environ: Mapping[str, str], cpus: int) -> list[Placement]:
    """One :class:`Placement` per data-parallel rank; :class:`SettingsError` when the GPUs do not suffice.

    With ``tp_size`` T, each rank is a tensor-parallel group of T processes: it gets T GPUs
    (its rank 0 sees them all and gives the r-th to group rank r) and T times fewer CPU threads.
    """
    gpus = visible_gpus(environ)
    on_gpu = model.device == "cuda" or (model.device == "auto" and bool(gpus))
    group, dp_size = parallel.tp_size, parallel.dp_size
    if on_gpu and len(gpus) < dp_size * group:
        what = f"{dp_size} workers need one GPU each"
        if group > 1:
            what = f"{dp_size} groups of {group} tensor-parallel ranks need {dp_size * group} GPUs"
        raise SettingsError(
            f"invalid setting ENCODER_DP_SIZE / --dp-size (and --tp-size): {what}, "
            f"{len(gpus)} visible ({'CUDA_VISIBLE_DEVICES=' + environ['CUDA_VISIBLE_DEVICES'] if 'CUDA_VISIBLE_DEVICES' in environ else '/dev/nvidia*'})"
        )
    # An explicit NUM_THREADS is per process; otherwise the CPUs are split evenly over every
    # process (dp x tp), so they do not each start a pool as large as the machine and thrash.
    threads = model.num_threads or max(1, cpus // (dp_size * group))
    placements = []
    for rank in range(dp_size):
        env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        # On CPU the worker must not grab a GPU by accident (device auto on a GPU host with
        # ENCODER_DEVICE=cpu): hide them all.
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[rank * group : (rank + 1) * group]) if on_gpu else ""
        placements.append(Placement(rank, "cuda" if on_gpu else "cpu", threads, env))
    return placements
