"""Turn a Pod's container into a host command line (pure functions, no I/O).

What a kubelet would do before starting a container, minus images and namespaces: resolve the env
(literal values, fieldRef, resourceFieldRef, ConfigMap/Secret keys through a lookup callback),
expand ``$(VAR)`` references in command/args, and move wildcard bind addresses onto the pod's own
loopback IP, so two pods listening on the same container port do not collide on the host.
"""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

WILDCARD_ADDRESSES = ("0.0.0.0", "::", "[::]")

# lookup(kind, namespace, name) -> the object's data (Secret data already base64-decoded) or None.
Lookup = Callable[[str, str, str], Mapping[str, str] | None]


class ContainerConfigError(ValueError):
    """The container cannot be started as specified (kubelet: CreateContainerConfigError)."""


_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes $(VAR) expansion: defined vars are substituted, $$ is a literal $."""

    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env[name] if name in env else match.group(0)

    return _VAR_REF.sub(substitute, text)


_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)$")
_SUFFIXES = {
    "": 1, "m": Decimal("0.001"), "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
}


def parse_quantity(text: str) -> Decimal:
    """A resource.Quantity string ("500m", "2Gi", "1") as a Decimal number of base units."""
    match = _QUANTITY.match(str(text).strip())
    if not match or match.group(2) not in _SUFFIXES:
        raise ContainerConfigError(f"unsupported quantity {text!r}")
    return Decimal(match.group(1)) * Decimal(_SUFFIXES[match.group(2)])


def _resource_value(ref: Mapping[str, Any], container: Mapping[str, Any],
                    node_allocatable: Mapping[str, str]) -> str:
    """resourceFieldRef: like the kubelet, round up to the divisor; unset limits = node allocatable."""
    kind, _, resource = ref["resource"].partition(".")
    section = container.get("resources", {}).get(kind, {})
    raw = section.get(resource) or node_allocatable.get(resource, "0")
    divisor = parse_quantity(ref.get("divisor", "1") or "1")
    return str(math.ceil(parse_quantity(raw) / divisor))


def _field_value(path: str, pod: Mapping[str, Any], pod_ip: str, host_ip: str) -> str:
    """fieldRef.fieldPath as the downward API resolves it."""
    meta = pod.get("metadata", {})
    spec = pod.get("spec", {})
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.podIP": pod_ip,
        "status.podIPs": pod_ip,
        "status.hostIP": host_ip,
        "status.hostIPs": host_ip,
    }
    if path in simple:
        return simple[path]
    match = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if match:
        return meta.get(match.group(1), {}).get(match.group(2), "")
    raise ContainerConfigError(f"unsupported fieldRef {path!r}")


def _key_ref(kind: str, ref: Mapping[str, Any], namespace: str, lookup: Lookup) -> str | None:
    """configMapKeyRef / secretKeyRef; None when optional and missing."""
    data = lookup(kind, namespace, ref["name"])
    if data is not None and ref["key"] in data:
        return data[ref["key"]]
    if ref.get("optional"):
        return None
    raise ContainerConfigError(f"{kind} {namespace}/{ref['name']} has no key {ref['key']!r}")


def _env_from(sources: list[Mapping[str, Any]], namespace: str, lookup: Lookup) -> dict[str, str]:
    """envFrom: every key of a ConfigMap or Secret, with an optional prefix."""
    env: dict[str, str] = {}
    for source in sources:
        for kind, key in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
            if key not in source:
                continue
            data = lookup(kind, namespace, source[key]["name"])
            if data is None and not source[key].get("optional"):
                raise ContainerConfigError(f"{kind} {namespace}/{source[key]['name']} not found")
            env.update({source.get("prefix", "") + k: v for k, v in (data or {}).items()})
    return env


def resolve_env(pod: Mapping[str, Any], container: Mapping[str, Any], pod_ip: str, host_ip: str,
                lookup: Lookup, node_allocatable: Mapping[str, str] | None = None) -> dict[str, str]:
    """The container's environment, in declaration order, each value expanded against earlier ones."""
    namespace = pod.get("metadata", {}).get("namespace", "default")
    env = _env_from(container.get("envFrom") or [], namespace, lookup)
    for var in container.get("env") or []:
        source = var.get("valueFrom")
        if source is None:
            value: str | None = expand(var.get("value", ""), env)
        elif "fieldRef" in source:
            value = _field_value(source["fieldRef"]["fieldPath"], pod, pod_ip, host_ip)
        elif "resourceFieldRef" in source:
            value = _resource_value(source["resourceFieldRef"], container, node_allocatable or {})
        elif "configMapKeyRef" in source:
            value = _key_ref("ConfigMap", source["configMapKeyRef"], namespace, lookup)
        elif "secretKeyRef" in source:
            value = _key_ref("Secret", source["secretKeyRef"], namespace, lookup)
        else:
            raise ContainerConfigError(f"unsupported valueFrom for {var['name']}: {sorted(source)}")
        if value is not None:
            env[var["name"]] = value
    return env


def rebind(value: str, pod_ip: str) -> str:
    """Move a wildcard bind address onto the pod IP: "0.0.0.0" / "--host=::" / "0.0.0.0:8080"."""
    for wildcard in WILDCARD_ADDRESSES:
        if value == wildcard:
            return pod_ip
        if value.endswith("=" + wildcard):
            return value[: -len(wildcard)] + pod_ip
        if value.startswith(wildcard + ":") and value[len(wildcard) + 1:].isdigit():
            return pod_ip + value[len(wildcard):]
    return value


def container_argv(container: Mapping[str, Any], env: Mapping[str, str], pod_ip: str) -> list[str]:
    """command + args, $(VAR)-expanded and rebound. The image's entrypoint is unknown here."""
    argv = [*(container.get("command") or []), *(container.get("args") or [])]
    if not container.get("command"):
        raise ContainerConfigError(
            f"container {container.get('name')!r} has no command: the local node cannot run an "
            "image's entrypoint, only an explicit command"
        )
    return [rebind(expand(arg, env), pod_ip) for arg in argv]


def container_env(env: Mapping[str, str], pod_ip: str) -> dict[str, str]:
    """The resolved env with wildcard bind addresses moved onto the pod IP."""
    return {name: rebind(value, pod_ip) for name, value in env.items()}


def decode_secret_data(data: Mapping[str, str] | None) -> dict[str, str]:
    """Secret.data values are base64: decode them the way the kubelet does before use."""
    return {k: base64.b64decode(v).decode() for k, v in (data or {}).items()}
