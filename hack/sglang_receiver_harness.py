"""Run ONE SGLang release's own prefill-side receiver code against encoderpool, offline, in its own process.

Usage: python hack/sglang_receiver_harness.py SITE_DIR RELEASE

SITE_DIR holds sglang installed with ``--no-deps`` (hack/sglang-receiver.sh). The release's source
is loaded by hack/sglang_release.py: the receive path is SGLang's code, unmodified; the stand-ins
are named there and below (the model's multimodal processor records what it was handed, or is
built from the release's own base/Qwen2-Audio processor methods; SGLang's GPU ``EmbeddingPool``
becomes a host-memory pool with the same interface).

One process serves many scenarios, one at a time: it prints ``LOADED {json}``, then reads one JSON
scenario per stdin line and answers ``READY {json}`` once its sockets are bound and ``RESULT
{json}`` at the end (``{"error": ...}`` if the scenario itself broke). Logs go to stderr.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
import sys
import threading
import time
import traceback
import warnings
import weakref
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sglang_release  # noqa: E402

IMG, VID, AUD = 151655, 151656, 151646
V_START, V_END, A_START, A_END = 100, 101, 200, 201


def emit(tag: str, payload: Any) -> None:
    print(f"{tag} {json.dumps(payload, default=str)}", flush=True)


def plain(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


class Recorded:
    """What the processor returns (a plain object: SGLang binds a pool slot's release to it with weakref)."""

    def __init__(self, summary: dict[str, Any]) -> None:
        self.input_ids = [1, 2, 3]
        self.summary = summary
        self.mm_items: list[Any] = []


class LogTap(logging.Handler):
    """Keeps sglang's warnings and errors for the result."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage().splitlines()[0][:500])


# --- the model processor: records what the receiver assembled ---------------------------------
def make_processor(rel: sglang_release.Release, kind: str) -> Any:
    """``record``: keeps the merged embeddings and meta; ``qwen2_audio``: the release's own processor methods."""

    def summary(embeddings: dict[Any, Any], meta: dict[str, Any], out: Any = None) -> dict[str, Any]:
        result = {
            "embeddings": {m.name: {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch."), "values": t.float().tolist()}
                           for m, t in embeddings.items()},
            "meta": {k: plain(v) for k, v in meta.items()},
            "meta_types": {k: type(v).__name__ + (f"[{type(v[0]).__name__}]" if isinstance(v, list) and v else "")
                           for k, v in meta.items()},
        }
        if out is not None:
            result["items"] = [{"modality": it.modality.name, "offsets": plain(it.offsets), "rows": list(it.precomputed_embeddings.shape)}
                               for it in out.mm_items]
        return result

    class Recording:
        prefer_tokenized_input = False

        def __init__(self) -> None:
            self.calls: list[dict[str, Any]] = []

        def get_validated_mm_data(self, prompt: Any, recv_embedding: dict[Any, Any], **meta: Any) -> Any:
            self.calls.append(summary(recv_embedding, meta))
            return Recorded(self.calls[-1])

        get_mm_data = get_validated_mm_data  # 0.5.19 has no layout check and calls get_mm_data

    if kind == "record":
        return Recording()

    class Qwen2Audio(rel.base_processor):  # type: ignore[misc,name-defined]
        prefer_tokenized_input = True
        IM_TOKEN_ID, VIDEO_TOKEN_ID, audio_token_id = IMG, VID, AUD
        IM_START_TOKEN_ID, IM_END_TOKEN_ID = V_START, V_END
        audio_start_id, audio_end_id = A_START, A_END
        spatial_merge_size = 2

        def get_mm_data(self, prompt: Any, embeddings: dict[Any, Any], **meta: Any) -> Any:
            out = rel.qwen2_audio_get_mm_data(self, prompt, embeddings, **meta)
            out.summary = summary(embeddings, meta, out)
            return out

    return Qwen2Audio()


def _prompt(spec: dict[str, Any]) -> Any:
    if spec.get("processor") == "qwen2_audio":
        return [1] + [A_START, AUD, A_END] * int(spec.get("audio_items", 1)) + [2]
    return "prompt"


# --- frame scenarios: the test's encoder pushes, the release's receiver decodes -----------------
async def frames_tokenizer(rel: sglang_release.Release, spec: dict[str, Any]) -> dict[str, Any]:
    """zmq_to_tokenizer: the release's _recv_mm_data on a PULL socket the test pushes to."""
    import zmq
    import zmq.asyncio

    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.PULL)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    emit("READY", {"port": port})
    proc = make_processor(rel, spec.get("processor", "record"))
    owner = SimpleNamespace(model_type=spec.get("model_type"))
    try:
        result = await asyncio.wait_for(
            rel.rx.MMReceiverBase._recv_mm_data(owner, spec["req_id"], sock, proc, _prompt(spec)), spec.get("timeout", 30))
    finally:
        sock.close(linger=0)
        ctx.term()
    return {"returned": None if result is None else result.summary}


def _recv_req(rid: str, spec: dict[str, Any], assigned: Any = None) -> Any:
    prompt = _prompt(spec)
    return SimpleNamespace(rid=rid, input_ids=prompt if isinstance(prompt, list) else None, input_text=prompt,
                           num_items_assigned=assigned or {}, mm_inputs=None, encoder_urls=None)


def _build(cls: Any, **kwargs: Any) -> Any:
    params = inspect.signature(cls.__init__).parameters
    return cls(**{k: v for k, v in kwargs.items() if k in params})


def _rank(ctx: Any) -> Any:
    import zmq

    sock = ctx.socket(zmq.PULL)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    return SimpleNamespace(scheduler_recv_socket=sock, port=port, waiting_by_rid={})


def _poll(rel: sglang_release.Release, ranks: list[Any], timeout: float) -> None:
    """The scheduler tick: drain each rank's shared socket, then let each waiting request assemble."""
    pending = rel.rx.WaitingMMRequestStatus.PENDING
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for rank in ranks:
            if rank.scheduler_recv_socket is not None:
                rel.rx.MMReceiverBase._drain_scheduler_embeddings(rank)
            for waiting in rank.waiting_by_rid.values():
                waiting._try_recv_mm_data()
        if all(w.status != pending for r in ranks for w in r.waiting_by_rid.values()):
            return
        time.sleep(0.01)


def _report(ranks: list[Any]) -> list[dict[str, Any]]:
    return [{rid: {"status": w.status.name, "error_msg": w.error_msg, "error_code": w.error_code,
                   "mm": getattr(w.recv_req.mm_inputs, "summary", None)} for rid, w in rank.waiting_by_rid.items()}
            for rank in ranks]


def frames_scheduler(rel: sglang_release.Release, spec: dict[str, Any]) -> dict[str, Any]:
    """zmq_to_scheduler: the release's shared-socket drain routing parts to WaitingZmqRequest by rid."""
    import zmq

    ctx = zmq.Context()
    rank = _rank(ctx)
    for rid, rid_spec in spec["rids"].items():
        rank.waiting_by_rid[rid] = _build(
            rel.rx.WaitingZmqRequest, rid=rid, recv_req=_recv_req(rid, rid_spec), mm_processor=make_processor(rel, rid_spec.get("processor", "record")),
            encoder_urls=[], model_type=None, host_name="127.0.0.1", receive_count=1, embedding_pool=None, zmq_context=ctx,
            embedding_port=rank.port, registration_runner=None)
    emit("READY", {"port": rank.port})
    _poll(rel, [rank], spec.get("timeout", 30))
    rank.scheduler_recv_socket.close(linger=0)
    return {"ranks": _report([rank])}


def pickles(rel: sglang_release.Release, spec: dict[str, Any]) -> dict[str, Any]:
    """Frame 0 as the release's own encoder pickles it (``EmbeddingData(**aux).copy_without_embedding()``)."""
    import pickle

    import torch

    emit("READY", {})
    out = []
    for case in spec["cases"]:
        modality = rel.modality[case["modality"]]
        if case.get("error_msg") is not None:
            data = rel.rx.EmbeddingData(case["req_id"], case["num_parts"], case["part_idx"], None, modality,
                                        error_msg=case["error_msg"], error_code=case["error_code"])
        else:
            grid = None if case.get("grid") is None else torch.tensor(case["grid"], dtype=torch.int64)
            per_grid = case.get("second_per_grid_ts")
            aux = {"video_timestamps": case.get("video_timestamps"),
                   "second_per_grid_ts": None if per_grid is None else torch.tensor(per_grid, dtype=torch.float32)}
            embedding = torch.zeros(case["shape"], dtype=getattr(torch, case["dtype"]))
            data = rel.rx.EmbeddingData(case["req_id"], case["num_parts"], case["part_idx"], grid, modality, embedding, **aux)
        out.append(pickle.dumps(data.copy_without_embedding()).hex())
    return {"pickles": out}


def unpickle(rel: sglang_release.Release, spec: dict[str, Any]) -> dict[str, Any]:
    """The release's safe_pickle_loads on each frame 0: accepted or refused, and what came out."""
    emit("READY", {})
    out = []
    for frame in spec["frames"]:
        try:
            obj = rel.common.safe_pickle_loads(bytes.fromhex(frame))
            out.append({"ok": True, "class": f"{type(obj).__module__}.{type(obj).__qualname__}",
                        "modality_is_receivers": obj.modality is rel.modality[obj.modality.name],
                        "attrs": {k: plain(v) for k, v in vars(obj).items() if k != "modality"}})
        except Exception as exc:  # noqa: BLE001 - the refusal is the result
            out.append({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
    return {"frames": out}


# --- dispatch scenarios: the release's /encode client against real pods ---------------------
def _request(spec: dict[str, Any]) -> Any:
    return SimpleNamespace(image_data=spec.get("images") or None, video_data=spec.get("videos") or None,
                           audio_data=spec.get("audios") or None, mm_content_hashes=None, rid=None)


def _http_receiver(rel: sglang_release.Release, urls: list[str], backend: str) -> Any:
    import zmq.asyncio

    obj = rel.rx.MMReceiverHTTP.__new__(rel.rx.MMReceiverHTTP)  # __init__ reads sglang's global server config
    obj.context = zmq.asyncio.Context()
    obj.encode_urls = list(urls)
    obj.recv_timeout = rel.envs.SGLANG_ENCODER_RECV_TIMEOUT.get()
    obj.host = "127.0.0.1"
    obj.model_type = None
    obj.encoder_transfer_backend = backend
    return obj


def _grpc_receiver(rel: sglang_release.Release, urls: list[str], backend: str) -> Any:
    """0.5.23+'s ``MMReceiverGrpc`` (SGLANG_ENCODER_MM_RECEIVER_MODE=grpc): ``grpc://`` encoders, smg-grpc-proto stubs."""
    cls = getattr(rel.rx, "MMReceiverGrpc", None)
    if cls is None:
        raise SystemExit(f"sglang {rel.version} has no MMReceiverGrpc (gRPC encoders came in 0.5.23)")
    obj = cls.__new__(cls)  # __init__ reads sglang's global server config, as MMReceiverHTTP's does
    obj.__dict__.update(vars(_http_receiver(rel, urls, backend)))
    return obj


def _receiver(rel: sglang_release.Release, spec: dict[str, Any], backend: str) -> Any:
    """The release's dispatcher of ``spec["transport"]`` (http, the default, or grpc)."""
    make = _grpc_receiver if spec.get("transport") == "grpc" else _http_receiver
    return make(rel, spec["encode_urls"], backend)


async def dispatch_tokenizer(rel: sglang_release.Release, spec: dict[str, Any]) -> dict[str, Any]:
    """The real zmq_to_tokenizer path: recv_mm_data -> MMReceiverHTTP.encode (or MMReceiverGrpc.encode) -> the pods."""
    emit("READY", {})
    obj = _receiver(rel, spec, "zmq_to_tokenizer")
    result = await obj.recv_mm_data(_request(spec), make_processor(rel, spec.get("processor", "record")), _prompt(spec))
    obj.context.term()
    return {"returned": None if result is None else result.summary}


class HostPool:
    """Stand-in for SGLang's ``EmbeddingPool`` (CUDA memory there): host memory, registered with the rank's engine."""

    def __init__(self, engine: Any) -> None:
        import torch

        self._engine, self._torch = engine, torch
        self.size_bytes = 1 << 30
        self._slots: dict[int, Any] = {}

    def alloc(self, nbytes: int) -> tuple[Any, int, int]:
        buf = self._torch.zeros(nbytes, dtype=self._torch.uint8)
        self._engine.register(buf.data_ptr(), nbytes)
        slot = len(self._slots) + 1
        self._slots[slot] = buf
        return buf, buf.data_ptr(), slot

    def release(self, slot: int) -> None:
        buf = self._slots.pop(slot, None)
        if buf is not None:
            self._engine.deregister(buf.data_ptr())

    def release_on_gc(self, owner: Any, slot: int) -> Any:
        return weakref.finalize(owner, self.release, slot)


def dispatch_ranks(rel: sglang_release.Release, spec: dict[str, Any]) -> dict[str, Any]:
    """zmq_to_scheduler or mooncake: each prefill TP rank waits for its copy; the tokenizer dispatches /encode.

    With ``transport: grpc`` (zmq_to_scheduler only, as in SGLang) the ranks are
    ``WaitingZmqRequestGrpc`` (registering through the ``SchedulerReceiveUrl`` RPC) and the
    dispatch is ``MMReceiverGrpc.encode`` (the ``Encode`` RPC)."""
    import torch
    import zmq

    backend = spec["backend"]
    ctx = zmq.Context()
    urls = spec["encode_urls"]
    obj = _receiver(rel, spec, backend)
    waiting_zmq = rel.rx.WaitingZmqRequestGrpc if spec.get("transport") == "grpc" else rel.rx.WaitingZmqRequest
    mm_data = obj._extract_url_data(_request(spec))
    assigned = obj._assign_items_by_modality(mm_data, len(urls))
    rid, tp = spec["rid"], spec.get("tp", 1)
    ranks = []
    for i in range(tp):
        proc = make_processor(rel, spec.get("processor", "record"))
        if backend == "mooncake":
            rank = SimpleNamespace(scheduler_recv_socket=None, waiting_by_rid={})
            engine = load_mooncake(rel).MooncakeTransferEngine(hostname="127.0.0.1")
            rank.waiting_by_rid[rid] = _build(
                rel.rx.WaitingRDMARequest, rid=rid, recv_req=_recv_req(rid, spec, assigned), mm_processor=proc, encoder_urls=urls,
                host_name="127.0.0.1", receive_count=tp, zmq_context=ctx, embeddings_engine=engine,
                dtype=getattr(torch, spec.get("dtype", "float32")), model_type=None, embedding_pool=HostPool(engine))
        else:
            rank = _rank(ctx)
            runner = rel.rx._ReceiveRegistrationRunner(f"reg-{i}") if hasattr(rel.rx, "_ReceiveRegistrationRunner") else None
            rank.waiting_by_rid[rid] = _build(
                waiting_zmq, rid=rid, recv_req=_recv_req(rid, spec, assigned), mm_processor=proc, encoder_urls=urls,
                model_type=None, host_name="127.0.0.1", receive_count=tp, embedding_pool=None, zmq_context=ctx,
                embedding_port=rank.port, registration_runner=runner)
        ranks.append(rank)
    emit("READY", {"assigned": {m.name: v for m, v in assigned.items()}})
    first = spec.get("ranks_first", True)
    if first:
        for rank in ranks:
            rank.waiting_by_rid[rid].send_encode_request()
    dispatch: dict[str, Any] = {}

    def run_encode() -> None:
        dispatch["error"] = asyncio.run(obj.encode(rid, mm_data, None, "encode", num_items_assigned=assigned, encode_urls=urls))

    encoder = threading.Thread(target=run_encode)
    encoder.start()
    if not first:
        time.sleep(0.5)
        for rank in ranks:
            rank.waiting_by_rid[rid].send_encode_request()
    _poll(rel, ranks, spec.get("timeout", 60))
    encoder.join(60)
    error = dispatch.get("error")
    for rank in ranks:
        if rank.scheduler_recv_socket is not None:
            rank.scheduler_recv_socket.close(linger=0)
    return {"ranks": _report(ranks), "dispatch_error": None if error in (None, True) else (
        [error.error_msg, error.error_code] if hasattr(error, "error_msg") else str(error))}


def load_mooncake(rel: sglang_release.Release) -> Any:
    module = sys.modules.get("sglang.srt.distributed.device_communicators.mooncake_transfer_engine")
    return module or sglang_release.load_mooncake_wrapper(rel)


SCENARIOS = {"frames-tokenizer": frames_tokenizer, "frames-scheduler": frames_scheduler, "pickle": pickles,
             "unpickle": unpickle, "dispatch-tokenizer": dispatch_tokenizer, "dispatch-ranks": dispatch_ranks}


def run(rel: sglang_release.Release, spec: dict[str, Any], tap: LogTap) -> dict[str, Any]:
    tap.lines.clear()
    scenario = SCENARIOS[spec["mode"]]
    if inspect.iscoroutinefunction(scenario):
        result = asyncio.run(scenario(rel, spec))
    else:
        result = scenario(rel, spec)
    return {**result, "logs": list(tap.lines)}


def main() -> None:
    site, version = Path(sys.argv[1]), sys.argv[2]
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    tap = LogTap()
    logging.getLogger().addHandler(tap)
    warnings.simplefilter("ignore")  # torch.frombuffer warns on ZMQ's read-only frames: sglang's concern
    rel = sglang_release.load_release(site, version)
    emit("LOADED", {"release": version, "notes": rel.notes})
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            result = run(rel, json.loads(line), tap)
        except Exception:  # noqa: BLE001 - reported to the test, which fails with it
            result = {"error": traceback.format_exc(), "logs": list(tap.lines)}
        emit("RESULT", result)
    sys.stdout.flush()
    os._exit(0)  # daemon threads (registration runners, mooncake) must not hold the process open


if __name__ == "__main__":
    main()
