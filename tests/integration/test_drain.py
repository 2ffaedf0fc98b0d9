"""SIGTERM drains without losing a request: real servers, real signals, real sockets.

"Lost" means a request that was sent before the drain began and was not answered 200, or any
request answered with something else than 200 or a draining 503 with ``Retry-After``, or reset.
A request sent within ``BOUNDARY_S`` before the signal may have reached the server after it
handled the signal (the signal and the request race on a loaded machine): it may be refused too.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Awaitable, Callable

import httpx
import pytest

from tests.integration.encode_client import encode
from tests.support.media_host import MediaHost
from encoder_pod.transfer.inline import decode_embedding
from testkit.load import Answer, ClosedLoop, Outcome, refused_or_unreachable
from testkit.media import png_data_uri
from testkit.server import EncoderServer

pytestmark = pytest.mark.integration

BOUNDARY_S = 0.25
EXIT_MARGIN_S = 10.0
"""The pod exits within ENCODER_DRAIN_TIMEOUT + this (the operator's grace period has the same margin)."""

MODES = [[], ["--dp-size", "2"], ["--tp-size", "2"]]
MODE_IDS = ["single-process", "dp2", "tp2"]


def _fresh(port: int, method: str, path: str, body: bytes | None = None) -> tuple[int, dict[str, str], dict[str, Any]]:
    """One request on a NEW connection; a reset raises (ConnectionResetError, RemoteDisconnected)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, body=body, headers={"content-type": "application/json"})
        resp = conn.getresponse()
        raw = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, json.loads(raw) if raw else {}
    finally:
        conn.close()


def _held_env(**extra: str) -> dict[str, str]:
    return {"ENCODER_ALLOW_URL_FETCH": "true", "ENCODER_ALLOWED_URL_HOSTS": "127.0.0.1", **extra}


def _wait_inflight(server: EncoderServer, n: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while httpx.get(server.base_url + "/server_info", timeout=5).json()["inflight"] < n:
        assert time.monotonic() < deadline, "requests never became in flight"
        time.sleep(0.05)


def _assert_refused_as_draining(status: int, headers: dict[str, str], body: dict[str, Any]) -> None:
    assert status == 503, (status, body)
    assert body["message"].startswith("draining"), body
    assert headers.get("retry-after") == "1" and headers.get("connection") == "close", headers


@pytest.mark.timeout(600)
@pytest.mark.parametrize("args", MODES, ids=MODE_IDS)
def test_sigterm_under_load_loses_no_request_and_exits_0(tiny_model, args):
    drain_timeout = 60
    env = {"ENCODER_DRAIN_TIMEOUT": str(drain_timeout)}
    images = [png_data_uri(224, 224, seed=i) for i in range(4)]  # ~1 s of work in flight at 16 clients

    def body_of(n: int) -> dict[str, Any]:
        return {"req_id": f"load-{n}", "modality": "IMAGE", "mm_items": images}

    server = EncoderServer(tiny_model("clip", preset="moderate"), env=env, args=args).start()
    load = ClosedLoop(server.base_url, 16, body_of, stop_after=refused_or_unreachable).start()
    try:
        load.wait_ok(32, 180)
        sigterm = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        # Connections opened right after SIGTERM get HTTP answers: 200 until the signal is handled, then 503.
        while (probe := _fresh(server.port, "GET", "/health"))[0] == 200:
            assert time.monotonic() - sigterm < 5, "/health never turned 503 after SIGTERM"
        health_503_ms = (time.monotonic() - sigterm) * 1000
        _assert_refused_as_draining(*probe)
        _assert_refused_as_draining(*_fresh(server.port, "POST", "/encode", json.dumps(body_of(10**6)).encode()))
        assert _fresh(server.port, "GET", "/livez")[0] == 200  # liveness is the event loop, draining or not
        # The clients go on: each sends until it is refused (then it would retry on another pod).
        code = server.proc.wait(drain_timeout + 60)
        exited_s = time.monotonic() - sigterm
        answers = load.stop()
    finally:
        load.stop_new()
        server.stop()
    served = [a for a in answers if a.status == 200]
    in_flight = [a for a in served if a.sent < sigterm < a.done]
    refused = [a for a in answers if a.draining_refusal and a.sent >= sigterm - BOUNDARY_S]
    lost: list[Outcome] = [a for a in answers if a.status != 200 and a not in refused]
    print(
        f"\ndrain under load ({' '.join(args) or 'single process'}, 16 clients): {len(answers)} requests, "
        f"{len(served)} answered 200 ({len(in_flight)} in flight at SIGTERM), {len(refused)} refused 503 + "
        f"Retry-After after the drain began ({sum(a.sent < sigterm for a in refused)} sent within "
        f"{BOUNDARY_S}s before it), {len(lost)} lost; /health 503 after {health_503_ms:.0f} ms; "
        f"exit code {code} after {exited_s:.2f}s"
    )
    assert not lost, lost[:5]
    assert in_flight, "nothing was in flight at SIGTERM: the test proved nothing"
    assert refused, "no client sent during the drain: the listener was not shown answering"
    assert code == 0, server.log_text()[-3000:]
    assert exited_s < drain_timeout + EXIT_MARGIN_S
    assert "drained in" in server.log_text()


@pytest.mark.timeout(300)
def test_queued_requests_finish_after_sigterm(tiny_model):
    """Requests held before their batch (a slow origin) are answered 200 after SIGTERM, not 503."""
    with MediaHost() as host:
        server = EncoderServer(tiny_model("qwen2_vl"), env=_held_env()).start()
        try:
            with ThreadPoolExecutor(4) as pool:
                futures = [pool.submit(encode, server.base_url, f"t{i}", [host.base_url + "/held/40x40.png"]) for i in range(4)]
                _wait_inflight(server, 4)
                server.proc.send_signal(signal.SIGTERM)
                deadline = time.monotonic() + 5
                while (probe := _fresh(server.port, "GET", "/health"))[0] == 200:
                    assert time.monotonic() < deadline
                _assert_refused_as_draining(*probe)
                late = encode(server.base_url, "late", [png_data_uri(40, 40)])
                _assert_refused_as_draining(late.status_code, dict(late.headers), late.json())
                host.release()
                answers = [f.result() for f in futures]
            assert [r.status_code for r in answers] == [200] * 4, [r.text[:200] for r in answers]
            assert server.proc.wait(30) == 0
        finally:
            server.stop()


@pytest.mark.timeout(300)
def test_drain_timeout_answers_what_is_left_503_and_exits_0(tiny_model):
    drain_timeout = 3.0
    with MediaHost() as host:
        server = EncoderServer(tiny_model("qwen2_vl"), env=_held_env(ENCODER_DRAIN_TIMEOUT=str(drain_timeout))).start()
        try:
            with ThreadPoolExecutor(4) as pool:
                futures = [pool.submit(encode, server.base_url, f"t{i}", [host.base_url + "/held/40x40.png"]) for i in range(4)]
                _wait_inflight(server, 4)
                sigterm = time.monotonic()
                server.proc.send_signal(signal.SIGTERM)
                answers = [f.result() for f in futures]
                answered_s = time.monotonic() - sigterm
            host.release()  # the fetch threads are still waiting for the origin
            code = server.proc.wait(30)
            exited_s = time.monotonic() - sigterm
        finally:
            host.release()
            server.stop()
    print(f"\ndrain timeout {drain_timeout}s: held requests answered 503 after {answered_s:.2f}s, exit {code} after {exited_s:.2f}s")
    for r in answers:
        _assert_refused_as_draining(r.status_code, dict(r.headers), r.json())
        assert "ENCODER_DRAIN_TIMEOUT" in r.json()["message"] and r.json()["req_id"].startswith("t")
    assert drain_timeout - 0.5 <= answered_s < drain_timeout + 5
    assert code == 0 and exited_s < drain_timeout + EXIT_MARGIN_S


KEPT_ALIVE_CLIENTS = 32


def _check_full_answer(invalid: list[str]) -> Callable[[int, Answer], Awaitable[None]]:
    """A ``finish`` for the load: a 200 must be a whole, valid inline answer for its own request."""

    async def finish(n: int, answer: Answer) -> None:
        try:
            body = json.loads(answer.body)
            tensor = decode_embedding(body["embedding"])
            assert body["req_id"] == f"ka-{n}" and tensor.ndim == 2 and tensor.shape[0] == sum(body["item_token_counts"])
        except Exception as exc:  # noqa: BLE001 - every way of being wrong is recorded
            invalid.append(f"request {n}: {type(exc).__name__}: {exc} ({len(answer.body)} bytes)")

    return finish


@pytest.mark.timeout(600)
@pytest.mark.parametrize("args", MODES[:2], ids=MODE_IDS[:2])
def test_sigterm_to_pid_1_answers_every_request_of_kept_alive_clients(tiny_model, args):
    """SIGTERM to the server process alone (as a container runtime sends it), 32 closed-loop clients
    on kept-alive connections (aiohttp) that go on sending through the whole drain and the
    listener's close: every request either could not connect (nothing sent) or got a status line;
    every 200 is a whole answer; every draining answer says ``Connection: close``; exit 0."""
    image = png_data_uri(64, 64, seed=3)
    invalid: list[str] = []

    def body_of(n: int) -> dict[str, Any]:
        return {"req_id": f"ka-{n}", "modality": "IMAGE", "mm_items": [image]}

    server = EncoderServer(tiny_model("clip"), env={"ENCODER_DRAIN_TIMEOUT": "120"}, args=args).start()
    # A client stops only once it cannot connect any more (the pod is gone): it sends into the drain,
    # into the 503s, and into the moment the listener closes.
    load = ClosedLoop(server.base_url, KEPT_ALIVE_CLIENTS, body_of, timeout=180, finish=_check_full_answer(invalid),
                      stop_after=lambda outcome: outcome.unreachable).start()
    try:
        load.wait_ok(4 * KEPT_ALIVE_CLIENTS, 240)
        sigterm = time.monotonic()
        os.kill(server.proc.pid, signal.SIGTERM)  # the process alone, never its group
        while _fresh(server.port, "GET", "/health")[0] == 200:
            assert time.monotonic() - sigterm < 60, "/health never turned 503 after SIGTERM"
        draining_seen = time.monotonic()
        code = server.proc.wait(240)
        answers = load.stop()
    finally:
        load.stop_new()
        server.stop()
    no_status = [a for a in answers if isinstance(a.status, str) and not a.unreachable]
    unexpected = [a for a in answers if isinstance(a.status, int) and a.status != 200 and not a.draining_refusal]
    served = [a for a in answers if a.status == 200]
    in_flight = [a for a in served if a.sent < sigterm < a.done]
    refused = [a for a in answers if a.draining_refusal]
    early_refused = [a for a in refused if a.sent < sigterm - BOUNDARY_S]
    late_served = [a for a in served if a.sent > draining_seen]  # arrived after the drain began: refused
    kept_open = [a for a in answers if isinstance(a.status, int) and (a.draining_refusal or a.sent > draining_seen)
                 and (a.connection or "").lower() != "close"]
    print(
        f"\nSIGTERM to pid 1 ({' '.join(args) or 'single process'}, {KEPT_ALIVE_CLIENTS} kept-alive clients): "
        f"{len(answers)} requests, {len(served)} answered 200 ({len(in_flight)} in flight at SIGTERM), "
        f"{len(refused)} refused 503 + Retry-After, {sum(a.unreachable for a in answers)} could not connect "
        f"(the pod gone), {len(no_status)} without a status line, {len(unexpected)} other answers, "
        f"{len(invalid)} invalid 200s, {len(kept_open)} draining answers without Connection: close; exit code {code}"
    )
    assert not no_status, [(a.status, a.message, round(a.sent - sigterm, 3)) for a in no_status[:10]]
    assert not unexpected, unexpected[:5]
    assert not invalid, invalid[:5]
    assert not early_refused, early_refused[:5]
    assert not late_served, late_served[:5]
    assert not kept_open, kept_open[:5]
    assert in_flight, "nothing was in flight at SIGTERM: the test proved nothing"
    assert refused, "no client sent during the drain: the listener was not shown answering"
    assert code == 0, server.log_text()[-3000:]
