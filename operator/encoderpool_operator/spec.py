"""The typed EncoderPool spec: the CRD's openAPIV3Schema as pydantic models.

The objects that are pod settings (spec.parallelism, spec.batching, spec.transfer) are
generated from the pod's settings declaration into ``podsettings.py``; the rest is written here.
The API server has already applied the CRD's defaults, bounds and CEL rules before the operator
sees a pool; the same rules are checked again here because a pool can reach the operator without
them (a CRD installed from an older chart, a server with validation rules disabled), and an
invalid pool must become a clear ``InvalidSpec`` status rather than a half-applied StatefulSet.
Field names and defaults are kept equal to the CRD by a unit test.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from encoderpool_operator import names
from encoderpool_operator.errors import InvalidSpecError
from encoderpool_operator.podsettings import RESERVED_ENV, PodSettingsSpec
from encoderpool_operator.specmodels import (
    DNS1035,
    QUANTITY_PATTERN,
    EnvVar,
    LocalObjectReference,
    ModelVolume,
    Quantity,
    Resources,
    Toleration,
    parse_quantity,
)
from encoderpool_operator.specops import (
    DRAIN_MARGIN_SECONDS,
    Autoscaling,
    Drain,
    Grpc,
    HubModel,
    ModelSource,
    PodTemplateOverride,
    Rollout,
    SGLang,
    VllmStorage,
    parse_hub_model,
)

__all__ = ("QUANTITY_PATTERN", "Pool", "PoolSpec", "parse_pool", "parse_quantity", "parse_spec")


class PoolSpec(PodSettingsSpec):
    """``spec`` of an EncoderPool (its pod-settings objects come from :class:`PodSettingsSpec`)."""

    model: str = Field(min_length=1, max_length=1024)
    model_volume: ModelVolume | None = None
    replicas: int = Field(1, ge=0, le=1000)
    device: Literal["cuda", "cpu"] = "cuda"
    max_gpus_per_pod: int = Field(8, ge=1, le=64, alias="maxGPUsPerPod")
    gpu_resource_name: str = Field(
        "nvidia.com/gpu",
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
    )
    image: str | None = Field(None, min_length=1)
    image_pull_policy: Literal["Always", "Never", "IfNotPresent"] = "IfNotPresent"
    image_pull_secrets: list[LocalObjectReference] = Field(default_factory=list)
    resources: Resources = Field(default_factory=Resources)
    port: int = Field(30000, ge=1024, le=65535)
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    affinity: dict[str, Any] | None = None
    priority_class_name: str | None = Field(None, max_length=253)
    service_account_name: str | None = Field(None, max_length=253)
    runtime_class_name: str | None = Field(None, max_length=253)
    env: list[EnvVar] = Field(default_factory=list)
    pod_annotations: dict[str, str] = Field(default_factory=dict)
    pod_labels: dict[str, str] = Field(default_factory=dict)
    startup_timeout_seconds: int = Field(1800, ge=30, le=86_400)
    termination_grace_period_seconds: int | None = Field(None, ge=0, le=86_400)
    shm_size: Quantity = "1Gi"
    drain: Drain = Field(default_factory=Drain)
    rollout: Rollout = Field(default_factory=Rollout)
    model_source: ModelSource | None = None
    autoscaling: Autoscaling | None = None
    sglang: SGLang = Field(default_factory=SGLang)
    vllm_storage: VllmStorage | None = None
    grpc: Grpc = Field(default_factory=Grpc)
    pod_template: PodTemplateOverride | None = None
    follow_default_image: bool = False

    @model_validator(mode="after")
    def _shm_quantity(self) -> "PoolSpec":
        parse_quantity(self.shm_size)
        return self

    @model_validator(mode="after")
    def _check_relations(self) -> "PoolSpec":
        gpus = self.parallelism.tensor * self.parallelism.data
        if self.device == "cuda" and gpus > self.max_gpus_per_pod:
            raise ValueError(
                f"GPUs per pod = spec.parallelism.tensor x spec.parallelism.data = {gpus} "
                f"must not exceed spec.maxGPUsPerPod = {self.max_gpus_per_pod}"
            )
        clash = sorted({e.name for e in self.env} & set(RESERVED_ENV))
        if clash:
            raise ValueError(
                "spec.env must not set an ENCODER_* variable the operator renders from the spec (or another "
                f"name the pod reads it under: {', '.join(clash)}): set the spec field instead"
            )
        if self.grpc.port is not None and self.grpc.port == self.port:
            raise ValueError(f"spec.grpc.port must differ from spec.port ({self.port}): each face has a port of its own")
        if len({e.name for e in self.env}) != len(self.env):
            raise ValueError("spec.env has a variable twice")
        reserved = sorted(set(self.pod_labels) & set(names.RESERVED_LABELS))
        if reserved:
            raise ValueError(f"spec.podLabels must not set {', '.join(reserved)}: the operator owns them")
        return self

    @model_validator(mode="after")
    def _check_model_source(self) -> "PoolSpec":
        hub = parse_hub_model(self.model)
        if hub is not None and self.model_volume is not None:
            raise ValueError("spec.modelVolume cannot be combined with a hub model (spec.model hf://...): "
                             "the model is fetched into spec.modelSource.cache")
        if hub is None and self.model_source is not None:
            raise ValueError("spec.modelSource needs a hub model: spec.model hf://org/name[@revision]")
        return self

    @property
    def gpus_per_pod(self) -> int:
        """GPUs each pod requests: tensor x data on GPU pools, 0 on CPU pools."""
        return self.parallelism.tensor * self.parallelism.data if self.device == "cuda" else 0

    @property
    def hub_model(self) -> HubModel | None:
        """The hub model spec.model names (hf://...), or None for a path."""
        return parse_hub_model(self.model)

    @property
    def model_path(self) -> str:
        """What the pod is told to load: a hub model id (resolved from the HF cache), or a path,
        inside the model volume when one is set."""
        hub = self.hub_model
        if hub is not None:
            return hub.model_id
        if self.model_volume is None or self.model.startswith("/"):
            return self.model
        return f"{self.model_volume.mount_path.rstrip('/')}/{self.model}"

    @property
    def drain_timeout_seconds(self) -> float:
        """ENCODER_DRAIN_TIMEOUT: spec.drain.timeoutSeconds, else the request timeout + 5 s (the pod's own default)."""
        if self.drain.timeout_seconds is not None:
            return float(self.drain.timeout_seconds)
        return self.batching.request_timeout_seconds + 5

    @property
    def grace_period_seconds(self) -> int:
        """terminationGracePeriodSeconds: as set, else room for the preStop wait, the drain and a margin."""
        if self.termination_grace_period_seconds is not None:
            return self.termination_grace_period_seconds
        return self.drain.pre_stop_seconds + math.ceil(self.drain_timeout_seconds) + DRAIN_MARGIN_SECONDS

    def wire(self) -> dict[str, Any]:
        """The spec as the API server holds it (camelCase, defaults filled, unset fields left out)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


@dataclass(frozen=True)
class Pool:
    """An EncoderPool as the operator sees it: identity, typed spec and the last written status."""

    name: str
    namespace: str
    uid: str
    generation: int
    spec: PoolSpec
    status: dict[str, Any] = field(default_factory=dict)


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err.get("loc", ()))
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        # Relation checks already name their fields; plain field errors get the path in front.
        parts.append(msg if msg.startswith(("spec.", "GPUs")) or not where else f"spec.{where}: {msg}")
    return "; ".join(parts)


def check_name(name: str) -> None:
    """The pool name must fit the children's names and labels (mirrors the CRD's root CEL rules)."""
    if not DNS1035.match(name):
        raise InvalidSpecError(
            f"metadata.name {name!r} must be a DNS-1035 label (lowercase letters, digits and '-', "
            "starting with a letter): it names the pool's headless Service"
        )
    if len(name) > names.MAX_POOL_NAME:
        raise InvalidSpecError(
            f"metadata.name must be at most {names.MAX_POOL_NAME} characters: the StatefulSet "
            "labels each pod '<name>-<10-char revision>', and a label value holds 63"
        )


def parse_spec(raw: Any) -> PoolSpec:
    """Validate a pool's ``spec``; an invalid one raises :class:`InvalidSpecError` with every problem."""
    if not isinstance(raw, dict):
        raise InvalidSpecError("spec is missing or not an object")
    try:
        return PoolSpec.model_validate(raw)
    except ValidationError as exc:
        raise InvalidSpecError(_describe(exc)) from None


def identity(body: dict[str, Any]) -> tuple[str, str, str, int]:
    """name, namespace, uid and generation of an object body."""
    meta = body.get("metadata") or {}
    return (
        str(meta.get("name", "")),
        str(meta.get("namespace", "")),
        str(meta.get("uid", "")),
        int(meta.get("generation") or 0),
    )


def parse_pool(body: dict[str, Any]) -> Pool:
    """A pool body from the API server -> :class:`Pool`, or :class:`InvalidSpecError`."""
    name, namespace, uid, generation = identity(body)
    check_name(name)
    spec = parse_spec(body.get("spec"))
    return Pool(name, namespace, uid, generation, spec, dict(body.get("status") or {}))
