"""The encoder pod's settings: one pydantic-settings class, parsed once at start.

Every field is an env var ``ENCODER_<NAME>`` and a CLI flag ``--<name-with-dashes>``. For drop-in
use where SGLang's names are already deployed, ``SGLANG_ENCODER_<NAME>`` is accepted as an alias;
the ``ENCODER_`` name wins when both are set.
"""

from __future__ import annotations

import argparse
import os
from enum import Enum
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from pydantic import AliasChoices, Field, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, SettingsConfigDict

ENV_PREFIX = "ENCODER_"
ALIAS_PREFIX = "SGLANG_ENCODER_"


class TransferBackend(str, Enum):
    """Where an embedding goes once encoded."""

    INLINE = "inline"
    ZMQ_TO_TOKENIZER = "zmq_to_tokenizer"
    ZMQ_TO_SCHEDULER = "zmq_to_scheduler"


def _env(name: str, default: Any, description: str, **bounds: Any) -> Any:
    """A settings field read from ENCODER_<NAME>, then SGLANG_ENCODER_<NAME>."""
    return Field(
        default,
        description=description,
        validation_alias=AliasChoices(name, ENV_PREFIX + name.upper(), ALIAS_PREFIX + name.upper()),
        **bounds,
    )


class EncoderSettings(BaseSettings):
    """Effective configuration of one encoder pod (all workers share it)."""

    model_config = SettingsConfigDict(
        case_sensitive=False, extra="ignore", populate_by_name=True, env_ignore_empty=True
    )

    # --- model and placement ---
    model_path: str = _env("model_path", "", "Local checkpoint directory (config.json inside).")
    host: str = _env("host", "127.0.0.1", "Address the HTTP server binds.")
    port: int = _env("port", 30000, "HTTP port.", ge=1, le=65535)
    device: Literal["auto", "cpu", "cuda"] = _env(
        "device", "auto", "Where the encoder runs; auto picks cuda when available."
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = _env(
        "dtype", "auto", "Weights and activations dtype; auto is bf16 on GPU, fp32 on CPU."
    )
    dp_size: int = _env("dp_size", 1, "Data-parallel worker processes (one per GPU).", ge=1, le=64)
    tp_size: int = _env("tp_size", 1, "Tensor-parallel ranks per encoder replica.", ge=1, le=64)
    num_threads: int = _env(
        "num_threads", 0, "torch intra-op threads per worker on CPU (0 = torch default).", ge=0, le=1024
    )

    # --- batching and admission ---
    max_batch_size: int = _env("max_batch_size", 8, "Most requests in one batch.", ge=1, le=4096)
    max_wait_ms: float = _env(
        "max_wait_ms", 0.0, "How long a batch waits for more requests (0 = no wait).", ge=0, le=10_000
    )
    max_batch_tokens: int = _env(
        "max_batch_tokens",
        16384,
        "Budget of encoder output tokens per batch; a larger request runs alone.",
        ge=1,
        le=10_000_000,
    )
    req_timeout: float = _env(
        "req_timeout", 180.0, "Seconds a request may take in total before 504.", gt=0, le=86_400
    )
    max_queue: int = _env("max_queue", 1024, "Most requests waiting; 429 beyond.", ge=1, le=1_000_000)
    mm_load_workers: int = _env(
        "mm_load_workers", 4, "Threads that decode media items.", ge=1, le=256
    )
    image_processor_use_gpu: bool = _env(
        "image_processor_use_gpu", False, "Run the image processor on the GPU (fast processors only)."
    )
    dp_worker_max_inflight: int = _env(
        "dp_worker_max_inflight", 64, "Most requests one data-parallel worker holds.", ge=1, le=100_000
    )
    dp_restart_backoff: float = _env(
        "dp_restart_backoff",
        1.0,
        "Seconds before a dead data-parallel worker is restarted; doubles per quick death, capped at 30.",
        gt=0,
        le=600,
    )
    dp_max_failed_starts: int = _env(
        "dp_max_failed_starts",
        5,
        "Consecutive starts of a worker that never got ready before its rank is given up.",
        ge=1,
        le=1000,
    )
    dp_heartbeat_timeout: float = _env(
        "dp_heartbeat_timeout",
        30.0,
        "Seconds a data-parallel worker may stay silent before it is deemed hung, killed and restarted.",
        gt=0,
        le=3600,
    )
    tp_collective_timeout: float = _env(
        "tp_collective_timeout",
        60.0,
        "Seconds any tensor-parallel collective may take; past it the group is taken down and restarted.",
        gt=0,
        le=3600,
    )
    max_request_bytes: int = _env(
        "max_request_bytes", 64 * 1024 * 1024, "Largest /encode body in bytes; 413 beyond.", ge=1024
    )
    max_image_pixels: int = _env(
        "max_image_pixels", 40_000_000, "Largest decoded image (width x height); 400 beyond.", ge=1
    )
    max_audio_seconds: float = _env(
        "max_audio_seconds", 600.0, "Longest audio item in seconds; 400 beyond.", gt=0
    )
    health_timeout: float = _env(
        "health_timeout", 20.0, "Seconds the health encode may take before 503.", gt=0, le=3600
    )

    # --- media sources ---
    allow_url_fetch: bool = _env("allow_url_fetch", False, "Allow http(s) item URLs.")
    allowed_url_hosts: list[str] = _env(
        "allowed_url_hosts", [], "Hosts http(s) items may come from (comma separated)."
    )
    url_fetch_timeout: float = _env(
        "url_fetch_timeout", 10.0, "Connect/read timeout for item URLs in seconds.", gt=0, le=600
    )
    allowed_local_media_path: str | None = _env(
        "allowed_local_media_path", None, "Directory file-path items may come from (unset = refused)."
    )

    # --- transfer ---
    encoder_transfer_backend: TransferBackend = _env(
        "encoder_transfer_backend", TransferBackend.INLINE, "inline, zmq_to_tokenizer or zmq_to_scheduler."
    )
    send_timeout: float = _env(
        "send_timeout", 180.0, "Seconds a push to prefill may take before it fails.", gt=0, le=86_400
    )
    wire_format: Literal["encoderpool", "sglang=0.5.23"] = _env(
        "wire_format",
        "encoderpool",
        "Frames pushed to prefill: encoderpool (msgpack header, no pickle) or sglang=<release> (opt-in pickle).",
    )
    transfer_max_sockets: int = _env(
        "transfer_max_sockets",
        256,
        "Most pooled PUSH sockets (one per prefill destination); the least recently used idle one closes beyond.",
        ge=1,
        le=65_536,
    )
    transfer_socket_idle_s: float = _env(
        "transfer_socket_idle_s", 300.0, "Seconds an unused pooled PUSH socket stays open.", gt=0, le=86_400
    )
    transfer_linger_s: float = _env(
        "transfer_linger_s", 2.0, "Seconds a closing PUSH socket may keep flushing queued frames.", ge=0, le=600
    )

    # --- video ---
    video_fps: float = _env("video_fps", 2.0, "Frames per second sampled from a video.", gt=0, le=120)
    video_min_frames: int = _env("video_min_frames", 2, "Fewest frames sampled from a video.", ge=1)
    video_max_frames: int = _env("video_max_frames", 64, "Most frames sampled from a video.", ge=1)

    log_level: Literal["debug", "info", "warning", "error"] = _env("log_level", "info", "Log level.")

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings):  # type: ignore[no-untyped-def]
        """Only explicit values: :func:`load_settings` reads the environment itself, so that the
        ``ENCODER_`` name beats the ``SGLANG_ENCODER_`` alias and errors name the variable."""
        return (init_settings,)

    @field_validator("allowed_url_hosts", mode="before")
    @classmethod
    def _split_hosts(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [h.strip().lower() for h in value.split(",") if h.strip()]
        return value

    @model_validator(mode="after")
    def _check_relations(self) -> "EncoderSettings":
        if self.video_min_frames > self.video_max_frames:
            raise ValueError("video_min_frames must not exceed video_max_frames")
        return self

    def masked(self) -> dict[str, Any]:
        """The effective config for the start-up log (no secrets today; the hook stays)."""
        return self.model_dump(mode="json")


class SettingsError(SystemExit):
    """A bad setting: stops the process with a message naming the variable and the bound."""


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _cli_type(info: FieldInfo) -> Any:
    ann = info.annotation
    if ann is bool:
        return None
    if get_origin(ann) is Literal:
        return None
    return str


def add_settings_arguments(parser: argparse.ArgumentParser) -> None:
    """One CLI flag per settings field, with the same meaning as its env var."""
    for name, info in EncoderSettings.model_fields.items():
        env = ENV_PREFIX + name.upper()
        help_text = f"{info.description} [env {env}]"
        if info.annotation is bool:
            parser.add_argument(
                _flag(name), dest=name, default=None, action=argparse.BooleanOptionalAction, help=help_text
            )
        elif get_origin(info.annotation) is Literal:
            parser.add_argument(_flag(name), dest=name, default=None, choices=get_args(info.annotation), help=help_text)
        else:
            parser.add_argument(_flag(name), dest=name, default=None, help=help_text)


def _describe_error(err: dict[str, Any]) -> str:
    name = str(err["loc"][0]) if err.get("loc") else "settings"
    field = EncoderSettings.model_fields.get(name)
    env = ENV_PREFIX + name.upper() if field else name
    ctx = err.get("ctx") or {}
    bounds = ", ".join(f"{k} {v}" for k, v in ctx.items() if k in {"ge", "gt", "le", "lt", "expected"})
    where = f"{env} / {_flag(name)}" if field else name
    return f"invalid setting {where}: {err['msg']}" + (f" (allowed: {bounds})" if bounds else "")


def load_settings(cli: dict[str, Any] | None = None, env: dict[str, str] | None = None) -> EncoderSettings:
    """Parse env (ENCODER_* over SGLANG_ENCODER_*) then CLI values on top; exit on a bad value."""
    cli_values = {k: v for k, v in (cli or {}).items() if v is not None and k in EncoderSettings.model_fields}
    environ = os.environ if env is None else env
    env_values: dict[str, Any] = {}
    for name in EncoderSettings.model_fields:
        for prefix in (ENV_PREFIX, ALIAS_PREFIX):
            raw = environ.get(prefix + name.upper())
            if raw not in (None, ""):
                env_values[name] = raw
                break
    try:
        # Values are passed explicitly so the result does not depend on the process env twice.
        return EncoderSettings.model_validate({**env_values, **cli_values})
    except ValidationError as exc:
        raise SettingsError("\n".join(_describe_error(e) for e in exc.errors())) from None


def model_dir(settings: EncoderSettings) -> Path:
    """The checkpoint directory, checked to exist."""
    path = Path(settings.model_path)
    if not settings.model_path or not (path / "config.json").is_file():
        raise SettingsError(
            f"invalid setting {ENV_PREFIX}MODEL_PATH / --model-path: no config.json in {str(path)!r}"
        )
    return path
