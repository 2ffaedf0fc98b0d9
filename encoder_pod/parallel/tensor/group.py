"""Rank 0 of a tensor-parallel group: starts the followers, then broadcasts every forward.

The data-parallel worker hosts the :class:`EncoderRuntime` and its batcher as usual; the only
difference is its adapter loader (:meth:`TensorParallelGroup.load_adapter`), which returns a
:class:`TensorParallelAdapter`. Preprocessing (validation included) runs on rank 0 only, on the
batcher's preprocess thread (or its model thread, before the forward, when the model was idle), so
a malformed request fails there and never reaches a follower.
``forward`` then, under one lock, broadcasts a header and the input tensors and runs the sharded
forward: the lock makes dispatch order equal collective launch order on every rank. Warmup and
the health encode go through the batcher, hence through this same path. So does profiling:
/start_profile and /stop_profile broadcast PROFILE_START / PROFILE_STOP under the same lock, so every
rank starts and stops its own torch profiler between the same two forwards and writes its trace
into ``<output_dir>/tp-rank-<r>``; with ``num_steps`` rank 0 counts the forwards and broadcasts the
stop (followers never stop by themselves).

Failure: the group lives and dies as one process tree. A follower that exits, or a collective that
fails or times out, makes rank 0 kill the other followers and exit with
:attr:`~encoder_pod.exitcodes.ExitCode.TP_GROUP_DOWN`; the data-parallel supervisor then answers
the group's in-flight requests 503 and restarts it with backoff. Followers exit when rank 0 does
(they watch a pipe whose write end only rank 0 holds).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

import torch

import encoder_pod
from encoder_pod.errors import InvalidRequest
from encoder_pod.exitcodes import ExitCode
from encoder_pod.facts import ModelFacts, ModelIdentity, TensorParallelFacts
from encoder_pod.modality import Modality
from encoder_pod.models.base import BaseAdapter, EncodedPart, MediaItem, PreparedBatch, warm_up
from encoder_pod.parallel.tensor.beats import BeatReader
from encoder_pod.parallel.tensor.channel import Channel, metas_of
from encoder_pod.parallel.tensor.member import is_collective_failure, join, leave, open_store
from encoder_pod.parallel.tensor.messages import FollowerSpec, Header, Op, rank_dir
from encoder_pod.profiling import ProfileOptions, TorchProfiler
from encoder_pod.settings import EncoderSettings, ModelSettings

log = logging.getLogger(__name__)

STOP_WAIT_S = 10.0
"""How long stopped followers get to leave the process group before they are killed."""


class TensorParallelGroup:
    """The followers of one group and the dispatch lock that orders every collective."""

    def __init__(self, settings: EncoderSettings, label: str) -> None:
        self.settings = settings
        self.label = label
        self._lock = threading.Lock()
        self._seq = 0
        self._last_send = time.monotonic()
        self._channel: Channel | None = None
        self._followers: list[subprocess.Popen[bytes]] = []
        self._pipe_w: int | None = None
        self._beats: BeatReader | None = None
        self._serving = False
        self._closing = threading.Event()
        self._keepalive: threading.Thread | None = None
        self._profiler = TorchProfiler()  # rank 0's own; never counts steps (see _count_profiled_step)
        self._profile: ProfileOptions | None = None
        self._profile_steps_left: int | None = None
        self.profiler = GroupProfiler(self)
        """What the runtime uses instead of its own :class:`TorchProfiler`."""

    # --- start ------------------------------------------------------------------------------
    def load_adapter(self, model: ModelSettings) -> "TensorParallelAdapter":
        """The runtime's adapter loader: start followers, join the group, shard (blocking).

        ``model`` is the runtime's model group; it is this group's own (every rank loads the same).
        """
        assert model == self.settings.model, "a group serves the settings it was made with"
        parallel = self.settings.parallel
        store = open_store(0, parallel.tp_size, 0)
        self._start_followers(store.port)
        adapter, self._channel = join(self.settings, store, 0)
        self._serving = True
        if self._beats is not None:
            self._beats.serving()
        self._keepalive = threading.Thread(target=self._keepalive_loop, name="tp-keepalive", daemon=True)
        self._keepalive.start()
        return TensorParallelAdapter(adapter, self)

    @property
    def profiling(self) -> bool:
        """True while the group records a profile."""
        return self._profiler.active

    def _start_followers(self, port: int) -> None:
        settings = self.settings
        tp_size = settings.parallel.tp_size
        read_fd, self._pipe_w = os.pipe()
        beats = self._beats = BeatReader(range(1, tp_size), settings.parallel.dp_heartbeat_timeout, self._on_silent)
        env = dict(os.environ)
        root = str(Path(encoder_pod.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        try:
            for rank in range(1, tp_size):
                spec = FollowerSpec(self.label, rank, tp_size, port, settings.model_dump_json())
                cmd = [
                    sys.executable, "-m", "encoder_pod.parallel.tensor.follower",
                    spec.to_json(), str(read_fd), str(beats.write_fd),
                ]
                self._followers.append(subprocess.Popen(cmd, env=env, pass_fds=(read_fd, beats.write_fd)))
        finally:
            os.close(read_fd)  # only the followers hold the read end; rank 0 holds the write end
            beats.start()  # rank 0 reads the followers' heartbeats (and closes its copy of their write end)
        for rank, proc in enumerate(self._followers, start=1):
            threading.Thread(target=self._watch, args=(rank, proc), name=f"tp-watch-{rank}", daemon=True).start()
        log.info("tensor-parallel group %s: followers %s started", self.label, [p.pid for p in self._followers])

    # --- failure ----------------------------------------------------------------------------
    def _watch(self, rank: int, proc: subprocess.Popen[bytes]) -> None:
        code = proc.wait()
        if self._closing.is_set():
            return
        self.abort(f"rank {rank} (pid {proc.pid}) exited with {code}")

    def _on_silent(self, rank: int, seconds: float) -> None:
        """A follower sent no heartbeat for ENCODER_DP_HEARTBEAT_TIMEOUT: stopped or wedged."""
        if self._closing.is_set():
            return
        self.abort(f"rank {rank} sent no heartbeat for {seconds:.1f}s (stopped or hung; ENCODER_DP_HEARTBEAT_TIMEOUT)")

    def silent_followers(self, bound: float) -> list[tuple[int, float]]:
        """(rank, seconds) of every follower silent longer than ``bound``."""
        return self._beats.silent(bound) if self._beats is not None else []

    def abort(self, reason: str) -> None:
        """The group is broken: kill the followers and leave at once (the supervisor restarts us).

        A clean exit could hang: the model thread may sit in a collective with a dead peer.
        """
        code = ExitCode.TP_GROUP_DOWN if self._serving else ExitCode.MODEL_LOAD_FAILED
        log.critical("tensor-parallel group %s is down: %s; exiting so the group restarts", self.label, reason)
        self._closing.set()
        for proc in self._followers:
            if proc.poll() is None:
                proc.kill()
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(code)

    # --- steps ------------------------------------------------------------------------------
    def _send(self, header_op: Op, batch: PreparedBatch | None = None, profile: ProfileOptions | None = None) -> None:
        """Caller holds the lock. Any failure here leaves the ranks out of step: abort."""
        assert self._channel is not None
        self._seq += 1
        inputs = batch.inputs if batch is not None else {}
        header = Header(header_op, self._seq, metas_of(inputs), batch.item_tokens if batch is not None else [], profile)
        try:
            self._channel.send(header, inputs)
        except Exception as exc:  # noqa: BLE001 - a failed broadcast is a broken group, whatever its type
            self.abort(f"broadcast of step {self._seq} failed: {type(exc).__name__}: {exc}")
        self._last_send = time.monotonic()

    def forward(self, inner: BaseAdapter, batch: PreparedBatch) -> torch.Tensor:
        """Broadcast the batch and run the sharded forward on every rank, in one locked step."""
        metas_of(batch.inputs)  # a batch that cannot be broadcast fails here, before any collective
        with self._lock:
            if self._closing.is_set():
                raise RuntimeError(f"tensor-parallel group {self.label} is stopping")
            self._send(Op.FORWARD, batch)
            try:
                return inner.forward(batch)
            except Exception as exc:
                if is_collective_failure(exc):
                    self.abort(f"forward of step {self._seq} failed: {type(exc).__name__}: {exc}")
                # Any other error is deterministic on the same inputs: the followers raised at the
                # same point and went on to the next header, so the group is still in step.
                raise
            finally:
                self._count_profiled_step()

    # --- profiling --------------------------------------------------------------------------
    def start_profile(self, opts: ProfileOptions) -> dict[str, Any]:
        """Every rank starts its profiler, in dispatch order (options validated before any broadcast)."""
        tp_size = self.settings.parallel.tp_size
        with self._lock:
            if self._closing.is_set():
                raise RuntimeError(f"tensor-parallel group {self.label} is stopping")
            if self._profiler.active:
                raise InvalidRequest("a profile is already running; POST /stop_profile first")
            dirs = [Path(opts.output_dir) / rank_dir(r) for r in range(tp_size)]
            for path in dirs:  # one host: a directory that cannot be made fails here, for every rank
                path.mkdir(parents=True, exist_ok=True)
            self._send(Op.PROFILE_START, profile=opts)
            try:
                self._profiler.start(opts.under(rank_dir(0)))
            except Exception:
                self._send(Op.PROFILE_STOP)  # the followers started: undo, the group stays consistent
                raise
            self._profile, self._profile_steps_left = opts, opts.num_steps
        log.info("tensor-parallel group %s: profiling on %d ranks into %s", self.label, tp_size, opts.output_dir)
        return {"status": "ok", "output_dir": opts.output_dir, "tp_rank_dirs": [str(d) for d in dirs]}

    def stop_profile(self) -> dict[str, Any]:
        """Every rank stops its profiler and writes its trace, in dispatch order."""
        with self._lock:
            if not self._profiler.active:
                raise InvalidRequest("no profile is running; POST /start_profile first")
            return self._stop_profile_locked()

    def _stop_profile_locked(self) -> dict[str, Any]:
        opts, self._profile, self._profile_steps_left = self._profile, None, None
        self._send(Op.PROFILE_STOP)
        answer = self._profiler.stop()
        if opts is not None:
            answer["tp_rank_dirs"] = [str(Path(opts.output_dir) / rank_dir(r)) for r in range(self.settings.parallel.tp_size)]
        return answer

    def _count_profiled_step(self) -> None:
        """Caller holds the lock. num_steps: rank 0 counts forwards and broadcasts the stop."""
        if self._profile_steps_left is None:
            return
        self._profile_steps_left -= 1
        if self._profile_steps_left <= 0:
            try:
                self._stop_profile_locked()
            except Exception as exc:  # noqa: BLE001 - the forward's answer matters more than its trace
                log.warning("tensor-parallel group %s: profile auto-stop failed: %s", self.label, exc)

    def _keepalive_loop(self) -> None:
        """An idle follower waits in a broadcast bounded by the collective timeout: feed it."""
        interval = self.settings.parallel.tp_collective_timeout / 4
        while not self._closing.wait(interval / 2):
            if time.monotonic() - self._last_send < interval:
                continue
            with self._lock:
                if not self._closing.is_set():
                    self._send(Op.KEEPALIVE)

    # --- stop -------------------------------------------------------------------------------
    def close(self) -> None:
        """Tell the followers to stop, wait for them (kill stragglers), leave the process group."""
        with self._lock:
            if self._closing.is_set():
                return
            self._closing.set()
            if self._beats is not None:
                self._beats.close()
            if self._profiler.active:
                try:
                    self._profiler.stop()
                except Exception as exc:  # noqa: BLE001 - stopping anyway
                    log.warning("tensor-parallel group %s: profile stop failed: %s", self.label, exc)
            if self._channel is not None:
                try:
                    self._send_stop()
                except Exception as exc:  # noqa: BLE001 - stopping anyway; stragglers are killed below
                    log.warning("tensor-parallel group %s: stop broadcast failed: %s", self.label, exc)
        deadline = time.monotonic() + STOP_WAIT_S
        for proc in self._followers:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("tensor-parallel group %s: follower pid %d did not stop; killing it", self.label, proc.pid)
                proc.kill()
                proc.wait()
        if self._pipe_w is not None:
            os.close(self._pipe_w)
            self._pipe_w = None
        leave()

    def _send_stop(self) -> None:
        assert self._channel is not None
        self._seq += 1
        self._channel.send(Header(Op.STOP, self._seq), {})

    def facts(self) -> TensorParallelFacts:
        """The group in /server_info."""
        return TensorParallelFacts(self.settings.parallel.tp_size, self.label, tuple(p.pid for p in self._followers), self._seq)


class GroupProfiler:
    """The runtime's :class:`~encoder_pod.profiling.Profiler` on rank 0 of a group: start and stop
    go to every rank of the group.

    ``step`` does nothing: the group counts forwards under its dispatch lock (num_steps).
    """

    def __init__(self, group: TensorParallelGroup) -> None:
        self._group = group

    @property
    def active(self) -> bool:
        """True while the group records a profile."""
        return self._group.profiling

    def start(self, options: dict[str, Any] | ProfileOptions) -> dict[str, Any]:
        """Broadcast PROFILE_START, start rank 0's profiler (a malformed body never reaches a follower)."""
        opts = options if isinstance(options, ProfileOptions) else ProfileOptions.parse(options)
        return self._group.start_profile(opts)

    def step(self) -> None:
        """Counted by the group."""

    def stop(self) -> dict[str, Any]:
        """Broadcast PROFILE_STOP, stop rank 0's profiler."""
        return self._group.stop_profile()


