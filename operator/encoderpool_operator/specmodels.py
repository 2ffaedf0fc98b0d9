"""Building blocks of the EncoderPool spec: quantities and the sub-objects of the pod spec.

Pure pydantic models mirroring the CRD's openAPIV3Schema (field names and defaults are kept equal
to the CRD by a unit test). ``spec.py`` assembles them into :class:`PoolSpec`. The objects that
hold pod settings (parallelism, batching, transfer) are generated into ``podsettings.py``.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

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


class SpecModel(BaseModel):
    """camelCase on the wire, snake_case in Python, unknown fields refused."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class PvcSource(SpecModel):
    """A PersistentVolumeClaim holding the checkpoint."""

    claim_name: str = Field(min_length=1, max_length=253)


class HostPathSource(SpecModel):
    """A directory on the node holding the checkpoint (not allowed by the restricted policy)."""

    path: str = Field(pattern=r"^/")


class ImageSource(SpecModel):
    """An OCI image mounted as a volume (Kubernetes image volumes)."""

    reference: str = Field(min_length=1)
    pull_policy: Literal["Always", "Never", "IfNotPresent"] = "IfNotPresent"


class ModelVolume(SpecModel):
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


class ResourceList(SpecModel):
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


class Resources(SpecModel):
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


class Toleration(SpecModel):
    """A core/v1 Toleration."""

    key: str | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = None
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None


class EnvVar(SpecModel):
    """An extra environment variable of the encoder container."""

    name: str = Field(min_length=1, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
    value: str | None = None
    value_from: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _one_value(self) -> "EnvVar":
        if self.value is not None and self.value_from is not None:
            raise ValueError("an env entry sets value or valueFrom, not both")
        return self


class LocalObjectReference(SpecModel):
    """A reference to a Secret by name (image pull secrets)."""

    name: str = Field(min_length=1)

