"""The typed EncoderPool spec: the CRD's openAPIV3Schema as pydantic models.

The API server has already applied the CRD's defaults, bounds and CEL rules before the operator
sees a pool; the same rules are checked again here because a pool can reach the operator without
them (a CRD installed from an older chart, a server with validation rules disabled), and an
invalid pool must become a clear ``InvalidSpec`` status rather than a half-applied StatefulSet.
Field names and defaults are kept equal to the CRD by a unit test.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from encoderpool_operator import names
from encoderpool_operator.errors import InvalidSpecError

# A Kubernetes resource quantity (k8s.io/apimachinery resource.Quantity), as the CRD pattern.
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
Quantity = Annotated[int | str, Field(union_mode="left_to_right")]
_SUFFIX = {
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
    "n": 1e-9, "u": 1e-6, "m": 1e-3, "": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
}


def parse_quantity(value: Quantity) -> float:
    """A Kubernetes quantity ("16Gi", "500m", 4, "1e3") as a number, for comparisons."""
    text = str(value).strip()
    if not re.match(QUANTITY_PATTERN, text):
        raise ValueError(f"{value!r} is not a Kubernetes quantity")
    match = re.match(r"^([+-]?[0-9.]+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?$", text)
    if match is None:  # the decimal-exponent form, 1e3
        return float(text)
    return float(match.group(1)) * _SUFFIX[match.group(2) or ""]


class _Model(BaseModel):
    """camelCase on the wire, snake_case in Python, unknown fields refused."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class PvcSource(_Model):
    """A PersistentVolumeClaim holding the checkpoint."""

    claim_name: str = Field(min_length=1, max_length=253)


class HostPathSource(_Model):
    """A directory on the node holding the checkpoint (not allowed by the restricted policy)."""

    path: str = Field(pattern=r"^/")


class ImageSource(_Model):
    """An OCI image mounted as a volume (Kubernetes image volumes)."""

    reference: str = Field(min_length=1)
    pull_policy: Literal["Always", "Never", "IfNotPresent"] = "IfNotPresent"


class ModelVolume(_Model):
    """Where the checkpoint comes from; mounted read-only at ``mount_path``."""

    mount_path: str = Field("/models", pattern=r"^/")
    persistent_volume_claim: PvcSource | None = None
    host_path: HostPathSource | None = None
    image: ImageSource | None = None

    @model_validator(mode="after")
    def _one_source(self) -> "ModelVolume":
        sources = [self.persistent_volume_claim, self.host_path, self.image]
        if sum(s is not None for s in sources) != 1:
            raise ValueError("spec.modelVolume needs exactly one of persistentVolumeClaim, hostPath or image")
        if self.mount_path.rstrip("/") in {"", "/tmp", "/cache", "/dev/shm"}:
            raise ValueError("spec.modelVolume.mountPath must not be /, /tmp, /cache or /dev/shm")
        return self


class Parallelism(_Model):
    """Tensor-parallel ranks per replica and data-parallel replicas per pod."""

    tensor: int = Field(1, ge=1, le=64)
    data: int = Field(1, ge=1, le=64)


class Batching(_Model):
    """The encoder's batching and admission settings (ENCODER_* env of each pod)."""

    max_batch_size: int = Field(8, ge=1, le=4096)
    max_wait_ms: float = Field(0, ge=0, le=10_000)
    max_batch_tokens: int = Field(16384, ge=1, le=10_000_000)
    request_timeout_seconds: float = Field(180, gt=0, le=86_400)
    max_queue: int = Field(1024, ge=1, le=1_000_000)
    dp_worker_max_inflight: int = Field(64, ge=1, le=100_000)
    mm_load_workers: int = Field(4, ge=1, le=256)
    image_processor_use_gpu: bool = Field(False, alias="imageProcessorUseGPU")

    @model_validator(mode="after")
    def _batch_fits_queue(self) -> "Batching":
        if self.max_batch_size > self.max_queue:
            raise ValueError(
                "spec.batching.maxBatchSize must not exceed spec.batching.maxQueue: a batch is drawn from the queue"
            )
        return self


