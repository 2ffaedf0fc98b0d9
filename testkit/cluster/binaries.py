"""Locate the control-plane binaries built by hack/build-control-plane.sh.

The build script writes ``$ENCODERPOOL_CACHE/bin/control-plane.env`` (KEY=path lines). Reading that
file, rather than guessing paths, keeps the version choice in one place: the build script.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

BUILD_COMMAND = "make control-plane   (or: bash hack/build-control-plane.sh)"


class MissingBinaries(RuntimeError):
    """The control plane has not been built (or was built partially)."""


@dataclasses.dataclass(frozen=True)
class Binaries:
    """Paths of every executable the local cluster runs, plus the versions they were built at."""

    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kubectl: Path
    kwok: Path
    kwok_stages: Path
    helm: Path
    k8s_version: str
    etcd_version: str
    kwok_version: str
    helm_version: str


def cache_dir() -> Path:
    """The encoderpool cache (binaries, Go caches), outside the repository."""
    return Path(os.environ.get("ENCODERPOOL_CACHE") or Path.home() / ".cache" / "encoderpool")


def env_file() -> Path:
    """Where the build script records the binary paths."""
    return cache_dir() / "bin" / "control-plane.env"


def parse_env_file(text: str) -> dict[str, str]:
    """Parse KEY=value lines, ignoring blanks and # comments."""
    values = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


def load_binaries() -> Binaries:
    """Read the env file and check every binary exists; raise MissingBinaries saying how to build."""
    path = env_file()
    if not path.is_file():
        raise MissingBinaries(
            f"the local Kubernetes control plane is not built ({path} is missing).\n"
            f"Build it once (cached outside the repo; 7-15 min cold on 2 cores): {BUILD_COMMAND}"
        )
    values = parse_env_file(path.read_text())
    keys = {
        "etcd": "ETCD",
        "kube_apiserver": "KUBE_APISERVER",
        "kube_controller_manager": "KUBE_CONTROLLER_MANAGER",
        "kube_scheduler": "KUBE_SCHEDULER",
        "kubectl": "KUBECTL",
        "kwok": "KWOK",
        "kwok_stages": "KWOK_STAGES",
        "helm": "HELM",
    }
    missing = [key for key in keys.values() if key not in values]
    paths = {field: Path(values.get(key, "")) for field, key in keys.items()}
    missing += [str(p) for p in paths.values() if str(p) != "." and not p.is_file()]
    if missing:
        raise MissingBinaries(
            f"the local control plane build is incomplete ({', '.join(missing)} missing; "
            f"read from {path}).\nRebuild it: {BUILD_COMMAND}"
        )
    return Binaries(
        **paths,
        k8s_version=values.get("K8S_VERSION", "unknown"),
        etcd_version=values.get("ETCD_VERSION", "unknown"),
        kwok_version=values.get("KWOK_VERSION", "unknown"),
        helm_version=values.get("HELM_VERSION", "unknown"),
    )
