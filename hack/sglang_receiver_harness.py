"""Run SGLang's own prefill-side receiver code against encoderpool, offline, in its own process.

Usage: python hack/sglang_receiver_harness.py SITE_DIR SCENARIO_JSON

SITE_DIR holds sglang installed with ``--no-deps`` (hack/sglang-receiver.sh). Importing sglang
normally drags in its whole GPU stack, so this loads SGLang's *real source files* under their
real module names and replaces only the imports that have nothing to do with receiving (runtime
config getters, the model processor, GPU pools) by stand-ins that fail loudly if called. The
decoding under test (``SafeUnpickler``, ``EmbeddingData``, ``MultiModalEmbeddingData``,
``WaitingZmqRequest``, ``MMReceiverBase._recv_mm_data`` / ``_drain_scheduler_embeddings``,
``MMReceiverHTTP.encode``) is sglang's code, unmodified. The only stand-in on that path is the
model's multimodal processor, which records what it was handed.

Prints ``READY {json}`` once its sockets are bound, then ``RESULT {json}``; logs go to stderr.
"""

from __future__ import annotations

import ast
import asyncio
import json
import logging
import sys
import threading
import time
import types
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

RELEASE = "0.5.23"
RECEIVER = "sglang.srt.disaggregation.encoder.receiver"
SKIP_IMPORTS = ("sglang", "transformers")


class Missing:
    """Stand-in for an import the receive path does not need; any use fails loudly."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"harness stand-in {self._name} was called: the harness needs updating for this sglang")

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise RuntimeError(f"harness stand-in {self._name}.{attr} was used")


def _register_packages(names: list[str]) -> None:
    # Empty parents, so "import sglang..." never runs sglang/__init__.py (which imports everything).
    for name in names:
        if name not in sys.modules:
            module = types.ModuleType(name)
            module.__path__ = []  # type: ignore[attr-defined]
            sys.modules[name] = module


def load_module(name: str, path: Path, provided: dict[str, Any], only: list[str] | None = None) -> types.ModuleType:
    """Exec sglang's source file ``path`` as module ``name``.

    Imports of sglang itself (and transformers) are replaced by ``provided`` or :class:`Missing`;
    other imports run for real, or become :class:`Missing` when not installed. With ``only``, just
    those top-level definitions are kept (they must all exist: a rename fails loudly).
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    module = types.ModuleType(name)
    module.__file__ = str(path)
    namespace = module.__dict__
    body: list[ast.stmt] = []
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)) and not (isinstance(node, ast.ImportFrom) and node.module == "__future__"):
            source = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
            for alias in node.names:
                bound = alias.asname or alias.name.split(".")[0]
                if (source or "").startswith(SKIP_IMPORTS) or alias.name.startswith(SKIP_IMPORTS):
                    namespace[bound] = provided.get(bound, Missing(bound))
                    continue
                try:
                    exec(compile(ast.Module([type(node)(**{**node.__dict__, "names": [alias]})], []), str(path), "exec"), namespace)
                except ImportError:
                    namespace[bound] = Missing(bound)
            continue
        if only is not None:
            names = {getattr(node, "name", None)} | {t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)}
            if not names & set(only):
                continue
            found |= names & set(only)
        body.append(node)
    if only is not None and set(only) - found:
        raise SystemExit(f"sglang {RELEASE}: {path.name} no longer defines {sorted(set(only) - found)}")
    namespace.update({k: v for k, v in provided.items() if k not in namespace})
    sys.modules[name] = module
    exec(compile(ast.Module(body, []), str(path), "exec"), namespace)
    return module


@dataclass
class _Env:
    value: Any

    def get(self) -> Any:
        return self.value

    def is_set(self) -> bool:
        return False


class _Envs:
    """The receive path's sglang env settings, at their defaults (timeouts shortened for tests)."""

    SGLANG_ENCODER_HTTP_TIMEOUT = _Env(60)
    SGLANG_ENCODER_RECV_TIMEOUT = _Env(60)
    SGLANG_EMBEDDING_POOL_SIZE_MB = _Env(0)


