"""Running kubectl and helm against a cluster: shared by the local control plane and an external one."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


class ToolRunner:
    """kubectl/helm with the cluster's kubeconfig and helm state kept inside ``workdir``.

    Subclasses set ``workdir`` and ``kubeconfig``.
    """

    workdir: Path
    kubeconfig: Path
    tool_timeout: float = 120.0

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