class Transfer(_Model):
    """Where embeddings go once encoded."""

    backend: Literal["inline", "zmq_to_tokenizer", "zmq_to_scheduler"] = "inline"
    send_timeout_seconds: float = Field(180, gt=0, le=86_400)


class ResourceList(_Model):
    """CPU, memory and ephemeral storage; GPUs are derived from spec.parallelism."""

    cpu: Quantity | None = None
    memory: Quantity | None = None
    ephemeral_storage: Quantity | None = Field(None, alias="ephemeral-storage")

    @model_validator(mode="after")
    def _quantities(self) -> "ResourceList":
        for value in (self.cpu, self.memory, self.ephemeral_storage):
            if value is not None:
                parse_quantity(value)
        return self


class ResourceRequests(ResourceList):
    """Requests, with the CRD's per-field defaults."""

    cpu: Quantity | None = "1"
    memory: Quantity | None = "4Gi"


class Resources(_Model):
    """Container requests and limits (GPUs are added by the operator)."""

    requests: ResourceRequests = Field(default_factory=ResourceRequests)
    limits: ResourceList | None = None

    @model_validator(mode="after")
    def _limit_covers_request(self) -> "Resources":
        limit = self.limits.memory if self.limits else None
        request = self.requests.memory
        if limit is not None and request is not None and parse_quantity(limit) < parse_quantity(request):
            raise ValueError("spec.resources.limits.memory must be at least spec.resources.requests.memory")
        return self


class Toleration(_Model):
    """A core/v1 Toleration."""

    key: str | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = None
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None


class EnvVar(_Model):
    """An extra environment variable of the encoder container."""

    name: str = Field(min_length=1, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
    value: str | None = None
    value_from: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _one_value(self) -> "EnvVar":
        if self.value is not None and self.value_from is not None:
            raise ValueError("an env entry sets value or valueFrom, not both")
        return self


class LocalObjectReference(_Model):
    """A reference to a Secret by name (image pull secrets)."""

    name: str = Field(min_length=1)


class PoolSpec(_Model):
    """``spec`` of an EncoderPool."""

    model: str = Field(min_length=1, max_length=1024)
    model_volume: ModelVolume | None = None
    replicas: int = Field(1, ge=0, le=1000)
    parallelism: Parallelism = Field(default_factory=Parallelism)
    device: Literal["cuda", "cpu"] = "cuda"
    max_gpus_per_pod: int = Field(8, ge=1, le=64, alias="maxGPUsPerPod")
    gpu_resource_name: str = Field(
        "nvidia.com/gpu",
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
    )
    batching: Batching = Field(default_factory=Batching)
    transfer: Transfer = Field(default_factory=Transfer)
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
    termination_grace_period_seconds: int = Field(60, ge=0, le=3600)
    shm_size: Quantity = "1Gi"

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
        if self.device == "cpu" and self.batching.image_processor_use_gpu:
            raise ValueError("spec.batching.imageProcessorUseGPU needs spec.device=cuda")
        clash = sorted({e.name for e in self.env} & set(names.MANAGED_ENV))
        if clash:
            raise ValueError(
                "spec.env must not set an ENCODER_* variable the operator renders from the spec "
                f"({', '.join(clash)}): set the spec field instead"
            )
        if len({e.name for e in self.env}) != len(self.env):
            raise ValueError("spec.env has a variable twice")
        reserved = sorted(set(self.pod_labels) & set(names.RESERVED_LABELS))
        if reserved:
            raise ValueError(f"spec.podLabels must not set {', '.join(reserved)}: the operator owns them")
        return self

    @property
    def gpus_per_pod(self) -> int:
        """GPUs each pod requests: tensor x data on GPU pools, 0 on CPU pools."""
        return self.parallelism.tensor * self.parallelism.data if self.device == "cuda" else 0

    @property
    def model_path(self) -> str:
        """The checkpoint path the pod reads: inside the model volume when one is set."""
        if self.model_volume is None or self.model.startswith("/"):
            return self.model
        return f"{self.model_volume.mount_path.rstrip('/')}/{self.model}"

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
