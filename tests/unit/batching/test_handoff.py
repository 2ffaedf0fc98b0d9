"""The scheduler's hand-off: batches form when the model is about to be free, one batch ahead at most.

The model is a scripted stand-in (one row per request, the row holds the request's number) whose
forwards end when the test opens a gate: the subject is when the scheduler forms and preprocesses
batches, which only a forward that lasts exactly as long as the test says can show without
timing. The rest is the real scheduler on a real event loop and real threads.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from typing import Any, Callable, Sequence

import pytest
import torch

from encoder_pod.batching.entry import PendingEntry
from encoder_pod.batching.pacing import Pacing, ServiceEstimate
from encoder_pod.batching.scheduler import BatchScheduler
from encoder_pod.errors import InternalError, ItemError, ShuttingDown
from encoder_pod.metrics import ReplicaMetrics
from encoder_pod.modality import Modality
from encoder_pod.models.base import MediaItem, PreparedBatch, slice_output
from encoder_pod.protocol import EncodeRequest, ItemSpec
from encoder_pod.settings import load_settings

pytestmark = pytest.mark.unit

WAIT_S = 20.0
"""Generous: how long a test waits for something the scheduler must do (a loaded machine is slow)."""


class ScriptedModel:
    """Records every preprocess and forward; forwards wait for :attr:`gate`; ``bad`` requests fail preprocessing."""

    modalities = frozenset({Modality.IMAGE, Modality.VIDEO})

    def __init__(self, bad: Sequence[int] = ()) -> None:
        self.gate = threading.Event()
        self.bad = set(bad)
        self.preprocessed: list[list[int]] = []
        self.preprocess_threads: list[str] = []
        self.forwards: list[list[int]] = []

    def preprocess(self, requests: Sequence[Sequence[MediaItem]]) -> PreparedBatch:
        ids = [int(items[0].data) for items in requests]
        if self.bad & set(ids):
            raise RuntimeError(f"cannot preprocess {sorted(self.bad & set(ids))}")
        self.preprocessed.append(ids)
        self.preprocess_threads.append(threading.current_thread().name.split("_")[0])
        return PreparedBatch(inputs={"ids": ids}, item_tokens=[[1] for _ in ids])

    def forward(self, batch: PreparedBatch) -> torch.Tensor:
        self.forwards.append(batch.inputs["ids"])
        assert self.gate.wait(WAIT_S), "the test never opened the gate"
        return torch.tensor([[float(i)] for i in batch.inputs["ids"]])

    def postprocess(self, output: torch.Tensor, batch: PreparedBatch) -> list[Any]:
        return slice_output(output, batch)


def _entry(n: int, modality: Modality = Modality.IMAGE) -> PendingEntry:
    return PendingEntry(
        request=EncodeRequest(f"r{n}", modality, (ItemSpec("x"),)),
        items=[MediaItem(modality, n)],
        item_tokens=[1],
        future=asyncio.get_running_loop().create_future(),
        admitted_at=time.monotonic(),
    )


async def _until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


async def _settle() -> None:
    """Give the scheduler's tasks and threads time to do whatever they would do now."""
    for _ in range(5):
        await asyncio.sleep(0.02)


def _scheduler(model: ScriptedModel, pacing: Pacing | None = None, **env: str) -> tuple[BatchScheduler, ReplicaMetrics]:
    metrics = ReplicaMetrics()
    settings = load_settings(env={"ENCODER_MAX_BATCH_SIZE": "8", **env}).batching
    return BatchScheduler(model, settings, metrics, pacing=pacing), metrics  # type: ignore[arg-type]


def _pacing(forward_s: float) -> Pacing:
    """Pacing that has seen one-row forwards take ``forward_s`` and preprocessing take nothing."""
    pacing = Pacing(preprocess=ServiceEstimate(), forward=ServiceEstimate())
    for _ in range(3):
        pacing.forward.observe(1, forward_s)
        pacing.preprocess.observe(1, 0.0)
    return pacing


def on_a_loop(test: Callable[[], Any]) -> Callable[[], None]:
    """Run an async test on a fresh event loop."""
    @functools.wraps(test)
    def run() -> None:
        asyncio.run(test())

    return run


def _rows(entries: list[PendingEntry]) -> list[float]:
    return [float(e.future.result().embedding[0, 0]) for e in entries]


async def _arrivals_during_a_forward(pacing: Pacing | None) -> ScriptedModel:
    """Request 0 runs alone; 1..4 arrive one at a time while its forward runs; then it ends."""
    model = ScriptedModel()
    scheduler, metrics = _scheduler(model, pacing)
    scheduler.start()
    entries = [_entry(0)]
    scheduler.submit(entries[0])
    await _until(lambda: model.forwards == [[0]], "the first forward")
    for n in range(1, 5):
        entries.append(_entry(n))
        scheduler.submit(entries[-1])
        await _settle()
    assert model.preprocessed == [[0]], "a batch was formed while the model was far from free"
    model.gate.set()
    await asyncio.wait_for(asyncio.gather(*(e.future for e in entries)), WAIT_S)
    assert _rows(entries) == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert metrics.batch_size._sum.get() == 5 and len(model.forwards) == 2
    await scheduler.stop()
    return model


