"""The encoder pod's settings: one group per concern, parsed once at start and passed down.

Every field is an env var ``ENCODER_<NAME>`` and a CLI flag ``--<name-with-dashes>`` of
``encoder-pod serve``, where NAME is the field's own name: the groups only organise the code,
they never appear in a variable or flag name, so the names stay flat and unique across groups.
``SGLANG_ENCODER_<NAME>`` is accepted as an alias for drop-in use where SGLang's names are
deployed; the ``ENCODER_`` name wins when both are set, a CLI flag wins over both.

Code reads ``settings.<group>.<name>`` (``settings.batching.max_batch_size``) and each layer is
handed the group(s) it needs (the batch scheduler gets ``settings.batching``, the media sources
``settings.media``). The groups:

- ``model``: which checkpoint, on which device and dtype, with how many CPU threads.
- ``server``: the HTTP listener (bind address, body limit; connection limits, header and drain
  timeouts and the URL this pod advertises belong here too).
- ``admission``: what is let in and for how long (queue bound, request deadline).
- ``batching``: how admitted requests become batches (size, wait, token budget).
- ``media``: where item bytes may come from and what decoded media may be (sources, size and
  duration limits, video sampling; allowed media domains belong here).
- ``transfer``: how embeddings reach prefill servers (backend, wire format, push sockets).
- ``parallel``: data-parallel workers and tensor-parallel groups, their watchdogs and timeouts.
- ``cache``: the embedding cache (its byte budget).
- ``vllm``: vLLM's EPD face (the shared storage its consumers read, the model id they hash with).
- ``observability``: logging and the readiness probe.

A new concern gets its own group (e.g. ``cache`` for an embedding cache size): declare a
:class:`SettingsGroup` subclass and add one field for it to :class:`EncoderSettings`; the env
reader, the CLI flags and the error messages pick it up from the model.

This module is the one declaration of every pod setting (name, type, bounds, default, doc, env
names, flag, and the EncoderPool field the operator sets it from: :func:`names`' ``crd`` and
``derived_from``; relations between settings: :data:`RELATIONS`). The CRD's settings fields,
the operator's settings models and env rendering, and the table in docs/configuration.md are
generated from it by ``python -m encoder_pod.settings_gen`` (`make generate`); a test fails when
a generated file differs. docs/configuration.md says how to add a setting.

Why plain pydantic models and this module's own env reader, not pydantic-settings: the names
are flat while the model is nested, and pydantic-settings maps nested models only through a
delimiter (``ENCODER_BATCHING__MAX_BATCH_SIZE``), which would rename every deployed variable;
the precedence CLI > ``ENCODER_`` > ``SGLANG_ENCODER_`` and error messages that name the
variable and the flag need a reader that knows which name supplied each value; and data-parallel
workers and tensor-parallel ranks rebuild the settings from the JSON their parent sends
(:meth:`EncoderSettings.model_validate_json`), never from their own environment, which differs
(``CUDA_VISIBLE_DEVICES``, thread counts). A plain model does exactly that and nothing implicit.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Literal, Mapping, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo

ENV_PREFIX = "ENCODER_"
ALIAS_PREFIX = "SGLANG_ENCODER_"

log = logging.getLogger(__name__)

SGLANG_RELEASES = ("0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23")
"""SGLang releases whose prefill-side receiver reads this pod's frames (each tested against its own code)."""

VLLM_RELEASES = ("0.34.0",)
"""vLLM releases whose consumers read what this pod's vLLM face stores (tested against that release's own code)."""


