"""Load ONE SGLang release's own prefill-side source files, offline, without importing sglang.

Importing sglang normally drags in its whole GPU stack, so this parses the release's *real source
files* and executes them under their real module names. Imports of other sglang modules (and
transformers) become stand-ins that fail loudly if used, except the few handed in below; every
other import runs for real. One release per process (the module names collide).

What runs is the release's code, unmodified: ``SafeUnpickler``/``safe_pickle_loads``,
``EmbeddingData``/``MultiModalEmbeddingData`` and the merge, the part checks,
``MMReceiverBase._recv_mm_data`` (zmq_to_tokenizer), ``_drain_scheduler_embeddings`` and
``WaitingZmqRequest`` (zmq_to_scheduler), ``WaitingRDMARequest`` with SGLang's own
``MooncakeTransferEngine`` wrapper (mooncake), ``MMReceiverHTTP.encode`` (the /encode dispatch),
``EncoderBootstrapServer``, ``environ.py`` (real env names and defaults), and the base multimodal
processor's ``get_validated_mm_data`` / layout check plus Qwen2-Audio's ``get_mm_data``.

Used by hack/sglang_receiver_harness.py and hack/sglang_bootstrap.py (tests only).
"""

from __future__ import annotations

import ast
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RECEIVER = "sglang.srt.disaggregation.encoder.receiver"
SKIP = ("sglang", "transformers")


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


def _packages(names: list[str]) -> None:
    # Empty parents, so "import sglang..." never runs sglang/__init__.py (which imports everything).
    for name in names:
        if name not in sys.modules:
            module = types.ModuleType(name)
            module.__path__ = []  # type: ignore[attr-defined]
            sys.modules[name] = module
            parent, _, child = name.rpartition(".")
            if parent in sys.modules:
                setattr(sys.modules[parent], child, module)


def _register(name: str, module: types.ModuleType) -> None:
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent:
        _packages([parent])
        setattr(sys.modules[parent], child, module)


def _defined(node: ast.stmt) -> set[str]:
    names = {getattr(node, "name", None)} | {t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        names.add(node.target.id)
    return {n for n in names if n}


def load_module(name: str, path: Path, provided: dict[str, Any], only: list[str] | None = None,
                skip: tuple[str, ...] = SKIP) -> types.ModuleType:
    """Exec sglang's source file ``path`` as module ``name``.

    Imports of ``skip`` (sglang and transformers; hack/vllm_release.py passes vllm) are replaced by
    ``provided`` or :class:`Missing`; other imports run for real, or become :class:`Missing` when
    not installed. With ``only``, just those top-level definitions are kept (they must all exist:
    a rename fails loudly).
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
                if (source or "").startswith(skip) or alias.name.startswith(skip) or getattr(node, "level", 0):
                    namespace[bound] = provided.get(bound, Missing(bound))
                    continue
                try:
                    exec(compile(ast.Module([type(node)(**{**node.__dict__, "names": [alias]})], []), str(path), "exec"), namespace)
                except ImportError:
                    namespace[bound] = Missing(bound)
            continue
        if only is not None:
            names = _defined(node) & set(only)
            if not names:
                continue
            found |= names
        body.append(node)
    if only is not None and set(only) - found:
        raise SystemExit(f"{path} no longer defines {sorted(set(only) - found)}: the harness needs updating")
    namespace.update({k: v for k, v in provided.items() if k not in namespace})
    _register(name, module)
    exec(compile(ast.Module(body, []), str(path), "exec"), namespace)
    return module


def top_level_names(path: Path) -> set[str]:
    """Names a source file defines at top level."""
    return {n for node in ast.parse(path.read_text()).body for n in _defined(node)}


def class_from_methods(path: Path, cls: str, methods: list[str], namespace: dict[str, Any], new_name: str) -> type:
    """A class whose methods are the release's own method source (decorators kept)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    picked = [m for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and m.name in methods]
    missing = set(methods) - {m.name for m in picked}
    if missing:
        raise SystemExit(f"{path}:{cls} has no {sorted(missing)}: the harness needs updating")
    new = ast.ClassDef(name=new_name, bases=[], keywords=[], body=picked, decorator_list=[], type_params=[])
    exec(compile(ast.fix_missing_locations(ast.Module([new], [])), str(path), "exec"), namespace)
    return namespace[new_name]


@dataclass
class MultimodalDataItem:
    """Record stand-in (schedule_batch.MultimodalDataItem is a dataclass too)."""

    modality: Any
    offsets: Any = None
    precomputed_embeddings: Any = None
    audio_feature_lens: Any = None


class MultimodalProcessorOutput:
    """Record stand-in."""

    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)


