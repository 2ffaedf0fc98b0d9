"""/start_profile and /stop_profile: the torch profiler around the model thread's work.

:class:`Profiler` is what the runtime drives; :class:`TorchProfiler` records this process, and a
tensor-parallel group's rank 0 brings its own (``GroupProfiler``) that reaches every rank.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from encoder_pod.errors import InvalidRequest

log = logging.getLogger(__name__)

_ACTIVITIES = {"CPU", "GPU", "CUDA"}

DEFAULT_OUTPUT_DIR = "/tmp/encoder-profiles"


@dataclass(frozen=True)
class ProfileOptions:
    """A validated /start_profile body (fields as SGLang's)."""

    output_dir: str = DEFAULT_OUTPUT_DIR
    activities: tuple[str, ...] = ("CPU",)
    with_stack: bool = False
    record_shapes: bool = False
    num_steps: int | None = None
    """Stop by itself after this many forwards (None: until /stop_profile)."""

    @classmethod
    def parse(cls, options: dict[str, Any]) -> "ProfileOptions":
        """:class:`InvalidRequest` naming the field when the body is malformed."""
        if not isinstance(options, dict):
            raise InvalidRequest("body must be a JSON object")
        output_dir = options.get("output_dir") or DEFAULT_OUTPUT_DIR
        if not isinstance(output_dir, str):
            raise InvalidRequest("field 'output_dir': must be a path")
        raw = options.get("activities") or ["CPU"]
        if not isinstance(raw, (list, tuple)) or not all(isinstance(a, str) for a in raw):
            raise InvalidRequest("field 'activities': must be a list of names (CPU, GPU)")
        names = {a.upper() for a in raw}
        if not names <= _ACTIVITIES:
            raise InvalidRequest(f"field 'activities': unknown {sorted(names - _ACTIVITIES)}; use CPU, GPU")
        num_steps = options.get("num_steps")
        if num_steps is not None and (isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1):
            raise InvalidRequest("field 'num_steps': must be a positive integer")
        return cls(
            output_dir=output_dir,
            activities=tuple(sorted(names)),
            with_stack=bool(options.get("with_stack", False)),
            record_shapes=bool(options.get("record_shapes", False)),
            num_steps=num_steps,
        )

    def under(self, subdir: str, *, num_steps: int | None = None) -> "ProfileOptions":
        """These options writing into ``<output_dir>/<subdir>`` with ``num_steps`` (default: none)."""
        return replace(self, output_dir=str(Path(self.output_dir) / subdir), num_steps=num_steps)


class Profiler(Protocol):
    """What the runtime needs of a profiler; every method runs on the model thread."""

    @property
    def active(self) -> bool:
        """True while a profile is being recorded."""
        ...

    def start(self, options: dict[str, Any] | ProfileOptions) -> dict[str, Any]:
        """Start recording; :class:`InvalidRequest` for a malformed body or one already running."""
        ...

    def step(self) -> None:
        """One forward ran (``num_steps`` counting)."""
        ...

    def stop(self) -> dict[str, Any]:
        """Stop recording and write the trace; the answer says where it went."""
        ...


class TorchProfiler:
    """One torch profiler session at a time; stops itself after ``num_steps`` forwards if given."""

    def __init__(self) -> None:
        self._prof: Any = None
        self._dir: Path | None = None
        self._steps_left: int | None = None

    @property
    def active(self) -> bool:
        """True while a profile is being recorded."""
        return self._prof is not None

    def start(self, options: dict[str, Any] | ProfileOptions) -> dict[str, Any]:
        """Start recording (call on the model thread). Body fields as SGLang's /start_profile."""
        import torch.profiler as tp

        if self._prof is not None:
            raise InvalidRequest("a profile is already running; POST /stop_profile first")
        opts = options if isinstance(options, ProfileOptions) else ProfileOptions.parse(options)
        names = set(opts.activities)
        activities = [tp.ProfilerActivity.CPU] if "CPU" in names else []
        if names & {"GPU", "CUDA"}:
            activities.append(tp.ProfilerActivity.CUDA)
        self._dir = Path(opts.output_dir)
        self._dir.mkdir(parents=True, exist_ok=True)
        self._steps_left = opts.num_steps
        self._prof = tp.profile(activities=activities, with_stack=opts.with_stack, record_shapes=opts.record_shapes)
        self._prof.__enter__()
        log.info("profiling started into %s", self._dir)
        return {"status": "ok", "output_dir": str(self._dir)}

    def step(self) -> None:
        """Count one forward; stop when the requested number of steps is reached."""
        if self._prof is None or self._steps_left is None:
            return
        self._steps_left -= 1
        if self._steps_left <= 0:
            self.stop()

    def stop(self) -> dict[str, Any]:
        """Stop and write a Chrome trace; returns where it went."""
        if self._prof is None:
            raise InvalidRequest("no profile is running; POST /start_profile first")
        prof, self._prof = self._prof, None
        prof.__exit__(None, None, None)
        assert self._dir is not None
        path = self._dir / f"encoder-trace-{int(time.time() * 1000)}.json"
        prof.export_chrome_trace(str(path))
        log.info("profile written to %s", path)
        return {"status": "ok", "trace": str(path)}