@on_a_loop
async def test_requests_arriving_during_a_forward_of_unknown_length_share_the_next_batch():
    model = await _arrivals_during_a_forward(None)
    assert model.forwards == [[0], [1, 2, 3, 4]]


@on_a_loop
async def test_requests_arriving_long_before_the_model_is_free_share_the_next_batch():
    model = await _arrivals_during_a_forward(_pacing(forward_s=600.0))
    assert model.forwards == [[0], [1, 2, 3, 4]]


@on_a_loop
async def test_preprocessing_overlaps_the_forward_but_only_one_batch_runs_ahead():
    model = ScriptedModel()
    scheduler, _ = _scheduler(model, _pacing(forward_s=0.0))  # the model looks about to be free at once
    scheduler.start()
    entries = [_entry(0), _entry(1)]
    scheduler.submit(entries[0])
    await _until(lambda: model.forwards == [[0]], "the first forward")
    scheduler.submit(entries[1])
    await _until(lambda: model.preprocessed == [[0], [1]], "the next batch preprocessed during the forward")
    for n in (2, 3, 4):
        entries.append(_entry(n))
        scheduler.submit(entries[-1])
    await _settle()
    assert model.preprocessed == [[0], [1]], "more than one batch was formed ahead of the model"
    model.gate.set()
    await asyncio.wait_for(asyncio.gather(*(e.future for e in entries)), WAIT_S)
    assert model.forwards == [[0], [1], [2, 3, 4]]
    assert _rows(entries) == [0.0, 1.0, 2.0, 3.0, 4.0]
    # The idle model preprocessed its batch itself (no hand-off); the batch formed during the held
    # forward was preprocessed on the preprocess thread, overlapping it. (The last one formed
    # either way, depending on whether the runner was still busy with the second.)
    assert model.preprocess_threads[:2] == ["model", "preprocess"]
    await scheduler.stop()


@on_a_loop
async def test_an_idle_model_starts_at_once_and_video_runs_alone():
    model = ScriptedModel()
    model.gate.set()
    scheduler, _ = _scheduler(model)
    scheduler.start()
    first = _entry(0)
    scheduler.submit(first)
    await asyncio.wait_for(first.future, WAIT_S)  # nothing else came: it did not wait for company
    model.gate.clear()
    videos = [_entry(1, Modality.VIDEO)]
    scheduler.submit(videos[0])
    await _until(lambda: len(model.forwards) == 2, "the first video's forward")
    videos += [_entry(n, Modality.VIDEO) for n in (2, 3)]
    for entry in videos[1:]:
        scheduler.submit(entry)
    model.gate.set()
    await asyncio.wait_for(asyncio.gather(*(e.future for e in videos)), WAIT_S)
    assert model.forwards == [[0], [1], [2], [3]]
    await scheduler.stop()


@on_a_loop
async def test_a_request_to_an_idle_model_goes_straight_to_it_and_the_next_one_queues():
    model = ScriptedModel()
    scheduler, metrics = _scheduler(model, _pacing(forward_s=600.0))
    scheduler.start()
    await _settle()
    entries = [_entry(0), _entry(1), _entry(2)]
    scheduler.submit(entries[0])
    # Handed to the runner within submit (no former turn): nobody else counts the model as idle.
    assert not scheduler.idle and scheduler.depth == 0
    scheduler.submit(entries[1])  # the same loop turn
    scheduler.submit(entries[2])
    assert scheduler.depth == 2
    await _until(lambda: model.forwards == [[0]], "the first forward")
    await _settle()
    assert model.forwards == [[0]] and model.preprocessed == [[0]], "a second batch ran alongside the first"
    model.gate.set()
    await asyncio.wait_for(asyncio.gather(*(e.future for e in entries)), WAIT_S)
    assert model.forwards == [[0], [1, 2]] and _rows(entries) == [0.0, 1.0, 2.0]
    assert metrics.batch_size._sum.get() == 3
    await scheduler.stop()


@on_a_loop
async def test_one_bad_request_fails_alone_and_a_gone_caller_is_dropped_before_compute():
    model = ScriptedModel(bad=[2])
    scheduler, metrics = _scheduler(model)
    scheduler.start()
    entries = [_entry(n) for n in range(5)]
    scheduler.submit(entries[0])
    await _until(lambda: model.forwards == [[0]], "the first forward")
    for entry in entries[1:]:
        scheduler.submit(entry)
    entries[4].future.cancel()  # its caller went away while it waited
    model.gate.set()
    await asyncio.wait_for(asyncio.gather(*(e.future for e in entries[:4]), return_exceptions=True), WAIT_S)
    assert _rows([entries[0], entries[1], entries[3]]) == [0.0, 1.0, 3.0]
    assert isinstance(entries[2].future.exception(), InternalError)
    assert model.forwards == [[0], [1], [3]]  # the batch [1, 2, 3] failed preprocessing and was retried alone
    assert metrics.batch_failures.labels(stage="preprocess")._value.get() == 1
    assert metrics.dropped.labels(reason="client_gone")._value.get() == 1
    await scheduler.stop()


