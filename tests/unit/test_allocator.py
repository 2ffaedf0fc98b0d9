"""The host allocator tuning, seen from outside: a fresh process that frees and reallocates
activation-sized blocks stops page-faulting once the thresholds are pinned (glibc only)."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt tuning is glibc's")

_CHURN = textwrap.dedent(
    """
    import resource, sys
    from encoder_pod.allocator import tune_host_allocator
    tuned = tune_host_allocator(sys.argv[1] == "on")
    assert tune_host_allocator(sys.argv[1] == "on") is tuned  # once per process; a second call changes nothing
    def faults():
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(3):  # warm: the heap grows once
        blocks = [bytearray(1 << 20) for _ in range(8)]
        del blocks
    before = faults()
    for _ in range(50):  # a forward's worth of 1 MiB activations, 50 times
        blocks = [bytearray(1 << 20) for _ in range(8)]
        del blocks
    print(tuned, faults() - before)
    """
)


def _churn(mode: str) -> tuple[bool, int]:
    out = subprocess.run([sys.executable, "-c", _CHURN, mode], capture_output=True, text=True, check=True).stdout.split()
    return out[0] == "True", int(out[1])


def test_pinned_thresholds_stop_the_faults_of_reallocated_blocks() -> None:
    tuned, faults_on = _churn("on")
    untuned, faults_off = _churn("off")
    assert tuned and not untuned
    # Untuned, every 1 MiB block is a fresh mmap: 256 pages faulted in each time (~100,000 here).
    assert faults_off > 50 * 8 * 100
    assert faults_on < faults_off / 20