def names(
    *,
    flag: str | None = None,
    deprecated_env: tuple[str, ...] = (),
    env_aliases: tuple[str, ...] = (),
    crd: str | None = None,
    derived_from: str | None = None,
) -> dict[str, Any]:
    """``Field(json_schema_extra=...)``: how a setting is named outside, where the rule is not enough.

    ``flag`` replaces ``--<name>`` (SGLang's own flag name, for drop-in use); ``env_aliases`` are
    further names read after ``ENCODER_<NAME>`` and ``SGLANG_ENCODER_<NAME>`` (SGLang's own name of
    the same setting); ``deprecated_env`` still work, after those, and log a warning naming the
    replacement.

    The operator sets a setting from a pool's spec in one of two ways. ``crd="object.field"``
    (``"batching.maxBatchSize"``): the EncoderPool field ``spec.<object>.<field>`` IS this setting
    (same type, bounds, default and doc; the object is one of :data:`CRD_OBJECTS`), generated into
    the CRD and the operator. ``derived_from="..."``: the operator computes it from other spec
    fields (the text says which; its rendering is written by hand in the operator's podenv.py).
    Either way spec.env may not set it. Settings with neither are left to the pod's default, or
    to spec.env.
    """
    if crd is not None and derived_from is not None:
        raise ValueError("a setting is either a CRD field (crd=) or derived from the spec (derived_from=), not both")
    return {
        "flag": flag,
        "deprecated_env": list(deprecated_env),
        "env_aliases": list(env_aliases),
        "crd": crd,
        "derived_from": derived_from,
    }


CRD_OBJECTS: dict[str, str] = {
    "parallelism": "Parallelism inside one pod. GPUs per pod = tensor x data (on spec.device=cuda).",
    "batching": "Batching and admission settings of every encoder pod (its ENCODER_* environment).",
    "transfer": "Where embeddings go once encoded.",
    "vllm": "How the pods name and store embeddings for vLLM consumers (docs/vllm.md); the face is on with spec.vllmStorage.",
}
"""The objects of an EncoderPool's spec that hold pod settings (``names(crd="<object>.<field>")``), with their doc."""


@dataclass(frozen=True)
class NotAbove:
    """Setting ``low`` must not exceed setting ``high``, for the reason ``why``.

    Checked when the settings are parsed (the pod refuses to start), and, where both are fields of
    one CRD object, by a CEL rule of the CRD and by the operator's generated model.
    """

    low: str
    high: str
    why: str


RELATIONS: tuple[NotAbove, ...] = (
    NotAbove("max_batch_size", "max_queue", "a batch is drawn from the queue"),
    NotAbove("video_min_frames", "video_max_frames", "the fewest frames sampled from a video cannot be more than the most"),
)
"""Relations between settings, each checked wherever both settings are (see :class:`NotAbove`)."""


def split_list(value: str | list[Any]) -> list[str]:
    """A list setting from an env value or repeated flag values: split on commas and spaces, blanks dropped."""
    parts = [value] if isinstance(value, str) else [str(v) for v in value]
    return [item for part in parts for item in part.replace(",", " ").split()]


def normalise_media_domain(domain: str) -> str:
    """An ALLOWED_MEDIA_DOMAINS entry as SGLang normalises it, plus ``*.suffix`` wildcards.

    Stripped, trailing dot removed, brackets of ``[v6]`` removed, IP literals canonical, names
    IDNA-encoded and lower-cased. Schemes, paths, user info and ports are refused (ValueError).
    """
    text = domain.strip().rstrip(".")
    if not text:
        raise ValueError("an allowed media domain cannot be empty")
    if "://" in text or any(c in text for c in "/?#@"):
        raise ValueError(f"allowed media domain {text!r}: give a host name only (no scheme, path or user)")
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        if ":" in text:
            raise ValueError(f"allowed media domain {text!r}: ports are not supported") from None
    wildcard = text.startswith("*.")
    name = text[2:] if wildcard else text
    if not name or "*" in name:
        raise ValueError(f"allowed media domain {text!r}: a wildcard is '*.' followed by a domain")
    try:
        normalised = name.encode("idna").decode("ascii").lower()
    except UnicodeError:
        raise ValueError(f"allowed media domain {text!r} is not a valid host name") from None
    return f"*.{normalised}" if wildcard else normalised


class SettingsError(Exception):
    """A bad setting; the message names the variable, its flag and the allowed range.

    Raised by library code like any error; only ``encoder_pod.cli`` turns it into an exit code
    (:attr:`~encoder_pod.exitcodes.ExitCode.BAD_SETTINGS`).
    """


class ModelPathError(SettingsError):
    """``MODEL_PATH`` holds no checkpoint (the CLI exits with ``MODEL_LOAD_FAILED``)."""


