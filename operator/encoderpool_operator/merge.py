"""Strategic merge of a partial pod template onto the generated one (pure functions).

The semantics are core/v1's patch strategy, for the fields a pod template has: maps merge key by
key, lists of objects with a merge key (containers by name, volumes by name, volumeMounts by
mountPath, ports by containerPort, ...) merge item by item with new items appended, and every
other list (tolerations, args, command) is replaced whole. ``$patch: delete`` on a list item
removes the generated item with that key, as in ``kubectl patch``.

Then the fields the operator owns are put back (see :func:`protect`): an override cannot change
the encoder container's command, ports, image, GPU count or the settings it renders, nor the
labels the pool selects its pods by. Each such collision is reported, never silently kept.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

# core/v1 patchMergeKey of the list fields found in a PodTemplateSpec.
MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "env": "name",
    "envFrom": "prefix",
    "ports": "containerPort",
    "imagePullSecrets": "name",
    "hostAliases": "ip",
    "topologySpreadConstraints": "topologyKey",
    "resourceClaims": "name",
    "claims": "name",
    "schedulingGates": "name",
}
PATCH_DIRECTIVE = "$patch"


def _merge_list(base: list[Any], patch: list[Any], key: str) -> list[Any]:
    out = [copy.deepcopy(item) for item in base]
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            out.append(copy.deepcopy(item))  # no key to match on: an addition
            continue
        index = next((i for i, old in enumerate(out) if isinstance(old, dict) and old.get(key) == item[key]), None)
        if item.get(PATCH_DIRECTIVE) == "delete":
            if index is not None:
                del out[index]
            continue
        if index is None:
            out.append({k: copy.deepcopy(v) for k, v in item.items() if k != PATCH_DIRECTIVE})
        else:
            out[index] = merge(out[index], item)
    return out


def merge(base: Any, patch: Any, field: str = "") -> Any:
    """``patch`` merged onto ``base`` (neither is modified)."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = copy.deepcopy(base)
        for key, value in patch.items():
            if key == PATCH_DIRECTIVE:
                continue
            if value is None:
                out.pop(key, None)  # null removes a key, as in a merge patch
            elif key in out:
                out[key] = merge(out[key], value, key)
            else:
                out[key] = copy.deepcopy(value)
        return out
    if isinstance(base, list) and isinstance(patch, list) and field in MERGE_KEYS:
        return _merge_list(base, patch, MERGE_KEYS[field])
    return copy.deepcopy(patch)


def _by_key(items: Iterable[dict[str, Any]], key: str, value: Any) -> dict[str, Any] | None:
    return next((i for i in items if i.get(key) == value), None)


def protect(generated: dict[str, Any], merged: dict[str, Any], container: str, labels: Iterable[str],
            env: Iterable[str], resource: str) -> tuple[dict[str, Any], list[str]]:
    """Put the operator's own values back into ``merged``; returns it and the fields that collided.

    ``container`` names the encoder container, ``labels`` the pod labels the pool selects on and
    its own, ``env`` the variables it renders, ``resource`` the GPU resource (a CPU pool asks
    for none of it, and an override cannot add it either).
    """
    out = copy.deepcopy(merged)
    collisions: list[str] = []
    gen_labels = generated["metadata"].get("labels") or {}
    out_labels = out["metadata"].setdefault("labels", {})
    for label in labels:
        if out_labels.get(label) != gen_labels.get(label):
            collisions.append(f"metadata.labels[{label}]")
            if label in gen_labels:
                out_labels[label] = gen_labels[label]
            else:
                out_labels.pop(label, None)
    gen_c = _by_key(generated["spec"]["containers"], "name", container)
    assert gen_c is not None, "the generated template has the encoder container"
    containers = out["spec"].setdefault("containers", [])
    out_c = _by_key(containers, "name", container)
    if out_c is None:
        collisions.append(f"spec.containers[{container}]")
        containers.insert(0, copy.deepcopy(gen_c))
        return out, collisions
    where = f"spec.containers[{container}]"
    for field in ("command", "args", "ports", "image", "name"):
        if out_c.get(field) != gen_c.get(field):
            collisions.append(f"{where}.{field}")
            if field in gen_c:
                out_c[field] = copy.deepcopy(gen_c[field])
            else:
                out_c.pop(field, None)
    gen_env = {e["name"]: e for e in gen_c.get("env") or []}
    for i, var in enumerate(out_c.get("env") or []):
        if var["name"] in set(env) and var != gen_env.get(var["name"]):
            collisions.append(f"{where}.env[{var['name']}]")
            out_c["env"][i] = copy.deepcopy(gen_env[var["name"]]) if var["name"] in gen_env else None
    out_c["env"] = [e for e in out_c.get("env") or [] if e is not None]
    for part in ("requests", "limits"):
        want = ((gen_c.get("resources") or {}).get(part) or {}).get(resource)
        have = ((out_c.get("resources") or {}).get(part) or {}).get(resource)
        if str(have) != str(want):
            collisions.append(f"{where}.resources.{part}[{resource}]")
            section = out_c.setdefault("resources", {}).setdefault(part, {})
            if want is None:
                section.pop(resource, None)
            else:
                section[resource] = want
    return out, collisions
