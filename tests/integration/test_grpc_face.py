"""SGLang's gRPC encoder face (ENCODER_GRPC_PORT) on real pods, driven by the other side's code.

The clients are smg-grpc-proto's own generated stubs (the package SGLang 0.5.23 imports) and,
where the wheel has it, SGLang 0.5.23's own gRPC client code run by the harness
(tests/support/sglang_harness.py): ``MMReceiverGrpc.encode`` (the ``Encode`` RPC, items split
over the encoders as SGLang splits them) and ``WaitingZmqRequestGrpc`` (the ranks registering
through the ``SchedulerReceiveUrl`` RPC). SGLang's gRPC client has no mooncake path (its
``MMReceiverGrpc`` refuses it), so mooncake is driven with the stubs into real mooncake engines
(TCP on loopback) and SGLang's own unpickler reads the acknowledgements.

Every check compares what arrived over a backend with the same pod's HTTP inline answer.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator

import grpc
import httpx
import numpy as np
import pytest
import torch
import zmq
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase
from smg_grpc_proto import sglang_encoder_pb2 as pb

from tests.integration.encode_client import embedding, encode
from tests.integration.test_transfer_mooncake import Rank
from tests.support.grpc_client import MiB, GrpcClient, failure
from tests.support.media_host import MediaHost
from testkit.media import png_data_uri
from testkit.server import EncoderServer, free_port
from tests.support.sglang_harness import SglangHarness

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]  # a fixture starts two or three pods

REPO = Path(__file__).resolve().parents[2]
IMAGES = [png_data_uri(64, 48, seed=7), png_data_uri(40, 80, seed=8), png_data_uri(48, 48, seed=9)]
BASE_ENV = {"ENCODER_NUM_THREADS": "1", "ENCODER_SEND_TIMEOUT": "60"}
HELD_ENV = {"ENCODER_ALLOWED_MEDIA_DOMAINS": "127.0.0.1", "ENCODER_URL_FETCH_TIMEOUT": "60"}


class GrpcPod:
    """An ``encoder-pod serve`` with its gRPC port, and a client of it."""

    def __init__(self, model: Any, env: dict[str, str] | None = None, args: list[str] | None = None) -> None:
        self.grpc_port = free_port()
        self.server = EncoderServer(model, env={**BASE_ENV, **(env or {}), "ENCODER_GRPC_PORT": str(self.grpc_port)}, args=args)
        self.client = GrpcClient(self.grpc_port)

    @property
    def url(self) -> str:
        """The pod's gRPC URL as SGLang's encoder URL list names it."""
        return f"grpc://127.0.0.1:{self.grpc_port}"

    def info(self) -> dict[str, Any]:
        return httpx.get(self.server.base_url + "/server_info", timeout=10).json()

    def wait_inflight(self, n: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while self.info()["inflight"] != n:
            assert time.monotonic() < deadline, f"in flight never became {n}: {self.info()['inflight']}"
            time.sleep(0.05)

    def references(self, images: list[str]) -> list[np.ndarray]:
        """Each image's embedding by the HTTP path, inline."""
        return [embedding(encode(self.server.base_url, f"ref-{i}-{time.monotonic_ns()}", [img])) for i, img in enumerate(images)]

    def close(self) -> None:
        self.client.close()
        self.server.stop()


def _pods(*pods: GrpcPod) -> None:
    for pod in pods:
        pod.server.start(wait_ready=False)
    for pod in pods:
        pod.server.wait_status("/health", 200, 300)


@pytest.fixture(scope="module")
def pods(tiny_model) -> Iterator[list[GrpcPod]]:
    """Two single-process pods, default (auto) transfer. SGLang's gRPC client sends every part of a
    request under the request's own id, one part per encoder, so a split needs two encoders.
    The first has a small queue and request timeout for the error tests."""
    env = {"ENCODER_MAX_QUEUE": "2", "ENCODER_MAX_BATCH_SIZE": "2", "ENCODER_REQ_TIMEOUT": "10", **HELD_ENV}
    started = [GrpcPod(tiny_model("qwen2_vl"), env), GrpcPod(tiny_model("qwen2_vl"))]
    try:
        _pods(*started)
        yield started
    finally:
        for each in started:
            each.close()