@dataclass
class EncoderDispatchErrorReq:
    """Stand-in for sglang's io_struct record of the same name (a plain record there too)."""

    rid: str
    error_msg: str
    error_code: int


@dataclass
class Release:
    """One release's loaded modules."""

    version: str
    srt: Path
    rx: types.ModuleType
    common: types.ModuleType
    modality: Any
    envs: Any
    base_processor: type | None = None
    qwen2_audio_get_mm_data: Any = None
    notes: list[str] = field(default_factory=list)


PACKAGES = ["sglang", "sglang.srt", "sglang.srt.disaggregation", "sglang.srt.disaggregation.encoder", "sglang.srt.multimodal",
            "sglang.srt.multimodal.cache", "sglang.srt.multimodal.processors", "sglang.srt.utils", "sglang.srt.managers",
            "sglang.srt.observability", "sglang.srt.distributed", "sglang.srt.distributed.device_communicators"]


def _envs(srt: Path) -> Any:
    return load_module("sglang.srt.environ", srt / "environ.py", {}).envs


def _trace_kwargs(srt: Path, envs: Any) -> Any:
    trace = srt / "observability/trace.py"
    if trace.exists() and "fastapi_telemetry_disabled_kwargs" in top_level_names(trace):
        return load_module("sglang.srt.observability.trace", trace, {"envs": envs},
                           only=["fastapi_telemetry_disabled_kwargs"]).fastapi_telemetry_disabled_kwargs
    return lambda: {}


def load_bootstrap(site: Path) -> Any:
    """Only ``EncoderBootstrapServer`` (and environ.py): no torch, zmq or numpy is imported."""
    srt = site / "sglang/srt"
    _packages(PACKAGES)
    envs = _envs(srt)
    provided = {"envs": envs, "fastapi_telemetry_disabled_kwargs": _trace_kwargs(srt, envs)}
    rx = load_module(RECEIVER, srt / "disaggregation/encoder/receiver.py", provided, only=["logger", "EncoderBootstrapServer"])
    return rx.EncoderBootstrapServer


def _modality(srt: Path, notes: list[str]) -> Any:
    # The receiver imports Modality from managers.schedule_batch in every release; 0.5.23 defines it in
    # multimodal/modality.py and re-exports it there.
    if (srt / "multimodal/modality.py").exists():
        mod = load_module("sglang.srt.multimodal.modality", srt / "multimodal/modality.py", {})
        batch = types.ModuleType("sglang.srt.managers.schedule_batch")
        batch.Modality = mod.Modality  # type: ignore[attr-defined]
        batch.MultimodalInputFormat = mod.MultimodalInputFormat  # type: ignore[attr-defined]
        _register("sglang.srt.managers.schedule_batch", batch)
        notes.append("Modality defined in multimodal/modality.py, re-exported by managers.schedule_batch")
        return mod.Modality
    batch = load_module("sglang.srt.managers.schedule_batch", srt / "managers/schedule_batch.py", {},
                        only=["Modality", "MultimodalInputFormat"])
    notes.append("Modality defined in managers/schedule_batch.py")
    return batch.Modality


