"""An existing cluster named by a kubeconfig: the kind tier (hack/kind-e2e.sh, ``make kind-e2e``).

``ExternalCluster`` offers the part of ``Cluster``'s interface the tests use (``api()``,
``kubectl()``, ``helm()``, ``create_namespace()``, ``kubeconfig_for_token()``) and starts or stops
nothing.

Selected by ``ENCODERPOOL_E2E_KUBECONFIG=<path>`` (see tests/e2e/conftest.py); kubectl and helm
come from PATH, or from ``ENCODERPOOL_E2E_KUBECTL`` / ``ENCODERPOOL_E2E_HELM``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import kubernetes.client
import kubernetes.config

from .api import ApiClient
from .tools import ClusterAccess

KUBECONFIG_ENV = "ENCODERPOOL_E2E_KUBECONFIG"


class ExternalCluster(ClusterAccess):
    """A cluster someone else runs (kind, or any other), reached through its kubeconfig."""

    external = True
    tool_timeout = 300.0
    namespace_timeout = 60.0

    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig
        config = kubernetes.client.Configuration()
        # The client library understands every kubeconfig form (kind's embedded client certificate
        # included) and writes embedded certificates to files, which is what httpx needs.
        kubernetes.config.load_kube_config(config_file=str(kubeconfig), client_configuration=config,
                                           persist_config=False)
        if not config.ssl_ca_cert:
            raise ValueError(f"{kubeconfig}: the tests need the cluster's CA in the kubeconfig")
        self.server: str = config.host
        self.ca_file = Path(config.ssl_ca_cert)
        bearer = str(config.auth_settings().get("BearerToken", {}).get("value") or "")
        self.token: str | None = bearer.removeprefix("Bearer ").strip() or None
        self._client_cert = (config.cert_file, config.key_file) if config.cert_file else None
        self._kubectl = os.environ.get("ENCODERPOOL_E2E_KUBECTL") or shutil.which("kubectl") or "kubectl"
        self._helm = os.environ.get("ENCODERPOOL_E2E_HELM") or shutil.which("helm") or "helm"
        self.workdir = Path(tempfile.mkdtemp(prefix="encoderpool-e2e-external-"))

    def api(self) -> ApiClient:
        """A new REST client with the kubeconfig's identity."""
        return ApiClient(self.server, self.token, self.ca_file, client_cert=self._client_cert)

    def log_path(self, component: str) -> Path:
        """Where a process started by the tests logs (nothing of the cluster's own is here)."""
        return self.workdir / "logs" / f"{component}.log"

    def kubectl(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """``kubectl ARGS`` with the kubeconfig's identity."""
        return self.run_tool(self._kubectl, *args, **kwargs)

    def helm(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """``helm ARGS`` with the kubeconfig's identity."""
        return self.run_tool(self._helm, *args, **kwargs)

    def close(self) -> None:
        """Remove the temp dir (kubeconfigs with tokens, helm state); the cluster stays."""
        shutil.rmtree(self.workdir, ignore_errors=True)
