"""The admission permit's life: taken at admission, released exactly once however the request ends."""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

import pytest

from encoder_pod.batching.admission import Admission
from encoder_pod.errors import DuplicateRequest, InternalError, NotReady, Overloaded, RequestTimeout, ShuttingDown

pytestmark = pytest.mark.unit


class Gauge:
    def __init__(self) -> None:
        self.values: list[float] = []

    def set(self, value: float) -> None:
        self.values.append(value)


async def _succeeds(admission: Admission) -> str:
    async with admission.admit("r"):
        await asyncio.sleep(0)
        return "answer"


async def _fails(admission: Admission) -> str:
    async with admission.admit("r"):
        raise InternalError("forward failed")


async def _times_out(admission: Admission) -> str:
    async with admission.admit("r"):
        await asyncio.wait_for(asyncio.sleep(10), 0.01)
    return "unreachable"


async def _client_gone(admission: Admission) -> str:
    async def request() -> None:
        async with admission.admit("r"):
            await asyncio.sleep(10)

    task = asyncio.ensure_future(request())
    await asyncio.sleep(0.01)
    assert admission.in_flight == 1  # held while the request runs
    task.cancel()  # what the HTTP edge does when the caller disconnects
    await asyncio.gather(task, return_exceptions=True)
    raise asyncio.CancelledError()


@pytest.mark.parametrize(
    "scenario, outcome",
    [
        (_succeeds, "answer"),
        (_fails, InternalError),
        (_times_out, TimeoutError),
        (_client_gone, asyncio.CancelledError),
    ],
    ids=["success", "error", "timeout", "client-gone"],
)
def test_the_permit_is_released_exactly_once_however_the_request_ends(
    scenario: Callable[[Admission], Awaitable[str]], outcome: object
) -> None:
    gauge = Gauge()
    admission = Admission(limit=1, gauge=gauge)

    async def run() -> object:
        try:
            return await scenario(admission)
        except BaseException as exc:  # noqa: BLE001 - the outcome is what the table checks
            return type(exc)

    assert asyncio.run(run()) == outcome
    assert admission.in_flight == 0
    assert gauge.values == [1, 0]  # one take, one release: never twice
    assert asyncio.run(_succeeds(admission)) == "answer"  # the place and the req_id are free again


def test_double_release_is_a_no_op() -> None:
    admission = Admission(limit=2)
    first, second = admission.admit("a"), admission.admit("b")
    assert first.release() and not first.release()
    assert admission.in_flight == 1 and second.held
    # A later request reusing the id is not released by the stale permit.
    again = admission.admit("a")
    assert not first.release() and again.held and admission.in_flight == 2


def test_a_duplicate_in_flight_req_id_is_409_and_costs_nothing() -> None:
    admission = Admission(limit=4)
    admission.admit("dup")
    with pytest.raises(DuplicateRequest, match="'dup' is already in flight") as err:
        admission.admit("dup")
    assert err.value.http_status == 409 and err.value.req_id == "dup" and admission.in_flight == 1


def test_full_is_429_at_once_until_a_place_is_released() -> None:
    admission = Admission(limit=2)
    held = [admission.admit("a"), admission.admit("b")]
    with pytest.raises(Overloaded, match="queue is full .*ENCODER_MAX_QUEUE") as err:
        admission.admit("c")
    assert err.value.http_status == 429 and admission.in_flight == 2
    held[0].release()
    assert admission.admit("c").held


def test_shutdown_refuses_new_requests_and_waits_for_the_admitted() -> None:
    admission = Admission(limit=4)

    async def scenario() -> tuple[bool, bool, int]:
        permit = admission.admit("started")
        admission.close()
        with pytest.raises(ShuttingDown):
            admission.admit("late")
        early = await admission.wait_idle(timeout=0.01)  # "started" still holds its place
        asyncio.get_running_loop().call_later(0.02, permit.release)
        return early, await admission.wait_idle(timeout=5), admission.in_flight

    assert asyncio.run(scenario()) == (False, True, 0)


def test_close_takes_the_error_it_is_given() -> None:
    admission = Admission(limit=1)
    admission.close(lambda: NotReady("draining"))
    with pytest.raises(NotReady, match="draining"):
        admission.admit("r")


def test_a_deadline_error_inside_the_block_still_releases() -> None:
    admission = Admission(limit=1)

    async def scenario() -> None:
        async with admission.admit("r"):
            raise RequestTimeout("too slow")

    with pytest.raises(RequestTimeout):
        asyncio.run(scenario())
    assert admission.in_flight == 0
