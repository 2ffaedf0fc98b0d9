"""Exit codes of ``encoder-pod`` and of the processes it starts (DP workers, tensor-parallel ranks).

One enum for every process of a pod, at the bottom layer so any module can name a code without
importing the module that exits with it. The operator reads ``MODEL_LOAD_FAILED`` from a pod's
last termination state (it reports such a pod as ModelLoadFailed); it may not import this
package, so it mirrors the value in ``encoderpool_operator.podstate.MODEL_LOAD_EXIT_CODE`` and a
unit test pins the two equal.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """How a process of the encoder pod ended."""

    OK = 0
    """Stopped as asked (SIGTERM drain, a front's Stop message, make-tiny-model done)."""
    BAD_SETTINGS = 2
    """A setting is out of its bounds, or the model cannot be served with it (e.g. --tp-size)."""
    MODEL_LOAD_FAILED = 3
    """The model was not found or did not load; a DP worker's failed start, not a crash."""
    ORPHANED = 4
    """A DP worker whose front died, or a tensor-parallel follower whose rank 0 died."""
    TP_GROUP_DOWN = 5
    """A tensor-parallel rank died, or a collective failed or timed out: the group restarts."""
