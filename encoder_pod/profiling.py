"""/start_profile and /stop_profile: the torch profiler around the model thread's work."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from encoder_pod.errors import InvalidRequest

log = logging.getLogger(__name__)

_ACTIVITIES = {"CPU", "GPU", "CUDA"}


class Profiler:
    """One torch profiler session at a time; stops itself after ``num_steps`` forwards if given."""

    def __init__(self) -> None:
        self._prof: Any = None
        self._dir: Path | None = None
        self._steps_left: int | None = None

    @property
    def active(self) -> bool:
        """True while a profile is being recorded."""
        return self._prof is not None

    def start(self, options: dict[str, Any]) -> dict[str, Any]:
        """Start recording (call on the model thread). Body fields as SGLang's /start_profile."""
        import torch.profiler as tp

        if self._prof is not None:
            raise InvalidRequest("a profile is already running; POST /stop_profile first")
        names = {str(a).upper() for a in (options.get("activities") or ["CPU"])}
        if not names <= _ACTIVITIES:
            raise InvalidRequest(f"field 'activities': unknown {sorted(names - _ACTIVITIES)}; use CPU, GPU")
        activities = [tp.ProfilerActivity.CPU] if "CPU" in names else []
        if names & {"GPU", "CUDA"}:
            activities.append(tp.ProfilerActivity.CUDA)
        num_steps = options.get("num_steps")
        if num_steps is not None and (not isinstance(num_steps, int) or num_steps < 1):
            raise InvalidRequest("field 'num_steps': must be a positive integer")
        self._dir = Path(options.get("output_dir") or "/tmp/encoder-profiles")
        self._dir.mkdir(parents=True, exist_ok=True)
        self._steps_left = num_steps
        self._prof = tp.profile(
            activities=activities,
            with_stack=bool(options.get("with_stack", False)),
            record_shapes=bool(options.get("record_shapes", False)),
        )
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