@pytest.fixture(scope="module")
def pod(pods: list[GrpcPod]) -> GrpcPod:
    return pods[0]


@pytest.fixture(scope="module")
def sink() -> Iterator[int]:
    """A PULL socket's port: where the failed requests' error parts go (a request without a port
    would hold a receive-URL slot for its error part until SEND_TIMEOUT)."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PULL)
    try:
        yield sock.bind_to_random_port("tcp://127.0.0.1")
    finally:
        sock.close(0)
        ctx.term()


@pytest.fixture(scope="module")
def refs(pod: GrpcPod) -> list[np.ndarray]:
    return pod.references(IMAGES)


def _assembled(result: dict[str, Any]) -> list[dict[str, Any]]:
    if "returned" in result:
        assert result["returned"] is not None, result["logs"]
        return [result["returned"]]
    assert result["dispatch_error"] is None, result
    out = []
    for rank in result["ranks"]:
        [state] = rank.values()
        assert state["status"] == "SUCCESS", (state, result["logs"])
        out.append(state["mm"])
    return out


def _check(got: dict[str, Any], want: list[np.ndarray]) -> None:
    values = np.asarray(got["embeddings"]["IMAGE"]["values"], dtype=np.float32)
    np.testing.assert_allclose(values, np.concatenate(want), rtol=1e-4, atol=1e-5)


def _sglang_spec(backend: str, urls: list[str], rid: str) -> dict[str, Any]:
    mode = "dispatch-tokenizer" if backend == "zmq_to_tokenizer" else "dispatch-ranks"
    return {"mode": mode, "transport": "grpc", "backend": backend, "encode_urls": urls, "rid": rid, "tp": 2,
            "dtype": "float32", "timeout": 90, "images": IMAGES}


# --- the service, health and reflection -------------------------------------------------------------
def test_reflection_lists_sglangs_three_services_with_smg_grpc_protos_own_descriptor(pod: GrpcPod):
    db = ProtoReflectionDescriptorDatabase(pod.client.channel)
    assert set(db.get_services()) == {"sglang.grpc.encoder.SglangEncoder", "grpc.health.v1.Health",
                                      "grpc.reflection.v1alpha.ServerReflection"}
    served = db.FindFileContainingSymbol("sglang.grpc.encoder.SglangEncoder")
    theirs = pb.DESCRIPTOR.serialized_pb
    assert served.SerializeToString() == theirs  # the contract served is the package's, byte for byte


def test_health_is_serving_for_sglangs_names_and_liveness_and_not_found_otherwise(pod: GrpcPod):
    assert pod.client.health("") == "SERVING"
    assert pod.client.health("sglang.grpc.encoder.SglangEncoder") == "SERVING"
    assert pod.client.health("encoderpool.liveness") == "SERVING"
    code, details, _ = failure(lambda: pod.client.health("some.other.Service"))
    assert code is grpc.StatusCode.NOT_FOUND and "some.other.Service" in details


# --- every backend, compared with the HTTP path ----------------------------------------------------------
def test_stub_encode_pushes_to_a_zmq_to_tokenizer_receiver_what_http_answers(pod: GrpcPod, refs, sglang_newest: SglangHarness):
    """Encode with one embedding_port: SGLang 0.5.23's own tokenizer-side receive path assembles it."""
    port = sglang_newest.start({"mode": "frames-tokenizer", "req_id": "tok"})["port"]
    response = pod.client.encode("tok_local_part_0", IMAGES, ports=[port])
    assert response == pb.EncodeResponse()  # ZMQ backends answer an empty message, as SGLang's
    merged = sglang_newest.result()["returned"]
    assert merged is not None
    _check(merged, refs)


