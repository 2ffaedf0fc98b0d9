"""The day-two parts of the EncoderPool spec: rollout, drain, hub models, autoscaling, SGLang
registration and pod template overrides.

Pure pydantic models mirroring the CRD (a unit test keeps names and defaults equal).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from encoderpool_operator.specmodels import Quantity, SpecModel, parse_quantity

# hf://[org/]name[@revision]; a revision is a branch, tag or commit (refs/pr/1 has slashes).
HUB_PREFIX = "hf://"
HUB_MODEL = re.compile(r"^hf://(?P<repo>([A-Za-z0-9][-A-Za-z0-9._]*/)?[A-Za-z0-9][-A-Za-z0-9._]*)(@(?P<rev>[-A-Za-z0-9._/]+))?$")
MAX_UNAVAILABLE = re.compile(r"^([1-9][0-9]?%|100%)$")
URL = re.compile(r"^https?://[^\s/]+(/\S*)?$")
METRICS = {"queueDepth": "encoder_queue_depth", "inflightRequests": "encoder_inflight_requests"}
DRAIN_MARGIN_SECONDS = 10  # grace beyond preStop + drain: the process exits and the kubelet reports it


@dataclass(frozen=True)
class HubModel:
    """A model on the Hugging Face hub: ``hf://org/name@revision``."""

    repo: str
    revision: str | None

    @property
    def url(self) -> str:
        """The hf:// form, what ``encoder-pod fetch-model`` is given."""
        return f"{HUB_PREFIX}{self.model_id}"

    @property
    def model_id(self) -> str:
        """``org/name[@revision]``: what ``encoder-pod serve --model-path`` resolves from the HF cache."""
        return self.repo + (f"@{self.revision}" if self.revision else "")


def parse_hub_model(model: str) -> HubModel | None:
    """The hub model named by ``spec.model``, or None when it is a path; ValueError if malformed."""
    if not model.startswith(HUB_PREFIX):
        return None
    match = HUB_MODEL.match(model)
    if match is None:
        raise ValueError(f"spec.model {model!r}: a hub model is hf://[org/]name[@revision]")
    return HubModel(match.group("repo"), match.group("rev"))


class Rollout(SpecModel):
    """How a spec change replaces pods (the StatefulSet's rolling update, plus a deadline)."""

    max_unavailable: int | str = Field(1, union_mode="left_to_right")
    partition: int = Field(0, ge=0, le=1000)
    progress_deadline_seconds: int | None = Field(None, ge=30, le=86_400)

    @field_validator("max_unavailable")
    @classmethod
    def _max_unavailable(cls, value: int | str) -> int | str:
        if isinstance(value, int):
            if not 1 <= value <= 1000:
                raise ValueError("spec.rollout.maxUnavailable must be 1-1000 pods or a percentage 1%-100%")
        elif not MAX_UNAVAILABLE.match(value):
            raise ValueError("spec.rollout.maxUnavailable must be 1-1000 pods or a percentage 1%-100%")
        return value


class Drain(SpecModel):
    """What a stopping pod gets: a preStop wait for endpoint propagation, then its drain budget."""

    pre_stop_seconds: int = Field(5, ge=0, le=300)
    timeout_seconds: int | None = Field(None, ge=1, le=86_400)


class SecretKeyRef(SpecModel):
    """A key of a Secret in the pool's namespace."""

    name: str = Field(min_length=1, max_length=253)
    key: str = Field("token", min_length=1, max_length=253)


class PvcRef(SpecModel):
    """A PersistentVolumeClaim by name."""

    claim_name: str = Field(min_length=1, max_length=253)


class ModelCache(SpecModel):
    """The volume the hub model and the compile caches live on."""

    persistent_volume_claim: PvcRef | None = None
    size_limit: Quantity | None = None

    @model_validator(mode="after")
    def _size(self) -> "ModelCache":
        if self.size_limit is not None:
            parse_quantity(self.size_limit)
        return self


class ModelSource(SpecModel):
    """How a hub model (spec.model hf://...) is fetched: credentials and the cache volume."""

    token_secret_ref: SecretKeyRef | None = None
    cache: ModelCache = Field(default_factory=ModelCache)


class Autoscaling(SpecModel):
    """An autoscaling/v2 HorizontalPodAutoscaler on the pool's scale subresource."""

    min_replicas: int = Field(1, ge=1, le=1000)
    max_replicas: int = Field(ge=1, le=1000)
    metric: Literal["queueDepth", "inflightRequests"] = "queueDepth"
    target_average_value: Quantity = "4"
    behavior: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _bounds(self) -> "Autoscaling":
        if self.min_replicas > self.max_replicas:
            raise ValueError("spec.autoscaling.minReplicas must not exceed spec.autoscaling.maxReplicas")
        if parse_quantity(self.target_average_value) <= 0:
            raise ValueError("spec.autoscaling.targetAverageValue must be above 0")
        return self

    @property
    def metric_name(self) -> str:
        """The per-pod metric the HPA reads through the custom metrics API."""
        return METRICS[self.metric]


class SGLang(SpecModel):
    """Registration with SGLang prefill servers (their EncoderBootstrapServers)."""

    register_urls: list[str] = Field(default_factory=list, alias="registerURLs", max_length=64)

    @field_validator("register_urls")
    @classmethod
    def _urls(cls, urls: list[str]) -> list[str]:
        bad = [u for u in urls if not URL.match(u) or "," in u]
        if bad:
            raise ValueError(f"spec.sglang.registerURLs must be http(s) base URLs without commas: {bad}")
        return urls


class VllmStorage(SpecModel):
    """Where the pods store embeddings for vLLM consumers; set, the pods serve vLLM's EPD face (docs/vllm.md)."""

    claim_name: str | None = Field(None, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


class Grpc(SpecModel):
    """SGLang's gRPC encoder face of the pods (sglang.grpc.encoder.SglangEncoder, grpc.health.v1)."""

    port: int | None = Field(None, ge=1024, le=65535)
    probes: bool = False

    @model_validator(mode="after")
    def _probes_need_a_port(self) -> "Grpc":
        if self.probes and self.port is None:
            raise ValueError("spec.grpc.probes needs spec.grpc.port: the probes ask grpc.health.v1 on it")
        return self


class TemplateMetadata(SpecModel):
    """Labels and annotations added to the pods."""

    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class PodTemplateOverride(SpecModel):
    """A partial core/v1 PodTemplateSpec, merged onto the generated one (strategic merge)."""

    metadata: TemplateMetadata = Field(default_factory=TemplateMetadata)
    spec: dict[str, Any] = Field(default_factory=dict)
