"""The host allocator, tuned so that tensors stop page-faulting on every batch (glibc only).

glibc's malloc serves a block above its mmap threshold (128 KiB at start, raised as such blocks
are freed) with a fresh ``mmap``, and returns free memory at the top of a heap to the kernel once
it exceeds the trim threshold. A forward allocates and frees activations of hundreds of KiB to
MiB every batch, so a process whose history kept the threshold low maps, faults in, zeroes and
unmaps the same memory on every forward. Measured on the bench's CLIP tower on 2 CPU cores:
350-3,300 page faults per request and forwards 1.5-4 ms (8-20%) slower than the same forward in a
fresh process, varying from one server process to the next; with the thresholds pinned, 0-50
faults and forwards as fast as the in-process ceiling.

:func:`tune_host_allocator` pins them (``mallopt``): blocks up to :data:`MMAP_THRESHOLD` come from
the heap and are reused, and up to :data:`TRIM_THRESHOLD` of free memory stays mapped. The cost
is that RSS stays near the process's high-water mark (bounded by what it ever held at once) instead
of falling back after a burst. ``ENCODER_MALLOC_TUNING=false`` leaves glibc's defaults.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import platform

log = logging.getLogger(__name__)

MMAP_THRESHOLD = 64 * 1024 * 1024
"""Blocks up to this size come from the heap (and are reused) instead of a fresh mmap each time."""
TRIM_THRESHOLD = 256 * 1024 * 1024
"""Free memory kept at the top of a heap before it is given back to the kernel."""
TOP_PAD = 16 * 1024 * 1024
"""Extra bytes a heap grows by at once (fewer brk/mmap calls while it grows)."""

# glibc's mallopt parameter numbers (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3

_tuned = False


def tune_host_allocator(enabled: bool = True) -> bool:
    """Pin glibc's thresholds for this process (once); False when disabled or not glibc."""
    global _tuned
    if not enabled:
        return False
    if _tuned:
        return True
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = all(
            libc.mallopt(param, value) == 1
            for param, value in ((_M_MMAP_THRESHOLD, MMAP_THRESHOLD), (_M_TRIM_THRESHOLD, TRIM_THRESHOLD), (_M_TOP_PAD, TOP_PAD))
        )
    except (OSError, AttributeError) as exc:
        log.warning("host allocator left as it is: %s", exc)
        return False
    if not ok:
        log.warning("host allocator: mallopt refused a threshold; glibc defaults stay")
        return False
    _tuned = True
    log.info(
        "host allocator: blocks up to %d MiB from the heap, %d MiB of free memory kept (ENCODER_MALLOC_TUNING)",
        MMAP_THRESHOLD >> 20, TRIM_THRESHOLD >> 20,
    )
    return True