@pytest.mark.parametrize("backend", ["zmq_to_tokenizer", "zmq_to_scheduler"])
def test_sglangs_own_grpc_client_splits_a_request_over_two_pods(pods: list[GrpcPod], refs, sglang_newest: SglangHarness, backend):
    """SGLang 0.5.23's MMReceiverGrpc (+ WaitingZmqRequestGrpc's SchedulerReceiveUrl for the scheduler ranks)."""
    ready = sglang_newest.start(_sglang_spec(backend, [p.url for p in pods], f"sg-{backend}"))
    for got in _assembled(sglang_newest.result(240)):
        _check(got, refs)
        assert len(got["meta"]["img_grid_thw"]) == len(IMAGES)
    if "assigned" in ready:  # both pods got a part: the request really was split
        assert 0 not in ready["assigned"]["IMAGE"], ready


def test_the_python_client_of_docs_grpc_md_runs_as_written(pod: GrpcPod, sink: int):
    """docs/grpc.md's stub snippet, its address, receiver and item pointed at this test's pod and sink."""
    text = (REPO / "docs/grpc.md").read_text()
    [block] = re.findall(r"```python\n(.*?)```", text, re.S)
    for shown, here in (("localhost:50051", pod.client.target), ('"prefill-0"', '"127.0.0.1"'), ("[5555]", f"[{sink}]"),
                        ('"https://example.com/cat.jpg"', repr(IMAGES[0]))):
        assert shown in block, shown
        block = block.replace(shown, here)
    proc = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]


# --- status codes a gateway can act on --------------------------------------------------------------------
@pytest.mark.parametrize(("request_", "metadata", "field"), [
    (dict(req_id="np", num_parts=0), None, "field 'num_parts'"),  # proto3's unset uint32: refused, as SGLang
    (dict(req_id="pi", num_parts=2, part_idx=2), None, "field 'part_idx'"),
    (dict(req_id=""), None, "field 'req_id'"),
    (dict(req_id="nh", prefill_host=""), None, "field 'prefill_host'"),
    (dict(req_id="ni", mm_items=[]), None, "field 'mm_items'"),
    (dict(req_id="bi", mm_items=["data:image/png;base64,AAAA"]), None, "mm_items[0]"),
    (dict(req_id="mo"), "SMELL", "field 'modality'"),
    (dict(req_id="au"), "AUDIO", "field 'modality'"),  # qwen2_vl takes images and videos only
], ids=["num_parts-0", "part_idx", "req_id", "prefill_host", "mm_items", "undecodable-item", "modality", "unsupported-modality"])
def test_a_bad_request_is_invalid_argument_naming_the_field(pod: GrpcPod, sink: int, request_, metadata, field):
    fields = {"mm_items": IMAGES[:1], "num_parts": 1, "part_idx": 0, "prefill_host": "127.0.0.1", "embedding_port": [sink], **request_}
    call = pod.client.encoder.Encode
    code, details, trailer = failure(lambda: call(pb.EncodeRequest(**fields), timeout=30,
                                                  metadata=GrpcClient.metadata(metadata)))
    assert code is grpc.StatusCode.INVALID_ARGUMENT, (code, details)
    assert field in details and trailer["encoderpool-error-kind"] == "invalid_request"


def test_a_request_above_grpcs_default_4_mib_reaches_the_parser_and_one_above_256_mib_is_refused(pod: GrpcPod, sink: int):
    """SGLang's message limits (256 MiB): 5 MiB is read and judged (a bad item), 257 MiB is RESOURCE_EXHAUSTED."""
    big = "data:image/png;base64," + "A" * (5 * MiB)
    code, details, _ = failure(lambda: pod.client.encode("big", [big], ports=[sink]))
    assert code is grpc.StatusCode.INVALID_ARGUMENT and "mm_items[0]" in details
    huge = "A" * (257 * MiB)
    code, details, _ = failure(lambda: pod.client.encode("huge", [huge], timeout=120))
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED, (code, details)