def load_release(site: Path, version: str) -> Release:
    """The release's receiver module with its real dependencies on the decode path."""
    import io
    import pickle
    from typing import Dict, List, Literal, Optional, Union

    import torch
    import zmq

    srt = site / "sglang/srt"
    notes: list[str] = []
    _packages(PACKAGES)
    envs = _envs(srt)
    modality = _modality(srt, notes)
    basics = dict(io=io, pickle=pickle, torch=torch, dataclass=dataclass, Optional=Optional, Dict=Dict, List=List,
                  Literal=Literal, Union=Union, Any=Any, pybase64=Missing("pybase64"))
    common_path = srt / "utils/common.py"
    wanted = ["_safe_load_torch_storage", "SafeUnpickler", "safe_pickle_load", "safe_pickle_loads", "ImageData", "VideoData",
              "run_with_deadline"]
    common = load_module("sglang.srt.utils.common", common_path, basics, only=[n for n in wanted if n in top_level_names(common_path)])
    network = load_module("sglang.srt.utils.network", srt / "utils/network.py", {})
    identity = load_module("sglang.srt.multimodal.cache.identity", srt / "multimodal/cache/identity.py", {})

    def get_zmq_socket_on_host(context: Any, socket_type: int, host: str | None = None) -> tuple[int, Any]:
        sock = context.socket(socket_type)
        return sock.bind_to_random_port(f"tcp://{host or '127.0.0.1'}"), sock

    provided = {
        "Modality": modality,
        "safe_pickle_loads": common.safe_pickle_loads,
        "ImageData": common.ImageData,
        "VideoData": getattr(common, "VideoData", Missing("VideoData")),
        "NetworkAddress": network.NetworkAddress,
        "media_preprocess_kwargs": identity.media_preprocess_kwargs,
        "envs": envs,
        "EncoderDispatchErrorReq": EncoderDispatchErrorReq,
        "get_zmq_socket_on_host": get_zmq_socket_on_host,
        "get_local_ip_auto": lambda *a: "127.0.0.1",
        "fastapi_telemetry_disabled_kwargs": _trace_kwargs(srt, envs),
        "zmq": zmq,
    }
    rx = load_module(RECEIVER, srt / "disaggregation/encoder/receiver.py", provided)
    release = Release(version, srt, rx, common, modality, envs, notes=notes)
    _processors(release)
    return release


def _processors(release: Release) -> None:
    """The base processor built from the release's own methods, and Qwen2-Audio's get_mm_data."""
    from typing import Dict, List, Optional

    import torch

    namespace = {"Modality": release.modality, "MultimodalDataItem": MultimodalDataItem,
                 "MultimodalProcessorOutput": MultimodalProcessorOutput, "torch": torch,
                 "Dict": Dict, "List": List, "Optional": Optional, "Any": Any}
    base = release.srt / "multimodal/processors/base_processor.py"
    methods = ["build_input_ids", "get_mm_data"]
    if "def get_validated_mm_data" in base.read_text():
        methods += ["get_validated_mm_data", "_validate_precomputed_embedding_layout"]
    else:
        release.notes.append("no get_validated_mm_data: the receiver calls get_mm_data (no layout check)")
    release.base_processor = class_from_methods(base, "BaseMultimodalProcessor", methods, namespace, "BaseProcessorFromWheel")
    audio = class_from_methods(release.srt / "multimodal/processors/qwen_audio.py", "Qwen2AudioMultimodalProcessor",
                               ["get_mm_data"], dict(namespace), "Qwen2AudioGetMMData")
    release.qwen2_audio_get_mm_data = audio.get_mm_data


def load_mooncake_wrapper(release: Release) -> types.ModuleType:
    """SGLang's own ``MooncakeTransferEngine`` module (distributed/device_communicators/mooncake_transfer_engine.py)."""
    network = sys.modules["sglang.srt.utils.network"]
    common = sys.modules["sglang.srt.utils.common"]
    runtime_context = types.SimpleNamespace(get_disagg=lambda: None, get_exec=lambda: None, get_memory=lambda: None)
    provided = {
        "envs": release.envs,
        "run_with_deadline": getattr(common, "run_with_deadline", Missing("run_with_deadline")),
        "NetworkAddress": network.NetworkAddress,
        "get_free_port": Missing("get_free_port"),
        "get_local_ip_auto": lambda *a: "127.0.0.1",
        **{name: getattr(runtime_context, name) for name in ("get_disagg", "get_exec", "get_memory")},
    }
    path = release.srt / "distributed/device_communicators/mooncake_transfer_engine.py"
    return load_module("sglang.srt.distributed.device_communicators.mooncake_transfer_engine", path, provided)
