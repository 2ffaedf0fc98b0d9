"""A follower rank (1..T-1) of a tensor-parallel group: receive a header, its tensors, forward, discard.

Started by rank 0 as ``python -m encoder_pod.parallel.tensor.follower SPEC_JSON PIPE_FD BEAT_FD`` (a fresh
interpreter: the data-parallel worker is a daemon process and may not use multiprocessing
children). It never sees a request: only tensors rank 0 already validated and preprocessed. It
starts and stops its own torch profiler when rank 0's header says so (PROFILE_START / PROFILE_STOP,
between the same forwards as rank 0), writing into ``<output_dir>/tp-rank-<rank>``. It exits when
rank 0 does (the pipe's write end closes), when told to stop, when a header is not one it knows
(a different install: the group fails loudly rather than drift out of step), or when a collective
fails (rank 0 then takes the group down).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

from encoder_pod.exitcodes import ExitCode
from encoder_pod.parallel.tensor.beats import beat_forever
from encoder_pod.parallel.tensor.messages import FollowerSpec, Header, Op, WireError, rank_dir
from encoder_pod.profiling import TorchProfiler
from encoder_pod.settings import EncoderSettings

log = logging.getLogger(__name__)


def _watch_leader(fd: int) -> None:
    """Leave at once when rank 0 is gone: read() returns EOF when its write end closes."""

    def wait() -> None:
        while os.read(fd, 1):
            pass
        # The main thread may sit in a collective whose peer is gone: no clean exit.
        log.error("rank 0 of the group is gone; follower exits")
        os._exit(ExitCode.ORPHANED)

    threading.Thread(target=wait, name="tp-leader-watch", daemon=True).start()


def main(argv: list[str]) -> int:
    """Entry point: join the group, then follow rank 0's headers until STOP."""
    spec_json, pipe_fd, beat_fd = argv[1], int(argv[2]), int(argv[3])
    # Ctrl-C reaches the whole process group; rank 0 decides how the group stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _watch_leader(pipe_fd)
    spec = FollowerSpec.from_json(spec_json)
    beat_forever(beat_fd, spec.rank)  # before torch loads: rank 0 hears this process from the start
    settings = EncoderSettings.model_validate_json(spec.settings_json)
    logging.basicConfig(
        level=settings.observability.log_level.upper(),
        format=f"%(asctime)s %(levelname)s [{spec.label} tp-rank {spec.rank}] %(name)s: %(message)s",
        force=True,
    )
    return Follower(spec, settings).run()


class Follower:
    """One follower's loop."""

    def __init__(self, spec: FollowerSpec, settings: EncoderSettings) -> None:
        self.spec = spec
        self.settings = settings
        self.steps = 0
        self.profiler: TorchProfiler | None = None

    def _profile(self, header: Header) -> None:
        """PROFILE_START / PROFILE_STOP: no collective, so a local failure leaves the group in step."""
        if self.profiler is None:
            self.profiler = TorchProfiler()
        try:
            if header.op is Op.PROFILE_START:
                assert header.profile is not None  # Header.decode checks it
                # num_steps is rank 0's to count: it broadcasts PROFILE_STOP after that many forwards.
                self.profiler.start(header.profile.under(rank_dir(self.spec.rank)))
            elif self.profiler.active:
                log.info("profile written: %s", self.profiler.stop()["trace"])
            else:
                log.warning("step %d: PROFILE_STOP but no profile is running here", header.seq)
        except Exception as exc:  # noqa: BLE001 - a missing trace must not take the group down
            log.warning("step %d: %s failed on this rank: %s", header.seq, header.op.name, exc)

    def run(self) -> int:
        """Join, then follow; returns the exit code."""
        # torch and the model stack load here, after the leader watch is up (they take seconds).
        import torch

        from encoder_pod.allocator import tune_host_allocator
        from encoder_pod.models.base import PreparedBatch
        from encoder_pod.parallel.tensor.member import is_collective_failure, join, leave, open_store

        tune_host_allocator(self.settings.model.malloc_tuning)
        if self.settings.model.num_threads:
            torch.set_num_threads(self.settings.model.num_threads)
        store = open_store(self.spec.rank, self.spec.tp_size, self.spec.store_port)
        adapter, channel = join(self.settings, store, self.spec.rank)
        expected = 0
        while True:
            try:
                header = channel.receive_header()
                expected += 1
                if header.seq != expected:
                    raise WireError(f"step {header.seq} after {expected - 1}: ranks out of step")
                if header.op is Op.STOP:
                    break
                if header.op is Op.KEEPALIVE:
                    continue
                if header.op in (Op.PROFILE_START, Op.PROFILE_STOP):
                    self._profile(header)
                    continue
                if header.op is not Op.FORWARD:
                    raise WireError(f"step {header.seq}: no handler for {header.op!r}")
                inputs = channel.receive_tensors(header.tensors)
            except Exception:  # noqa: BLE001 - a failed receive is a broken group
                log.exception("receive failed; leaving the group")
                return ExitCode.TP_GROUP_DOWN
            batch = PreparedBatch(inputs=inputs, item_tokens=header.item_tokens)
            try:
                adapter.forward(batch)  # the output is replicated: rank 0's copy is the answer
            except Exception as exc:  # noqa: BLE001 - see below
                if is_collective_failure(exc):
                    log.exception("forward of step %d failed in a collective; leaving the group", header.seq)
                    return ExitCode.TP_GROUP_DOWN
                # Same inputs, same code: rank 0 raised at the same point and answers the error.
                log.warning("forward of step %d failed on every rank: %s", header.seq, exc)
            self.steps += 1
        if self.profiler is not None and self.profiler.active:
            try:
                log.info("profile written at stop: %s", self.profiler.stop()["trace"])
            except Exception as exc:  # noqa: BLE001 - stopping anyway
                log.warning("profile stop at STOP failed: %s", exc)
        leave()
        log.info("stopped after %d forwards", self.steps)
        return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main(sys.argv))