def test_queue_full_duplicates_cancels_and_deadlines(pod: GrpcPod):
    """MAX_QUEUE=2: two calls held (their ranks never register), then every code, and a cancel releasing its slot."""
    counted = _edge(pod)
    held = [pod.client.encode_future(f"held-{i}", IMAGES[:1]) for i in range(2)]  # no port: waits for SchedulerReceiveUrl
    try:
        pod.wait_inflight(2)
        code, details, trailer = failure(lambda: pod.client.encode("third", IMAGES[:1]))
        assert code is grpc.StatusCode.RESOURCE_EXHAUSTED and "ENCODER_MAX_QUEUE" in details, details
        assert trailer["encoderpool-error-kind"] == "overloaded"
        code, details, _ = failure(lambda: pod.client.encode("held-0", IMAGES[:1]))
        assert code is grpc.StatusCode.ALREADY_EXISTS and "held-0" in details, details

        held[0].cancel()  # the gateway gives up: the slot and the req_id are released, as on an HTTP disconnect
        pod.wait_inflight(1)
        again = pod.client.encode_future("held-0", IMAGES[:1], timeout=2)  # a client deadline: gRPC cancels the call
        code, _, _ = failure(again.result)
        assert code is grpc.StatusCode.DEADLINE_EXCEEDED
        pod.wait_inflight(1)
    finally:
        for call in held:
            call.cancel()
    pod.wait_inflight(0)
    # Five Encode calls: 429, 409, and three gone (two cancelled, one past its client deadline), as HTTP counts them.
    assert _moved(pod, counted, 5) == {"429 overloaded": 1, "409 duplicate_request": 1, "499 client_gone": 3,
                                       "all": 5, "latency": 5}


def test_a_request_outliving_req_timeout_is_deadline_exceeded(pod: GrpcPod, sink: int):
    """REQ_TIMEOUT=10 s and an item whose origin holds its answer: the pod's own deadline, not the client's."""
    with MediaHost() as host:
        started = time.monotonic()
        code, details, trailer = failure(lambda: pod.client.encode("slow", [host.base_url + "/held/32x32.png"], ports=[sink], timeout=60))
    assert code is grpc.StatusCode.DEADLINE_EXCEEDED and "10" in details, details
    assert trailer["encoderpool-error-kind"] == "timeout" and time.monotonic() - started < 40
    pod.wait_inflight(0)


def test_an_unreachable_receiver_and_a_bad_registration(pod: GrpcPod):
    code, details, _ = failure(lambda: pod.client.encoder.SchedulerReceiveUrl(
        pb.SchedulerReceiveUrlRequest(req_id="r", receive_url="nowhere", receive_count=1), timeout=10))
    assert code is grpc.StatusCode.INVALID_ARGUMENT and "field 'receive_url'" in details
    code, details, _ = failure(lambda: pod.client.encoder.SchedulerReceiveUrl(
        pb.SchedulerReceiveUrlRequest(req_id="r", receive_url="127.0.0.1:5", receive_count=0), timeout=10))
    assert code is grpc.StatusCode.INVALID_ARGUMENT and "field 'receive_count'" in details
    code, details, _ = failure(lambda: pod.client.encoder.Send(pb.SendRequest(req_id="s", prefill_host="h", embedding_port=1), timeout=10))
    assert code is grpc.StatusCode.INVALID_ARGUMENT and "field 'session_id'" in details  # proto3's empty string = missing


EDGE_SERIES = {  # what a dashboard reads, by the HTTP code every face is counted under
    "200": ("encoder_requests_total", 'code="200"'),
    "400": ("encoder_requests_total", 'code="400"'),
    "400 invalid_request": ("encoder_request_errors_total", 'code="400"', 'kind="invalid_request"'),
    "409 duplicate_request": ("encoder_request_errors_total", 'code="409"', 'kind="duplicate_request"'),
    "429 overloaded": ("encoder_request_errors_total", 'code="429"', 'kind="overloaded"'),
    "499 client_gone": ("encoder_request_errors_total", 'code="499"', 'kind="client_gone"'),
    "all": ("encoder_requests_total",),
    "latency": ("encoder_request_seconds_count",),
    "grpc OK": ("encoder_grpc_calls_total", 'method="Encode"', 'code="OK"'),
    "grpc INVALID_ARGUMENT": ("encoder_grpc_calls_total", 'method="Encode"', 'code="INVALID_ARGUMENT"'),
}


