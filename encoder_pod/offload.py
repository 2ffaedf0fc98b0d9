"""CPU work that must not run on an event loop: a small pool of threads per owner.

An event loop that answers ``/health`` (the HTTP edge, the data-parallel front, a worker's
message loop) hands anything over about a millisecond of CPU to an :class:`Offload`: parsing a
large body, msgpack or base64 of an embedding, rendering a large answer. A thread alone does not
free the loop from the GIL, so the work itself is written in slices (see ``transfer.inline``,
``api.json_body``): between slices the GIL goes back to the loop.
"""

from __future__ import annotations

import asyncio
import functools
import gc
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


def freeze_startup_objects() -> None:
    """Exempt every object alive now (modules, the model, its processor) from garbage collection scans.

    With torch and transformers imported a full collection walks some 400k objects and holds the
    GIL for close to 100 ms, stalling the loop; after a freeze it only walks what requests
    allocate. Call once start-up is done (a later call freezes what was added since).
    """
    gc.collect()
    gc.freeze()


class Offload:
    """A few threads for one owner's CPU work; :meth:`close` when the owner stops."""

    def __init__(self, workers: int = 2, name: str = "offload") -> None:
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix=name)

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)`` on one of the threads; the caller's loop stays free."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    def close(self) -> None:
        """Stop the threads (work already running finishes; queued work is dropped)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