class TransferBackend(str, Enum):
    """Where an embedding goes once encoded (SGLang's ``--encoder-transfer-backend`` values, plus inline)."""

    AUTO = "auto"
    INLINE = "inline"
    ZMQ_TO_TOKENIZER = "zmq_to_tokenizer"
    ZMQ_TO_SCHEDULER = "zmq_to_scheduler"
    MOONCAKE = "mooncake"


class WireFormat(str, Enum):
    """The frames a ZMQ push carries."""

    SGLANG = "sglang"
    ENCODERPOOL = "encoderpool"


class SettingsGroup(BaseModel):
    """Base of every group: immutable, unknown names refused, field docstrings are the help text."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True, protected_namespaces=())


class ModelSettings(SettingsGroup):
    """Which checkpoint, on which device and dtype."""

    model_path: str = Field("", json_schema_extra=names(derived_from="from spec.model (inside spec.modelVolume's mountPath; a hub model: its id)"))
    """Checkpoint directory (config.json inside), or a hub id org/name[@revision] (hf:// accepted) resolved from the Hugging Face cache first."""
    revision: str | None = None
    """Hub revision (branch, tag or commit) of a hub id model path; @revision in the path says the same."""
    device: Literal["auto", "cpu", "cuda"] = Field("auto", json_schema_extra=names(derived_from="from spec.device (cpu for a pool that requests no GPU)"))
    """Where the encoder runs: auto (cuda when a device is visible), cpu or cuda."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Weights and activations dtype: auto is bfloat16 on GPU and float32 on CPU."""
    num_threads: int = Field(0, ge=0, le=1024)
    """torch intra-op threads per worker on CPU (0 = torch default)."""
    malloc_tuning: bool = True
    """Pin glibc malloc's mmap (64 MiB) and trim (256 MiB) thresholds in every encoder process, so activations are reused instead of mapped, faulted in and unmapped on every batch (RSS then stays near its peak); false keeps glibc's defaults."""
    image_processor_use_gpu: bool = False
    """SGLang's name, accepted for drop-in use with its only supported value, false: images are preprocessed on the CPU (true is refused at start)."""

    @field_validator("image_processor_use_gpu")
    @classmethod
    def _refuse_gpu_preprocessing(cls, value: bool) -> bool:
        if value:
            raise ValueError(
                "preprocessing on the device is not supported: transformers' torch image processors, which "
                "SGLang's IMAGE_PROCESSOR_USE_GPU runs on the GPU, need torchvision, and this project does not "
                "depend on it; images are preprocessed on the CPU by the PIL processors (leave it unset or false)"
            )
        return value


class ServerSettings(SettingsGroup):
    """The HTTP listener."""

    host: str = Field("127.0.0.1", json_schema_extra=names(derived_from="always 0.0.0.0 (the kubelet's probes and the Service reach the pod on its IP)"))
    """Address the HTTP server binds."""
    port: int = Field(30000, ge=1, le=65535, json_schema_extra=names(derived_from="from spec.port"))
    """HTTP port."""
    grpc_port: int = Field(0, ge=0, le=65535, json_schema_extra=names(derived_from="from spec.grpc.port (unset: off)"))
    """Port of SGLang's gRPC encoder face (sglang.grpc.encoder.SglangEncoder, grpc.health.v1, reflection) beside HTTP, on HOST; 0 = off."""
    max_request_bytes: int = Field(64 * 1024 * 1024, ge=1024)
    """Largest /encode body in bytes, 413 beyond; also the largest item fetched from a URL."""
    register_urls: list[str] = Field(
        default_factory=list,
        json_schema_extra=names(flag="--encoder-register-urls", derived_from="from spec.sglang.registerURLs"),
    )
    """SGLang EncoderBootstrapServer base URLs this pod registers with once ready (comma or space separated)."""
    advertise_url: str = Field("", json_schema_extra=names(derived_from="http://$(POD_IP):<spec.port> when spec.sglang.registerURLs is set (the pod IP from the downward API)"))
    """URL this pod registers; unset: http://HOST:PORT (a wildcard HOST becomes this host's address)."""
    register_check_interval: float = Field(30.0, ge=0, le=3600)
    """Seconds between checks that each bootstrap server still lists this pod (it registers again if not; 0 = never)."""

    @field_validator("register_urls", mode="before")
    @classmethod
    def _split_urls(cls, value: Any) -> Any:
        return [u.rstrip("/") for u in split_list(value)] if isinstance(value, (str, list)) else value

    @field_validator("register_urls")
    @classmethod
    def _check_urls(cls, value: list[str]) -> list[str]:
        for url in value:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{url!r} is not an http(s) base URL")
        return value

    @field_validator("advertise_url")
    @classmethod
    def _check_advertise(cls, value: str) -> str:
        value = value.strip().rstrip("/")
        if value and not value.startswith(("http://", "https://")):
            raise ValueError(f"{value!r} is not an http(s) URL")
        return value
    @model_validator(mode="after")
    def _check_grpc_port(self) -> "ServerSettings":
        if self.grpc_port == self.port:
            raise ValueError(
                f"grpc_port ({ENV_PREFIX}GRPC_PORT={self.grpc_port}) must differ from the HTTP port ({ENV_PREFIX}PORT={self.port})"
            )
        return self

    # At most the longest REQ_TIMEOUT + 5: the value it takes when unset (the operator renders it so).
    drain_timeout: float | None = Field(
        None, ge=0, le=86_405,
        json_schema_extra=names(derived_from="from spec.drain.timeoutSeconds (unset: spec.batching.requestTimeoutSeconds + 5)"),
    )
    """Seconds SIGTERM waits for queued and in-flight requests before the rest get 503 + Retry-After (unset: REQ_TIMEOUT + 5)."""
    http_header_timeout: float = Field(10.0, gt=0, le=3600)
    """Seconds a connection may take to send a request's headers (from connect, or from the previous answer); closed beyond."""
    http_keepalive_timeout: int = Field(5, ge=1, le=3600)
    """Seconds an idle keep-alive connection stays open after an answer."""
    http_max_connections: int = Field(2048, ge=1, le=1_000_000)
    """Most open HTTP connections; one more is answered 503 + Retry-After: 1 and closed."""
    http_parser: Literal["httptools", "h11"] = "httptools"
    """HTTP/1.1 parser of the listener: httptools (C, the faster) or h11 (pure Python); both enforce the header timeout, the 16 KiB head bound and the connection limit."""
    event_loop: Literal["auto", "uvloop", "asyncio"] = "auto"
    """Event loop of the HTTP server process: auto is uvloop where it is installed (a dependency on Linux)."""


class AdmissionSettings(SettingsGroup):
    """What is let in, and for how long."""

    max_queue: int = Field(1024, ge=1, le=1_000_000, json_schema_extra=names(crd="batching.maxQueue"))
    """Most requests admitted and not yet answered (waiting, decoding, encoding or delivering) before 429, counted over every data-parallel rank."""
    req_timeout: float = Field(180.0, gt=0, le=86_400, json_schema_extra=names(crd="batching.requestTimeoutSeconds"))
    """Seconds a request may take in total before 504."""


class BatchingSettings(SettingsGroup):
    """How admitted requests become batches."""

    max_batch_size: int = Field(8, ge=1, le=4096, json_schema_extra=names(crd="batching.maxBatchSize"))
    """Most requests in one batch."""
    max_wait_ms: float = Field(0.0, ge=0, le=10_000, json_schema_extra=names(crd="batching.maxWaitMs"))
    """Milliseconds a batch waits for more requests, from its oldest request's arrival (0 = no wait)."""
    max_batch_tokens: int = Field(16384, ge=1, le=10_000_000, json_schema_extra=names(crd="batching.maxBatchTokens"))
    """Budget of encoder output tokens (or patches) per batch; a larger request runs alone."""


class MediaSettings(SettingsGroup):
    """Where item bytes may come from and what decoded media may be."""

    mm_load_workers: int = Field(4, ge=1, le=256, json_schema_extra=names(crd="batching.mmLoadWorkers"))
    """Threads that decode media items."""
    max_image_pixels: int = Field(40_000_000, ge=1)
    """Largest image (width x height), checked from its header before decoding; 400 beyond."""
    max_audio_seconds: float = Field(600.0, gt=0)
    """Longest audio item in seconds; 400 beyond."""
    allow_url_fetch: bool = True
    """Fetch http(s) item URLs (under ALLOWED_MEDIA_DOMAINS and the private-address guard); false refuses every URL."""
    allowed_media_domains: list[str] = Field(
        default_factory=list,
        json_schema_extra=names(flag="--allowed-media-domains", deprecated_env=("ENCODER_ALLOWED_URL_HOSTS",)),
    )
    """Hosts http(s) items may come from: exact names or IPs (normalised, no ports) or *.suffix wildcards, comma separated (empty = any public host); every redirect hop is checked again."""
    allow_private_media_hosts: bool = False
    """Let http(s) items come from private, loopback and link-local addresses (a host listed by exact name or IP always may)."""
    url_fetch_timeout: float = Field(10.0, gt=0, le=600)
    """Seconds one item URL may take in total (every redirect and the body)."""
    allowed_local_media_path: str | None = None
    """Directory file-path items may come from (unset = file paths refused; no escape through .. or links)."""
    video_fps: float = Field(2.0, gt=0, le=120)
    """Frames per second sampled from a video."""
    video_min_frames: int = Field(2, ge=1)
    """Fewest frames sampled from a video."""
    video_max_frames: int = Field(64, ge=1)
    """Most frames sampled from a video."""

    @field_validator("allowed_media_domains", mode="before")
    @classmethod
    def _split_domains(cls, value: Any) -> Any:
        return split_list(value) if isinstance(value, (str, list)) else value

    @field_validator("allowed_media_domains")
    @classmethod
    def _normalise_domains(cls, value: list[str]) -> list[str]:
        return sorted({normalise_media_domain(v) for v in value})


class TransferSettings(SettingsGroup):
    """How embeddings reach prefill servers."""

    transfer_backend: TransferBackend = Field(
        TransferBackend.AUTO,
        json_schema_extra=names(
            flag="--encoder-transfer-backend", deprecated_env=("ENCODER_ENCODER_TRANSFER_BACKEND",), crd="transfer.backend"
        ),
    )
    """auto serves each request the way it asks (what SGLang's prefill servers expect: inline without a prefill_host, else its own backend); inline returns embeddings in the answer (a request naming a prefill target is 400); zmq_to_tokenizer and zmq_to_scheduler push them to the prefill server over ZMQ; mooncake lets it pull them (needs the mooncake extra)."""
    send_timeout: float = Field(180.0, gt=0, le=86_400, json_schema_extra=names(crd="transfer.sendTimeoutSeconds"))
    """Seconds a push to prefill may take before it fails (including the wait for its /scheduler_receive_url registration)."""
    wire_format: WireFormat = WireFormat.SGLANG
    """ZMQ frames: sglang (what SGLang's receiver reads) or encoderpool (msgpack header + raw tensor, for encoder_pod.receiver; docs/wire-format.md)."""
    sglang_version: Literal["auto", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23"] = "auto"
    """SGLang frames: auto (read by every supported release) or a release (byte for byte what its own encoder writes)."""
    mooncake_protocol: Literal["rdma", "tcp"] = "rdma"
    """mooncake transport (rdma falls back to TCP on a host without RDMA devices)."""
    mooncake_device: str = ""
    """mooncake RDMA device names (SGLang's --disaggregation-ib-device); empty = all."""
    mooncake_hostname: str = ""
    """Address mooncake names this pod by; empty = the HOST setting, or this host's IP when HOST is a wildcard."""
    transfer_max_sockets: int = Field(256, ge=1, le=65_536)
    """Most pooled PUSH sockets (one per prefill destination); the least recently used idle one closes beyond."""
    transfer_socket_idle_s: float = Field(300.0, gt=0, le=86_400)
    """Seconds an unused pooled PUSH socket stays open."""
    transfer_linger_s: float = Field(2.0, ge=0, le=600)
    """Seconds pushes being written may take to finish at shutdown (then they are cut off, never delivered)."""

    @model_validator(mode="before")
    @classmethod
    def _old_wire_value(cls, data: Any) -> Any:
        # "sglang=<release>" (the earlier form of this setting) = wire sglang + that release.
        if isinstance(data, dict) and isinstance(data.get("wire_format"), str) and "=" in data["wire_format"]:
            kind, _, release = data["wire_format"].partition("=")
            data = {**data, "wire_format": kind}
            data.setdefault("sglang_version", release)
        return data


class ParallelSettings(SettingsGroup):
    """Data-parallel workers and tensor-parallel groups."""

    dp_size: int = Field(1, ge=1, le=64, json_schema_extra=names(crd="parallelism.data"))
    """Data-parallel encoder replicas (worker processes) per pod, one per GPU."""
    tp_size: int = Field(1, ge=1, le=64, json_schema_extra=names(crd="parallelism.tensor"))
    """Tensor-parallel ranks per encoder replica."""
    dp_worker_max_inflight: int = Field(64, ge=1, le=100_000, json_schema_extra=names(crd="batching.dpWorkerMaxInflight"))
    """Most requests one data-parallel worker holds."""
    dp_restart_backoff: float = Field(1.0, gt=0, le=600)
    """Seconds before a dead data-parallel worker is restarted; doubles per quick death, capped at 30."""
    dp_max_failed_starts: int = Field(5, ge=1, le=1000)
    """Consecutive starts of a worker that never got ready before its rank is given up."""
    dp_heartbeat_timeout: float = Field(10.0, gt=0, le=3600)
    """Seconds a ready worker or tensor-parallel rank may stay silent before it is deemed hung, killed and its group restarted (a rank still loading gets 60 s at least; silent 2 s, it already gets no new traffic)."""
    tp_collective_timeout: float = Field(60.0, gt=0, le=3600)
    """Seconds any tensor-parallel collective may take; past it the group is taken down and restarted."""


class CacheSettings(SettingsGroup):
    """The embedding cache: repeated items served without decode, preprocess or forward."""

    cache_size_mb: int = Field(0, ge=0, le=1_048_576, json_schema_extra=names(env_aliases=("SGLANG_VLM_CACHE_SIZE_MB",)))
    """Byte budget of the embedding cache per model replica in MiB (0 = off); least recently used entries go first."""


class VllmSettings(SettingsGroup):
    """vLLM's EPD: this pod as the encoder instance of unmodified vLLM prefill instances (docs/vllm.md)."""

    vllm_storage_path: str | None = Field(None, json_schema_extra=names(
        derived_from="/vllm-ec when spec.vllmStorage is set (its claim, or an emptyDir per pod, mounted there)"))
    """Folder vLLM consumers' ECExampleConnector reads (its shared_storage_path); unset = POST /v1/chat/completions is off."""
    vllm_model_id: str = Field("", json_schema_extra=names(crd="vllm.modelID"))
    """The --model string the vLLM consumers were started with (their mm_hash's model id); empty = MODEL_PATH as given."""
    vllm_mm_hasher_algorithm: Literal["blake3", "sha256", "sha512"] = Field("blake3", json_schema_extra=names(crd="vllm.hasherAlgorithm"))
    """The consumers' --mm-hasher-algorithm (used for items that carry no uuid, or request-level kwargs)."""
    vllm_dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field("auto", json_schema_extra=names(crd="vllm.dtype"))
    """dtype of the stored embeddings, the consumers' --dtype; auto = the encoder's own dtype."""
    vllm_storage_max_mb: int = Field(10_240, ge=1, le=1 << 30, json_schema_extra=names(crd="vllm.storageMaxMB"))
    """Most MiB of stored embeddings; the oldest files are removed beyond (vLLM deletes none)."""
    vllm_storage_ttl: float = Field(3600.0, gt=0, le=30 * 86_400, json_schema_extra=names(crd="vllm.storageTTLSeconds"))
    """Seconds a stored embedding is kept (consumers read it within seconds of the answer)."""


class ObservabilitySettings(SettingsGroup):
    """Logging and the readiness probe."""

    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """Log level."""
    health_timeout: float = Field(20.0, gt=0, le=3600)
    """Seconds a probe encode may wait and run (including the one forward ahead of it) before /health says 503."""


class EncoderSettings(BaseModel):
    """Effective configuration of one encoder pod (every worker and rank gets the same JSON)."""

    model_config = ConfigDict(frozen=True, extra="forbid", protected_namespaces=())

    model: ModelSettings = ModelSettings()
    server: ServerSettings = ServerSettings()
    admission: AdmissionSettings = AdmissionSettings()
    batching: BatchingSettings = BatchingSettings()
    media: MediaSettings = MediaSettings()
    transfer: TransferSettings = TransferSettings()
    parallel: ParallelSettings = ParallelSettings()
    cache: CacheSettings = CacheSettings()
    vllm: VllmSettings = VllmSettings()
    observability: ObservabilitySettings = ObservabilitySettings()

    @model_validator(mode="after")
    def _check_relations(self) -> "EncoderSettings":
        values, settings = self.flat(), all_settings()
        for rule in RELATIONS:
            if values[rule.low] > values[rule.high]:
                low, high = settings[rule.low], settings[rule.high]
                raise ValueError(
                    f"{low.env} / {low.flag} ({values[rule.low]}) must not exceed {high.env} / {high.flag} "
                    f"({values[rule.high]}): {rule.why}"
                )
        return self

    def drain_timeout_s(self) -> float:
        """The effective ``DRAIN_TIMEOUT``: as set, else ``REQ_TIMEOUT`` + 5 s (a request admitted just
        before SIGTERM may take its whole timeout)."""
        if self.server.drain_timeout is not None:
            return self.server.drain_timeout
        return self.admission.req_timeout + 5.0

    def masked(self) -> dict[str, Any]:
        """The effective config by group, for the start-up log and /server_info (no secrets today)."""
        return self.model_dump(mode="json")

    def flat(self) -> dict[str, Any]:
        """Every value by its setting name (``max_batch_size``), as the env and flags name them."""
        return {name: value for group in setting_groups() for name, value in getattr(self, group)}


@dataclass(frozen=True)
class Setting:
    """One setting as the outside sees it: its group, env names and flag."""

    group: str
    name: str
    info: FieldInfo

    @property
    def env(self) -> str:
        """``ENCODER_<NAME>``."""
        return ENV_PREFIX + self.name.upper()

    @property
    def alias(self) -> str:
        """``SGLANG_ENCODER_<NAME>``."""
        return ALIAS_PREFIX + self.name.upper()

    @property
    def _extra(self) -> dict[str, Any]:
        extra = self.info.json_schema_extra
        return extra if isinstance(extra, dict) else {}

    @property
    def flag(self) -> str:
        """``--<name-with-dashes>``, or SGLang's own flag name where the setting declares one."""
        flag = self._extra.get("flag")
        return flag if isinstance(flag, str) else "--" + self.name.replace("_", "-")

    @property
    def env_aliases(self) -> list[str]:
        """Other current env names of this setting (SGLang's), read after ``SGLANG_ENCODER_<NAME>``."""
        aliases = self._extra.get("env_aliases")
        return [str(v) for v in aliases] if isinstance(aliases, list) else []

    @property
    def deprecated_env(self) -> list[str]:
        """Older env names still read (after the current ones), each logging a warning."""
        old = self._extra.get("deprecated_env")
        return [str(v) for v in old] if isinstance(old, list) else []

    @property
    def env_names(self) -> list[str]:
        """Every env name this setting is read under, in the order they are tried."""
        return [self.env, self.alias, *self.env_aliases, *self.deprecated_env]

    @property
    def crd(self) -> str | None:
        """``"object.field"``: the EncoderPool field ``spec.<object>.<field>`` that is this setting."""
        crd = self._extra.get("crd")
        return crd if isinstance(crd, str) else None

    @property
    def derived_from(self) -> str | None:
        """What in a pool's spec the operator computes this setting from (None: not rendered this way)."""
        derived = self._extra.get("derived_from")
        return derived if isinstance(derived, str) else None


def setting_groups() -> dict[str, type[SettingsGroup]]:
    """Each group's name (its field in :class:`EncoderSettings`) and class, in declaration order."""
    groups: dict[str, type[SettingsGroup]] = {}
    for group, group_field in EncoderSettings.model_fields.items():
        group_cls = group_field.annotation
        if not (isinstance(group_cls, type) and issubclass(group_cls, SettingsGroup)):
            raise TypeError(f"EncoderSettings.{group} is not a SettingsGroup")
        groups[group] = group_cls
    return groups


def all_settings() -> dict[str, Setting]:
    """Every setting by its (flat, unique) name, in declaration order."""
    found: dict[str, Setting] = {}
    for group, group_cls in setting_groups().items():
        for name, info in group_cls.model_fields.items():
            if name in found:
                raise RuntimeError(f"setting {name!r} is declared in groups {found[name].group!r} and {group!r}")
            found[name] = Setting(group, name, info)
    return found


def add_settings_arguments(parser: argparse.ArgumentParser) -> None:
    """One CLI flag per setting, with the same meaning as its env var, shown by group."""
    sections = {
        group: parser.add_argument_group(f"{group} settings", (cls.__doc__ or "").strip())
        for group, cls in setting_groups().items()
    }
    for setting in all_settings().values():
        section, info = sections[setting.group], setting.info
        help_text = f"{info.description} [env {setting.env}]"
        if info.annotation is bool:
            section.add_argument(
                setting.flag, dest=setting.name, default=None, action=argparse.BooleanOptionalAction, help=help_text
            )
        elif get_origin(info.annotation) is list:
            section.add_argument(setting.flag, dest=setting.name, default=None, nargs="+", help=help_text)
        elif get_origin(info.annotation) is Literal:
            section.add_argument(
                setting.flag, dest=setting.name, default=None, choices=get_args(info.annotation), help=help_text
            )
        else:
            section.add_argument(setting.flag, dest=setting.name, default=None, help=help_text)


def _describe_error(err: Mapping[str, Any], settings: dict[str, Setting]) -> str:
    loc = [str(part) for part in err.get("loc", ())]
    ctx = err.get("ctx") or {}
    bounds = ", ".join(f"{k} {v}" for k, v in ctx.items() if k in {"ge", "gt", "le", "lt", "expected"})
    allowed = f" (allowed: {bounds})" if bounds else ""
    setting = settings.get(loc[1]) if len(loc) > 1 else None
    message = str(err["msg"]).removeprefix("Value error, ")
    if setting is not None:
        return f"invalid setting {setting.env} / {setting.flag}: {message}{allowed}"
    where = f"{loc[0]} settings" if loc else "settings"
    return f"invalid {where}: {message}{allowed}"


def load_settings(cli: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None) -> EncoderSettings:
    """Parse env (``ENCODER_*`` over ``SGLANG_ENCODER_*``), then CLI values on top.

    ``cli`` maps setting names to values (``vars()`` of the parsed arguments; ``None`` = not
    given, other keys ignored). ``env`` defaults to the process environment. Raises
    :class:`SettingsError` naming every bad variable and its bound.
    """
    settings = all_settings()
    environ = os.environ if env is None else env
    given = {k: v for k, v in (cli or {}).items() if v is not None and k in settings}
    groups: dict[str, dict[str, Any]] = {group: {} for group in setting_groups()}
    for name, setting in settings.items():
        if name in given:
            groups[setting.group][name] = given[name]
            continue
        for var in setting.env_names:
            raw = environ.get(var)
            if raw not in (None, ""):
                groups[setting.group][name] = raw
                if var in setting.deprecated_env:
                    log.warning("%s is deprecated and will be removed; use %s (same meaning)", var, setting.env)
                break
    try:
        return EncoderSettings.model_validate(groups)
    except ValidationError as exc:
        raise SettingsError("\n".join(_describe_error(e, settings) for e in exc.errors())) from None


def model_dir(model: ModelSettings) -> Path:
    """The checkpoint directory, checked to hold a config.json (:class:`ModelPathError` if not)."""
    path = Path(model.model_path)
    if not model.model_path or not (path / "config.json").is_file():
        raise ModelPathError(f"invalid setting {ENV_PREFIX}MODEL_PATH / --model-path: no config.json in {str(path)!r}")
    return path