def _edge(pod: GrpcPod) -> dict[str, float]:
    return {name: pod.server.metric(*series) for name, series in EDGE_SERIES.items()}


def _moved(pod: GrpcPod, before: dict[str, float], total: int, timeout: float = 30) -> dict[str, float]:
    """The series' changes since ``before``, once ``total`` more calls are counted (a cancelled call
    is counted when the server has seen the cancel, a moment after the client's)."""
    deadline = time.monotonic() + timeout
    while (now := _edge(pod))["all"] < before["all"] + total and time.monotonic() < deadline:
        time.sleep(0.1)
    return {name: now[name] - before[name] for name in now if now[name] != before[name]}


def test_grpc_calls_are_counted_by_method_and_code_and_in_the_edge_series_as_http(pod: GrpcPod, sink: int):
    """A success and a bad request each move the dashboard's series by exactly one, under /encode's codes."""
    before = _edge(pod)
    assert pod.client.encode("counted", IMAGES[:2], ports=[sink]) == pb.EncodeResponse()
    failure(lambda: pod.client.encode("", IMAGES[:1], ports=[sink]))
    assert _moved(pod, before, 2) == {"200": 1, "400": 1, "400 invalid_request": 1, "all": 2, "latency": 2,
                                      "grpc OK": 1, "grpc INVALID_ARGUMENT": 1}


# --- mooncake: Encode answers the sizes, Send writes the buffer ------------------------------------------
@pytest.fixture(scope="module")
def mooncake_pod(tiny_model) -> Iterator[GrpcPod]:
    env = {"ENCODER_TRANSFER_BACKEND": "mooncake", "ENCODER_MOONCAKE_PROTOCOL": "tcp", "MC_FORCE_TCP": "1"}
    started = GrpcPod(tiny_model("qwen2_vl"), env)
    try:
        _pods(started)
        yield started
    finally:
        started.close()


def test_mooncake_encode_answers_the_sizes_and_send_writes_what_http_answers(mooncake_pod: GrpcPod, sglang_newest: SglangHarness):
    [want] = mooncake_pod.references(IMAGES[:1])
    response = mooncake_pod.client.encode("mc_local_part_0", IMAGES[:1], ports=[9])  # ports are not mooncake's (ignored)
    assert (response.embedding_len, response.embedding_dim) == want.shape
    assert response.embedding_size == want.size * 4
    ctx = zmq.Context()
    rank = Rank(ctx, response.embedding_size)
    try:
        mooncake_pod.client.encoder.Send(pb.SendRequest(
            req_id="mc_local_part_0", prefill_host="127.0.0.1", embedding_port=rank.port, session_id=rank.session,
            buffer_address=rank.buffer.data_ptr()), timeout=60)
        [ack] = rank.ack()
        landed = rank.buffer.view(torch.float32).reshape(want.shape).numpy()
        np.testing.assert_allclose(landed, want, rtol=1e-4, atol=1e-5)
        code, details, _ = failure(lambda: mooncake_pod.client.encoder.Send(pb.SendRequest(
            req_id="mc_local_part_0", prefill_host="127.0.0.1", embedding_port=rank.port, session_id=rank.session,
            buffer_address=rank.buffer.data_ptr()), timeout=30))
        assert code is grpc.StatusCode.UNAVAILABLE and "no staged embedding" in details  # released after its Send, as SGLang
    finally:
        rank.close()
        ctx.term()
    [decoded] = sglang_newest.run({"mode": "unpickle", "frames": [ack.hex()]})["frames"]
    assert decoded["ok"] and decoded["attrs"]["shape"] == list(want.shape) and decoded["attrs"]["req_id"] == "mc_local_part_0"


# --- data parallel ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dp_pod(tiny_model) -> Iterator[GrpcPod]:
    started = GrpcPod(tiny_model("qwen2_vl"), args=["--dp-size", "2"])
    try:
        _pods(started)
        yield started
    finally:
        started.close()