@on_a_loop
async def test_stop_answers_every_request_wherever_it_is():
    model = ScriptedModel()
    scheduler, _ = _scheduler(model, _pacing(forward_s=0.0))
    scheduler.start()
    entries = [_entry(n) for n in range(4)]
    scheduler.submit(entries[0])
    await _until(lambda: model.forwards == [[0]], "the first forward")
    scheduler.submit(entries[1])
    await _until(lambda: len(model.preprocessed) == 2, "the next batch prepared")
    scheduler.submit(entries[2])
    scheduler.submit(entries[3])
    await scheduler.stop(grace=0.0)  # one running, one prepared, two waiting
    model.gate.set()
    for entry in entries:
        assert entry.future.done() and isinstance(entry.future.exception(), ShuttingDown)


def _undecoded(n: int, decode_threads: list[str], error: Exception | None = None) -> PendingEntry:
    """Entry ``n`` submitted with its items still to decode (as the runtime does for an idle model)."""
    def decode() -> list[tuple[MediaItem, int]]:
        decode_threads.append(threading.current_thread().name.split("_")[0])
        if error is not None:
            raise error
        return [(MediaItem(Modality.IMAGE, n), 1)]

    entry = _entry(n)
    entry.items, entry.item_tokens, entry.decode = [], [], decode
    return entry


@on_a_loop
async def test_an_idle_model_decodes_a_request_on_its_own_thread_and_runs_it_alone():
    model = ScriptedModel()
    scheduler, metrics = _scheduler(model, _pacing(forward_s=600.0))
    scheduler.start()
    assert scheduler.idle
    threads: list[str] = []
    first = _undecoded(0, threads)
    scheduler.submit(first)
    assert not scheduler.idle, "a second request would also be submitted undecoded"
    await _until(lambda: model.forwards == [[0]], "the first forward")
    later = [_entry(n) for n in (1, 2)]
    for entry in later:
        scheduler.submit(entry)
    await _settle()
    model.gate.set()
    await asyncio.wait_for(asyncio.gather(first.future, *(e.future for e in later)), WAIT_S)
    assert threads == ["model"] and model.preprocess_threads[0] == "model"
    assert model.forwards == [[0], [1, 2]], "requests that came during the first one's forward share the next"
    assert _rows([first, *later]) == [0.0, 1.0, 2.0]
    await _until(lambda: scheduler.idle, "the model idle again")
    await scheduler.stop()


@on_a_loop
async def test_a_request_whose_items_fail_to_decode_on_the_model_thread_gets_its_own_error():
    model = ScriptedModel()
    model.gate.set()
    scheduler, _ = _scheduler(model)
    scheduler.start()
    threads: list[str] = []
    bad = _undecoded(0, threads, ItemError(0, "cannot identify image file"))
    scheduler.submit(bad)
    await asyncio.wait_for(asyncio.gather(bad.future, return_exceptions=True), WAIT_S)
    error = bad.future.exception()
    assert isinstance(error, ItemError) and error.http_status == 400 and "mm_items[0]" in error.message
    good = _entry(1)
    scheduler.submit(good)
    await asyncio.wait_for(good.future, WAIT_S)
    assert _rows([good]) == [1.0] and model.forwards == [[1]] and threads == ["model"]
    await scheduler.stop()


def test_no_idle_lane_while_max_wait_ms_holds_batches_for_companions():
    scheduler, _ = _scheduler(ScriptedModel(), ENCODER_MAX_WAIT_MS="50")
    assert not scheduler.idle


@on_a_loop
async def test_a_request_decoded_on_the_model_thread_still_lets_the_next_batch_overlap_its_forward():
    """Until its items are decoded the forward's length is unknown; after, the former plans around it."""
    model = ScriptedModel()
    scheduler, _ = _scheduler(model, _pacing(forward_s=0.0))  # the forward looks about to end at once
    scheduler.start()
    first = _undecoded(0, [])
    scheduler.submit(first)
    await _until(lambda: model.forwards == [[0]], "the first forward")
    second = _entry(1)
    scheduler.submit(second)
    await _until(lambda: model.preprocessed == [[0], [1]], "the next batch preprocessed during the forward")
    assert model.preprocess_threads == ["model", "preprocess"]
    model.gate.set()
    await asyncio.wait_for(asyncio.gather(first.future, second.future), WAIT_S)
    assert model.forwards == [[0], [1]] and _rows([first, second]) == [0.0, 1.0]
    await scheduler.stop()
