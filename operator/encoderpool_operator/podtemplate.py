"""The encoder pod template: the generated pod, the image it runs, and the user's overrides.

Pure functions of the typed spec, the operator settings and the pool's last status;
snapshot-tested. The parts (containers, probes, volumes) are in ``podparts.py``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from encoderpool_operator import names
from encoderpool_operator.merge import merge, protect
from encoderpool_operator.podparts import (
    encoder_container,
    fetch_container,
    optional_pod_fields,
    pod_security_context,
    volumes_and_mounts,
)
from encoderpool_operator.podsettings import RESERVED_ENV
from encoderpool_operator.settings import OperatorSettings
from encoderpool_operator.spec import PoolSpec

# Spec fields that do not shape a pod: changing them must never roll pods (a partition moved to
# release a canary, an autoscaling bound, the replica count).
NOT_POD_FIELDS = {"replicas", "rollout", "autoscaling", "follow_default_image"}


@dataclass(frozen=True)
class ImageChoice:
    """The encoder image, and for which device it is the operator's default (None: spec.image)."""

    image: str
    default_for: str | None = None


@dataclass(frozen=True)
class RenderedTemplate:
    """The pod template, the image it runs and the override fields that were not applied."""

    template: dict[str, Any]
    image: ImageChoice
    collisions: list[str] = field(default_factory=list)


def spec_hash(spec: PoolSpec) -> str:
    """A short hash of what in the spec shapes a pod (fields left at their defaults count as unset).

    It goes on the pod template, so any such spec change rolls the pods, even one that would not
    otherwise change the template, while scaling or a rollout setting never does. Defaults are
    left out so that a new optional field in a later operator version does not roll every pool.
    """
    wire = spec.model_dump(mode="json", by_alias=True, exclude_none=True, exclude_defaults=True,
                           exclude=NOT_POD_FIELDS)
    return hashlib.sha256(json.dumps(wire, sort_keys=True).encode()).hexdigest()[:16]


def choose_image(spec: PoolSpec, settings: OperatorSettings, status: dict[str, Any]) -> ImageChoice:
    """spec.image; else the default image this pool already runs (status.image); else the current default.

    An operator upgrade that changes its default image therefore never rolls existing pools:
    the default applies to new pools, and to a pool that sets spec.followDefaultImage.
    """
    if spec.image:
        return ImageChoice(spec.image)
    recorded, recorded_for = status.get("image"), status.get("imageDefaultFor")
    if not spec.follow_default_image and recorded and recorded_for == spec.device:
        return ImageChoice(str(recorded), spec.device)
    default = settings.default_image if spec.device == "cuda" else settings.default_cpu_image
    return ImageChoice(default, spec.device)


def generated_template(pool_name: str, spec: PoolSpec, image: str) -> dict[str, Any]:
    """The pod template the operator generates, before spec.podTemplate."""
    volumes, mounts = volumes_and_mounts(spec)
    annotations = {
        **spec.pod_annotations,
        names.SPEC_HASH_ANNOTATION: spec_hash(spec),
        names.DEFAULT_CONTAINER_ANNOTATION: names.CONTAINER_NAME,
    }
    pod_spec: dict[str, Any] = {"containers": [encoder_container(spec, image, mounts)]}
    fetch = fetch_container(spec, image, mounts)
    if fetch is not None:
        pod_spec["initContainers"] = [fetch]
    pod_spec.update({
        "volumes": volumes,
        "securityContext": pod_security_context(spec),
        "terminationGracePeriodSeconds": spec.grace_period_seconds,
        # The encoder never calls the API server.
        "automountServiceAccountToken": False,
        # Service links inject <SVC>_PORT variables for every Service in the namespace; a
        # Service named "encoder" would inject ENCODER_PORT=tcp://..., a settings variable.
        "enableServiceLinks": False,
        **optional_pod_fields(spec),
    })
    return {
        "metadata": {"labels": {**spec.pod_labels, **names.common_labels(pool_name)}, "annotations": annotations},
        "spec": pod_spec,
    }


def apply_overrides(generated: dict[str, Any], spec: PoolSpec) -> tuple[dict[str, Any], list[str]]:
    """spec.podTemplate merged onto the generated template, the operator's own fields kept."""
    override = spec.pod_template
    if override is None:
        return generated, []
    patch = {"metadata": override.metadata.model_dump(mode="json", exclude_defaults=True), "spec": override.spec}
    merged = merge(generated, patch)
    owned_labels = (*names.RESERVED_LABELS, names.REVISION_LABEL)
    return protect(generated, merged, names.CONTAINER_NAME, owned_labels, RESERVED_ENV, spec.gpu_resource_name)


def pod_template(pool_name: str, spec: PoolSpec, settings: OperatorSettings,
                 status: dict[str, Any] | None = None) -> RenderedTemplate:
    """The StatefulSet's pod template, with the image choice and any override collisions."""
    image = choose_image(spec, settings, status or {})
    template, collisions = apply_overrides(generated_template(pool_name, spec, image.image), spec)
    return RenderedTemplate(template, image, collisions)