@dataclass
class EncoderDispatchErrorReq:
    """Stand-in for sglang's io_struct message of the same name (a plain record there too)."""

    rid: str
    error_msg: str
    error_code: int


def load_sglang(site: Path) -> types.ModuleType:
    """SGLang's receiver module, with its real dependencies on the decode path."""
    import io
    import pickle
    from typing import Dict, List, Literal, Optional, Union

    import torch
    import zmq

    root = site / "sglang"
    _register_packages(["sglang", "sglang.srt", "sglang.srt.disaggregation", "sglang.srt.disaggregation.encoder",
                        "sglang.srt.multimodal", "sglang.srt.multimodal.cache", "sglang.srt.utils", "sglang.srt.managers"])
    modality = load_module("sglang.srt.multimodal.modality", root / "srt/multimodal/modality.py", {})
    basics = dict(io=io, pickle=pickle, torch=torch, dataclass=dataclass, Optional=Optional, Dict=Dict,
                  List=List, Literal=Literal, Union=Union, Any=Any, pybase64=Missing("pybase64"))
    common = load_module("sglang.srt.utils.common", root / "srt/utils/common.py", basics,
                         only=["_safe_load_torch_storage", "SafeUnpickler", "safe_pickle_loads", "ImageData", "VideoData"])
    network = load_module("sglang.srt.utils.network", root / "srt/utils/network.py", {})
    identity = load_module("sglang.srt.multimodal.cache.identity", root / "srt/multimodal/cache/identity.py", {})

    def get_zmq_socket_on_host(context: Any, socket_type: int, host: str | None = None) -> tuple[int, Any]:
        sock = context.socket(socket_type)
        return sock.bind_to_random_port(f"tcp://{host or '127.0.0.1'}"), sock

    provided = {
        "Modality": modality.Modality,
        "safe_pickle_loads": common.safe_pickle_loads,
        "ImageData": common.ImageData,
        "VideoData": common.VideoData,
        "NetworkAddress": network.NetworkAddress,
        "media_preprocess_kwargs": identity.media_preprocess_kwargs,
        "envs": _Envs(),
        "EncoderDispatchErrorReq": EncoderDispatchErrorReq,
        "get_zmq_socket_on_host": get_zmq_socket_on_host,
        "get_local_ip_auto": lambda *a: "127.0.0.1",
        "zmq": zmq,
    }
    return load_module(RECEIVER, root / "srt/disaggregation/encoder/receiver.py", provided)


