"""The real helm on the chart: where it is, and ``helm template`` read back as objects.

helm is built from its Go module by hack/build-control-plane.sh (``make control-plane``) and
cached outside the repo; it is found through $ENCODERPOOL_HELM or the control-plane env file.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[2] / "charts" / "encoderpool-operator"
DEFAULT_KUBE_VERSION = "1.35.4"
MISSING = "helm is not built yet: run `make control-plane` (or set ENCODERPOOL_HELM)"


def control_plane_env() -> dict[str, str]:
    """KEY=VALUE lines of the env file the control-plane build writes (empty if not built)."""
    cache = Path(os.environ.get("ENCODERPOOL_CACHE") or Path.home() / ".cache" / "encoderpool")
    path = cache / "bin" / "control-plane.env"
    if not path.is_file():
        return {}
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line and not line.startswith("#"))
    return {k.strip(): v.strip() for k, v in pairs}


def helm_path() -> str | None:
    """Path of the helm binary, or None when it is not built."""
    path = os.environ.get("ENCODERPOOL_HELM") or control_plane_env().get("HELM", "")
    return path if path and os.access(path, os.X_OK) else None


def kube_version() -> str:
    """The Kubernetes version to render for."""
    # The locally built helm has no default Kubernetes version stamped in (it says v1.20), and
    # the chart requires >= 1.30: render for the version the control plane runs.
    return control_plane_env().get("K8S_VERSION", DEFAULT_KUBE_VERSION).lstrip("v")


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``helm <args> --kube-version <version>``."""
    return subprocess.run([helm, *args, "--kube-version", kube_version()], capture_output=True, text=True, timeout=60)


def render(helm: str, *sets: str, release: str = "encpool", strings: tuple[str, ...] = ()) -> dict[str, Any]:
    """helm template -> {kind: object}, or {kind: [objects]} for kinds rendered more than once."""
    args = ["template", release, str(CHART), "--namespace", "ops"]
    for s in sets:
        args += ["--set", s]
    for s in strings:
        args += ["--set-string", s]
    done = run_helm(helm, *args)
    assert done.returncode == 0, done.stderr
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    by_kind: dict[str, Any] = {}
    for doc in docs:
        if doc["kind"] in by_kind:
            previous = by_kind[doc["kind"]]
            by_kind[doc["kind"]] = (previous if isinstance(previous, list) else [previous]) + [doc]
        else:
            by_kind[doc["kind"]] = doc
    return by_kind


def rendered_rules(helm: str, *sets: str) -> dict[str, Any]:
    """The chart's PrometheusRule (enabled, with ``sets``) as a Prometheus rule file's content."""
    objs = render(helm, "metrics.prometheusRule.enabled=true", *sets)
    return {"groups": objs["PrometheusRule"]["spec"]["groups"]}
