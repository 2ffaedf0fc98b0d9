"""Pod volumes on the local node, as directories (pure functions, plus one lookup callback).

A host process has no mount namespace, so the local node maps each volumeMount to a directory
and rewrites paths: an env value or argument that is a mountPath, or lies under one, is moved
into that directory (longest mountPath first). What each volume becomes:

- ``emptyDir``: a fresh directory of the pod (removed with the pod's run directory);
- ``persistentVolumeClaim``: the directory of the PersistentVolume bound to the claim
  (``hostPath.path`` or ``local.path``), shared by every pod that mounts it, as on a real node;
  an unbound claim cannot be started (the kubelet would never get such a pod);
- ``hostPath``: that directory itself;
- mounts at ``/tmp`` and ``/dev/shm`` are left alone: the host's own are what a process uses
  anyway, and paths the tests hand to pods (a checkpoint under pytest's tmp dir) live there;
  other sources (configMap, secret, image, ...) are not mapped.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .podspec import ContainerConfigError

# (namespace, claim name) -> the bound PersistentVolume's directory, or None when unbound.
ClaimLookup = Callable[[str, str], str | None]
LEFT_ALONE = ("/dev/shm", "/tmp")


@dataclasses.dataclass(frozen=True)
class Mount:
    """A mountPath and the host directory standing in for it."""

    container_path: str
    host_path: Path


def volume_dirs(pod: Mapping[str, Any], pod_dir: Path, claims: ClaimLookup) -> dict[str, Path]:
    """Host directory of each mappable volume of the pod, by volume name."""
    namespace = pod.get("metadata", {}).get("namespace", "default")
    out: dict[str, Path] = {}
    for volume in pod.get("spec", {}).get("volumes") or []:
        name = volume["name"]
        if "emptyDir" in volume:
            out[name] = pod_dir / "volumes" / name
        elif "hostPath" in volume:
            out[name] = Path(volume["hostPath"]["path"])
        elif "persistentVolumeClaim" in volume:
            claim = volume["persistentVolumeClaim"]["claimName"]
            path = claims(namespace, claim)
            if path is None:
                raise ContainerConfigError(f"persistentVolumeClaim {namespace}/{claim} is not bound to a volume "
                                           "with a hostPath or local path")
            out[name] = Path(path)
    return out


def container_mounts(container: Mapping[str, Any], dirs: Mapping[str, Path]) -> list[Mount]:
    """The container's mounts that have a host directory, longest mountPath first."""
    mounts = []
    for mount in container.get("volumeMounts") or []:
        path = str(mount["mountPath"]).rstrip("/") or "/"
        if mount["name"] not in dirs or path in LEFT_ALONE:
            continue
        host = dirs[mount["name"]] / mount["subPath"] if mount.get("subPath") else dirs[mount["name"]]
        mounts.append(Mount(path, host))
    return sorted(mounts, key=lambda m: len(m.container_path), reverse=True)


def _translate_path(value: str, mounts: list[Mount]) -> str:
    for mount in mounts:
        if value == mount.container_path or value.startswith(mount.container_path + "/"):
            return str(mount.host_path) + value[len(mount.container_path):]
    return value


def translate(value: str, mounts: list[Mount]) -> str:
    """``value`` with each path under a mountPath moved to its host directory: the value itself,
    after ``--flag=``, and each element of a ``:`` or ``,`` separated list (PATH-like variables)."""
    prefix, sep, rest = value.partition("=")
    if sep and rest.startswith("/") and not prefix.startswith("/"):
        return f"{prefix}={translate(rest, mounts)}"
    return "".join(_translate_path(part, mounts) for part in re.split(r"([:,])", value))


def prepare(mounts: list[Mount]) -> None:
    """Create the directories of emptyDirs (and subPaths) before the container starts."""
    for mount in mounts:
        mount.host_path.mkdir(parents=True, exist_ok=True)
