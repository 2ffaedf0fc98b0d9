"""What tests do with any cluster (kubectl, helm, namespaces, other identities): shared by the
local control plane and an external (kind) cluster."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .api import ApiClient, path_for, wait_for
from .kubeconfig import write_kubeconfig


class ClusterAccess:
    """kubectl/helm with the cluster's kubeconfig (helm state inside ``workdir``), namespaces and
    kubeconfigs for other identities.

    Subclasses set ``workdir``, ``kubeconfig``, ``server``, ``ca_file`` and provide ``api()``.
    """

    workdir: Path
    kubeconfig: Path
    server: str
    ca_file: Path
    tool_timeout: float = 120.0
    namespace_timeout: float = 30.0

    def api(self) -> ApiClient:
        """A new REST client (subclasses choose the identity)."""
        raise NotImplementedError

    def kubeconfig_for_token(self, token: str, name: str) -> Path:
        """A kubeconfig for another identity (e.g. ``kubectl create token`` of a ServiceAccount),
        so code under test runs with exactly that identity's RBAC, not the admin's."""
        return write_kubeconfig(self.workdir / f"kubeconfig-{name}", self.server, self.ca_file, token, name)

    def create_namespace(self, name: str, labels: Mapping[str, str] | None = None,
                         timeout: float | None = None) -> dict[str, Any]:
        """Create a namespace and wait for its default ServiceAccount (pods are refused before)."""
        with self.api() as api:
            namespace = api.create(path_for("v1", "namespaces"),
                                   {"metadata": {"name": name, "labels": dict(labels or {})}})
            wait_for(lambda: api.get_or_none(path_for("v1", "serviceaccounts", name, "default")),
                     timeout or self.namespace_timeout, f"ServiceAccount {name}/default")
        return namespace

    def tool_env(self) -> dict[str, str]:
        """Environment for kubectl/helm: this kubeconfig, helm state inside the workdir."""
        helm_home = self.workdir / "helm"
        return {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "HELM_CACHE_HOME": str(helm_home / "cache"),
            "HELM_CONFIG_HOME": str(helm_home / "config"),
            "HELM_DATA_HOME": str(helm_home / "data"),
        }

    def run_tool(self, binary: str | Path, *args: str, input: str | None = None, check: bool = True,
                 timeout: float | None = None) -> subprocess.CompletedProcess[str]:
        """Run a CLI against this cluster; with ``check`` a failure raises with stdout/stderr."""
        result = subprocess.run([str(binary), *args], input=input, capture_output=True, text=True,
                                env=self.tool_env(), timeout=timeout or self.tool_timeout, check=False)
        if check and result.returncode != 0:
            raise AssertionError(f"{Path(binary).name} {' '.join(args)} exited {result.returncode}\n"
                                 f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}")
        return result