# --- the model processor stand-in: records what sglang's receiver assembled ---------------------
def _plain(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class RecordingProcessor:
    """What ``get_mm_processor`` would return; keeps the merged embeddings and grids it was given."""

    prefer_tokenized_input = False

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def get_validated_mm_data(self, prompt: Any, recv_embedding: dict[Any, Any], **meta: Any) -> Any:
        summary = {
            "embeddings": {
                m.name: {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch."), "values": t.float().tolist()}
                for m, t in recv_embedding.items()
            },
            "meta": {k: _plain(v) for k, v in meta.items()},
        }
        self.calls.append(summary)
        return SimpleNamespace(input_ids=[1, 2, 3], summary=summary)


class LogTap(logging.Handler):
    """Keeps sglang's warnings and errors for the result."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def emit(tag: str, payload: Any) -> None:
    print(f"{tag} {json.dumps(payload)}", flush=True)


# --- scenarios -------------------------------------------------------------------------------
async def frames_tokenizer(rx: Any, spec: dict[str, Any]) -> dict[str, Any]:
    """zmq_to_tokenizer: sglang's _recv_mm_data on a PULL socket, fed by the test's producer."""
    import zmq
    import zmq.asyncio

    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.PULL)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    emit("READY", {"port": port})
    proc = RecordingProcessor()
    owner = SimpleNamespace(model_type=None)
    result = await asyncio.wait_for(rx.MMReceiverBase._recv_mm_data(owner, spec["req_id"], sock, proc, "prompt"), spec.get("timeout", 30))
    ctx.term()
    return {"returned": None if result is None else result.summary}


def _waiting(rx: Any, rid: str, port: int, ctx: Any, proc: Any, urls: list[str], count: int, runner: Any, assigned: Any = None) -> Any:
    recv_req = SimpleNamespace(rid=rid, input_ids=None, input_text="prompt", num_items_assigned=assigned or {}, mm_inputs=None)
    return rx.WaitingZmqRequest(
        rid=rid, recv_req=recv_req, mm_processor=proc, encoder_urls=urls, model_type=None, host_name="127.0.0.1",
        receive_count=count, embedding_pool=None, zmq_context=ctx, embedding_port=port, registration_runner=runner,
    )


def _rank(rx: Any, ctx: Any) -> Any:
    import zmq

    sock = ctx.socket(zmq.PULL)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    return SimpleNamespace(scheduler_recv_socket=sock, port=port, waiting_by_rid={})


def _poll(rx: Any, ranks: list[Any], timeout: float) -> None:
    """The scheduler tick: drain the shared socket, then let each waiting request assemble."""
    pending = rx.WaitingMMRequestStatus.PENDING
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for rank in ranks:
            rx.MMReceiverBase._drain_scheduler_embeddings(rank)
            for waiting in rank.waiting_by_rid.values():
                waiting._try_recv_mm_data()
        if all(w.status != pending for r in ranks for w in r.waiting_by_rid.values()):
            return
        time.sleep(0.01)


def _report(ranks: list[Any]) -> list[dict[str, Any]]:
    return [
        {rid: {"status": w.status.name, "error_msg": w.error_msg, "error_code": w.error_code,
               "mm": getattr(w.recv_req.mm_inputs, "summary", None)} for rid, w in rank.waiting_by_rid.items()}
        for rank in ranks
    ]


def frames_scheduler(rx: Any, spec: dict[str, Any]) -> dict[str, Any]:
    """zmq_to_scheduler: sglang's shared-socket drain routing parts to WaitingZmqRequest by rid."""
    import zmq

    ctx = zmq.Context()
    ranks = [_rank(rx, ctx)]
    proc = RecordingProcessor()
    for rid in spec["rids"]:
        ranks[0].waiting_by_rid[rid] = _waiting(rx, rid, ranks[0].port, ctx, proc, [], 1, None)
    emit("READY", {"port": ranks[0].port})
    _poll(rx, ranks, spec.get("timeout", 30))
    return {"ranks": _report(ranks)}


def _request(spec: dict[str, Any]) -> Any:
    return SimpleNamespace(image_data=spec.get("images") or None, video_data=None, audio_data=spec.get("audios") or None,
                           mm_content_hashes=None, rid=None)


def _http_receiver(rx: Any, urls: list[str], backend: str) -> Any:
    import zmq.asyncio

    obj = rx.MMReceiverHTTP.__new__(rx.MMReceiverHTTP)  # __init__ reads sglang's global server config
    obj.context = zmq.asyncio.Context()
    obj.encode_urls = list(urls)
    obj.recv_timeout = 60
    obj.host = "127.0.0.1"
    obj.model_type = None
    obj.encoder_transfer_backend = backend
    return obj


async def http_tokenizer(rx: Any, spec: dict[str, Any]) -> dict[str, Any]:
    """The real zmq_to_tokenizer client path: recv_mm_data -> MMReceiverHTTP.encode -> our /encode."""
    emit("READY", {})
    obj = _http_receiver(rx, spec["encode_urls"], "zmq_to_tokenizer")
    proc = RecordingProcessor()
    result = await obj.recv_mm_data(_request(spec), proc, "prompt")
    obj.context.term()
    return {"returned": None if result is None else result.summary}


def http_scheduler(rx: Any, spec: dict[str, Any]) -> dict[str, Any]:
    """The real zmq_to_scheduler path: each rank registers via /scheduler_receive_url, /encode with a null port."""
    import zmq

    ctx = zmq.Context()
    urls = spec["encode_urls"]
    obj = _http_receiver(rx, urls, "zmq_to_scheduler")
    mm_data = obj._extract_url_data(_request(spec))
    assigned = obj._assign_items_by_modality(mm_data, len(urls))
    rid = spec["rid"]
    tp = spec.get("tp", 1)
    proc = RecordingProcessor()
    ranks = [_rank(rx, ctx) for _ in range(tp)]
    runners = [rx._ReceiveRegistrationRunner(f"reg-{i}") for i in range(tp)]
    emit("READY", {"ports": [r.port for r in ranks]})
    for rank, runner in zip(ranks, runners):
        rank.waiting_by_rid[rid] = _waiting(rx, rid, rank.port, ctx, proc, urls, tp, runner, assigned)
        if spec.get("register_first", True):
            rank.waiting_by_rid[rid].send_encode_request()
    dispatch: dict[str, Any] = {}

    def run_encode() -> None:
        dispatch["error"] = asyncio.run(obj.encode(rid, mm_data, None, "encode", num_items_assigned=assigned, encode_urls=urls))

    encoder = threading.Thread(target=run_encode)
    encoder.start()
    if not spec.get("register_first", True):
        time.sleep(0.5)
        for rank in ranks:
            rank.waiting_by_rid[rid].send_encode_request()
    _poll(rx, ranks, spec.get("timeout", 60))
    encoder.join(60)
    error = dispatch.get("error")
    return {"ranks": _report(ranks), "dispatch_error": None if error is None else [error.error_msg, error.error_code]}


def pickles(rx: Any, spec: dict[str, Any]) -> dict[str, Any]:
    """Frame 0 as sglang's own encoder pickles it (EmbeddingData.copy_without_embedding)."""
    import pickle

    import torch

    emit("READY", {})
    out = []
    for case in spec["cases"]:
        modality = rx.Modality[case["modality"]]
        grid = case.get("grid_dim")
        if isinstance(grid, dict):
            grid = torch.tensor(grid["tensor"], dtype=torch.int64)
        if case.get("error_msg") is not None:
            data = rx.EmbeddingData(case["req_id"], case["num_parts"], case["part_idx"], None, modality,
                                    error_msg=case["error_msg"], error_code=case["error_code"])
        else:
            embedding = torch.zeros(case["shape"], dtype=getattr(torch, case["dtype"]))
            data = rx.EmbeddingData(case["req_id"], case["num_parts"], case["part_idx"], grid, modality, embedding)
        frame = data.copy_without_embedding()
        frame.send_time = case["send_time"]
        out.append(pickle.dumps(frame).hex())
    return {"pickles": out}


def main() -> None:
    site, spec = Path(sys.argv[1]), json.loads(sys.argv[2])
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    tap = LogTap()
    logging.getLogger().addHandler(tap)
    warnings.simplefilter("ignore")  # torch.frombuffer warns on ZMQ's read-only frames: sglang's concern
    rx = load_sglang(site)
    mode = spec["mode"]
    if mode == "frames-tokenizer":
        result = asyncio.run(frames_tokenizer(rx, spec))
    elif mode == "frames-scheduler":
        result = frames_scheduler(rx, spec)
    elif mode == "http-tokenizer":
        result = asyncio.run(http_tokenizer(rx, spec))
    elif mode == "http-scheduler":
        result = http_scheduler(rx, spec)
    elif mode == "pickle":
        result = pickles(rx, spec)
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    emit("RESULT", {**result, "logs": tap.lines})
    sys.stdout.flush()
    # Daemon threads (registration runners) and ZMQ contexts must not hold the process open.
    import os

    os._exit(0)


if __name__ == "__main__":
    main()