def test_a_data_parallel_pod_serves_sglangs_grpc_client_and_its_health(dp_pod: GrpcPod, pods: list[GrpcPod],
                                                                        sglang_newest: SglangHarness):
    """--dp-size 2 beside a single-process pod: the ranks' SchedulerReceiveUrl calls reach the worker encoding their part."""
    assert dp_pod.client.health() == "SERVING"
    want = dp_pod.references(IMAGES)
    for attempt in range(3):  # requests spread over the front's two workers
        sglang_newest.start(_sglang_spec("zmq_to_scheduler", [dp_pod.url, pods[1].url], f"dp-{attempt}"))
        for got in _assembled(sglang_newest.result(240)):
            _check(got, want)
    assert dp_pod.server.metric("encoder_grpc_calls_total", 'method="SchedulerReceiveUrl"', 'code="OK"') >= 6


# --- readiness and the drain -------------------------------------------------------------------------------
def _verdicts(pod: GrpcPod) -> tuple[str | None, int | None, str | None]:
    """gRPC health, /health, gRPC health, taken back to back (None when a side did not answer)."""
    def grpc_side() -> str | None:
        try:
            return pod.client.health(timeout=2)
        except grpc.RpcError:
            return None

    def http_side() -> int | None:
        try:
            return httpx.get(pod.server.base_url + "/health", timeout=2).status_code
        except httpx.HTTPError:
            return None

    return grpc_side(), http_side(), grpc_side()


def _agree(samples: list[tuple[str | None, int | None, str | None]]) -> None:
    """Wherever both gRPC readings agree, /health between them said the same."""
    for before, http, after in samples:
        if before == after and before is not None and http is not None:
            assert (before == "SERVING") == (http == 200), samples


def test_health_follows_the_http_verdict_through_start_and_drain(tiny_model):
    """NOT_SERVING while loading, SERVING once /health is 200, NOT_SERVING through the drain; a held call finishes."""
    pod = GrpcPod(tiny_model("qwen2_vl"), HELD_ENV)
    samples: list[tuple[str | None, int | None, str | None]] = []
    pod.server.start(wait_ready=False)
    try:
        deadline = time.monotonic() + 300
        while not samples or samples[-1][1] != 200:
            assert time.monotonic() < deadline, pod.server.log_text()
            samples.append(_verdicts(pod))
            time.sleep(0.05)
        assert any(s[0] == "NOT_SERVING" for s in samples), samples  # loading was seen as NOT_SERVING
        assert any(s[0] == "NOT_SERVING" and s[1] == 503 for s in samples), samples
        _agree(samples)
        pod.client.wait_serving(30)

        ctx = zmq.Context()
        sink = ctx.socket(zmq.PULL)
        port = sink.bind_to_random_port("tcp://127.0.0.1")
        with MediaHost() as host, ThreadPoolExecutor(1) as pool:
            held = pool.submit(pod.client.encode, "in-flight", [host.base_url + "/held/32x32.png"], ports=[port], timeout=90)
            pod.wait_inflight(1)
            pod.server.proc.send_signal(signal.SIGTERM)
            drain: list[tuple[str | None, int | None, str | None]] = []
            while not drain or drain[-1][0] != "NOT_SERVING":
                drain.append(_verdicts(pod))
            code, details, trailer = failure(lambda: pod.client.encode("late", IMAGES[:1], ports=[port]))
            assert code is grpc.StatusCode.UNAVAILABLE and "draining" in details
            assert trailer["encoderpool-error-kind"] == "draining" and trailer["grpc-retry-pushback-ms"] == "1000"
            drain += [_verdicts(pod) for _ in range(5)]
            assert all(s[0] in ("NOT_SERVING", None) for s in drain[-5:]), drain
            assert pod.client.health("encoderpool.liveness") == "SERVING"  # /livez's twin: alive while draining
            _agree(drain)
            host.release()
            assert held.result(60) == pb.EncodeResponse()  # admitted before the drain: delivered
        assert sink.poll(10_000) and len(sink.recv_multipart()) == 2
        sink.close(0)
        ctx.term()
        assert pod.server.proc.wait(60) == 0
    finally:
        pod.close()