class TensorParallelAdapter:
    """The wrapped adapter on rank 0 (an :class:`~encoder_pod.models.base.EncoderAdapter`):
    everything runs here except ``forward``, which is broadcast."""

    def __init__(self, inner: BaseAdapter, group: TensorParallelGroup) -> None:
        self.inner = inner
        self.group = group

    @property
    def name(self) -> str:
        """As the wrapped adapter."""
        return self.inner.name

    @property
    def modalities(self) -> frozenset[Modality]:
        """As the wrapped adapter."""
        return self.inner.modalities

    def warmup(self) -> None:
        """One real encode through this adapter, so the forward is broadcast to every rank."""
        warm_up(self)

    def measure(self, item: MediaItem) -> int:
        """As the wrapped adapter (rank 0 only)."""
        return self.inner.measure(item)

    def preprocess(self, requests: Sequence[Sequence[MediaItem]]) -> PreparedBatch:
        """As the wrapped adapter, on rank 0 only: a request that fails here is never broadcast."""
        return self.inner.preprocess(requests)

    def forward(self, batch: PreparedBatch) -> torch.Tensor:
        """Broadcast, then the sharded forward on every rank."""
        return self.group.forward(self.inner, batch)

    def postprocess(self, output: torch.Tensor, batch: PreparedBatch) -> list[EncodedPart]:
        """As the wrapped adapter (the output is replicated; rank 0's copy is the answer)."""
        return self.inner.postprocess(output, batch)

    def health_item(self, modality: Modality) -> MediaItem:
        """As the wrapped adapter."""
        return self.inner.health_item(modality)

    @property
    def sample_rate(self) -> int | None:
        """As the wrapped adapter."""
        return self.inner.sample_rate

    @property
    def hidden_size(self) -> int:
        """As the wrapped adapter."""
        return self.inner.hidden_size

    def identity(self) -> ModelIdentity:
        """As the wrapped adapter (the cache's namespace adds the tensor-parallel size)."""
        return self.inner.identity()

    def facts(self) -> ModelFacts:
        """The wrapped adapter's facts plus the group."""
        return replace(self.inner.facts(), tensor_parallel=self.group.facts())
