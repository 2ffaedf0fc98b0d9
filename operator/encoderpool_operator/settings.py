"""The operator's settings: one pydantic model, parsed once at start.

Every field is an env var ``ENCODERPOOL_OPERATOR_<NAME>`` and a CLI flag ``--<name-with-dashes>``
of ``encoderpool-operator``; the flag wins. :func:`load_settings` reads the environment it is
given (the process environment by default) once, and validates exactly those values: the model
is a plain ``BaseModel``, not pydantic-settings' ``BaseSettings``, whose validation reads the
process environment again behind the caller's back (so ``load_settings(env={})`` and
``OperatorSettings.model_validate({})`` would not have been the defaults).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

ENV_PREFIX = "ENCODERPOOL_OPERATOR_"


class OperatorSettings(BaseModel):
    """Effective configuration of the operator process."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    namespaces: list[str] = Field(
        default_factory=list,
        description="Namespaces to watch, comma separated; empty = all namespaces (cluster-wide).",
    )
    resync_seconds: float = Field(
        60.0,
        ge=5,
        le=3600,
        description="Every pool is reconciled at least this often, so status converges after a lost watch event.",
    )
    default_image: str = Field(
        "encoderpool/encoder-pod:0.1.0-cuda",
        min_length=1,
        description="Encoder image for GPU pools without spec.image (the CUDA build).",
    )
    default_cpu_image: str = Field(
        "encoderpool/encoder-pod:0.1.0-cpu",
        min_length=1,
        description="Encoder image for CPU pools (spec.device=cpu) without spec.image.",
    )
    field_manager: str = Field(
        "encoderpool-operator",
        min_length=1,
        max_length=128,
        description="Server-side apply field manager that owns every field the operator writes.",
    )
    liveness_port: int = Field(8080, ge=0, le=65535,
                               description="Port of GET /healthz, /readyz and /metrics (0 = off).")
    probe_failing_after_seconds: float = Field(
        120.0,
        ge=0,
        le=86_400,
        description="A started pod not ready this long is reported as ProbeFailing.",
    )
    wait_seconds: float = Field(
        5.0,
        gt=0,
        le=600,
        description="Retry delay after a temporary error (a conflict, an API server that did not answer).",
    )
    request_timeout_seconds: float = Field(
        30.0, gt=0, le=600, description="Timeout of each request to the API server."
    )
    coalesce_seconds: float = Field(
        0.2, ge=0, le=10, description="A watch event waits this long, so the rest of a burst joins its reconcile."
    )
    leader_election: bool = Field(
        True, description="Run only while holding the leader Lease, so several replicas can stand by."
    )
    lease_name: str = Field("encoderpool-operator", min_length=1, max_length=253,
                            description="Name of the coordination.k8s.io Lease the replicas compete for.")
    lease_namespace: str = Field("", max_length=63,
                                 description="Namespace of the Lease; empty = the pod's own (POD_NAMESPACE).")
    lease_duration_seconds: float = Field(
        15.0, ge=2, le=300, description="A leader that stops renewing is replaced after this long."
    )
    renew_deadline_seconds: float = Field(
        10.0, ge=1, le=300, description="A leader that cannot renew for this long stops and exits."
    )
    retry_period_seconds: float = Field(
        2.0, gt=0, le=60, description="How often the leader renews and a standby tries to take over."
    )
    identity: str = Field("", max_length=253, description="This replica's name in the Lease; empty = HOSTNAME plus a random suffix.")
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="Log level.")

    @field_validator("namespaces", mode="before")
    @classmethod
    def _split_namespaces(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [ns.strip() for ns in value.split(",") if ns.strip()]
        return value

    @model_validator(mode="after")
    def _lease_timing(self) -> "OperatorSettings":
        if not self.retry_period_seconds < self.renew_deadline_seconds < self.lease_duration_seconds:
            raise ValueError("leader election needs retry_period_seconds < renew_deadline_seconds < "
                             "lease_duration_seconds (a leader must stop before a standby may take over)")
        return self

    @property
    def clusterwide(self) -> bool:
        """Whether the operator watches every namespace."""
        return not self.namespaces


class SettingsError(SystemExit):
    """A bad setting: stops the process with a message naming the variable and the bound."""


def _describe(err: Mapping[str, Any]) -> str:
    if not err.get("loc"):  # a relation between settings: the message names them
        return f"invalid settings: {str(err['msg']).removeprefix('Value error, ')}"
    name = str(err["loc"][0])
    ctx = err.get("ctx") or {}
    bounds = ", ".join(f"{k} {v}" for k, v in ctx.items() if k in {"ge", "gt", "le", "lt", "expected"})
    flag = "--" + name.replace("_", "-")
    return f"invalid setting {ENV_PREFIX}{name.upper()} / {flag}: {err['msg']}" + (
        f" (allowed: {bounds})" if bounds else ""
    )


def load_settings(
    cli: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None
) -> OperatorSettings:
    """Parse ``ENCODERPOOL_OPERATOR_*`` env then CLI values on top; exit on a bad value."""
    environ = os.environ if env is None else env
    values: dict[str, Any] = {}
    for name in OperatorSettings.model_fields:
        raw = environ.get(ENV_PREFIX + name.upper())
        if raw not in (None, ""):
            values[name] = raw
    values.update({k: v for k, v in (cli or {}).items() if v is not None and k in OperatorSettings.model_fields})
    try:
        return OperatorSettings.model_validate(values)  # these values only: a plain model reads no environment
    except ValidationError as exc:
        raise SettingsError("\n".join(_describe(e) for e in exc.errors())) from None
