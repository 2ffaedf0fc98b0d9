"""A real Kubernetes control plane as local processes: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok, plus fake GPU nodes.

``Cluster`` is a context manager. Teardown is layered so that no process survives the test run:
``stop()`` (context exit, pytest fixture teardown, Ctrl-C) stops everything in reverse order; an
``atexit`` hook covers interpreter exit; the reaper process (reaper.py) covers SIGTERM and SIGKILL
of the test runner, where no Python code runs at all.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from . import components
from .api import ApiClient, path_for, wait_for
from .binaries import Binaries, load_binaries
from .kubeconfig import write_kubeconfig
from .nodes import FakeGpuNode, default_fake_gpu_nodes, fake_gpu_node_manifest, node_ready
from .pki import create_pki
from .procs import ManagedProcess, Reaper
from .tools import ClusterAccess

log = logging.getLogger(__name__)

STOP_GRACE_SECONDS = 2.0
PORT_ATTEMPTS = 3


@dataclasses.dataclass(frozen=True)
class ClusterOptions:
    """What to start besides the control plane itself."""

    fake_gpu_nodes: tuple[FakeGpuNode, ...] = tuple(default_fake_gpu_nodes())
    #: Keep logs and data after stop (also: ENCODERPOOL_E2E_KEEP=1).
    keep_workdir: bool = False
    start_timeout: float = 90.0


class ComponentFailed(RuntimeError):
    """A component exited or never became healthy; the message carries its log tail."""


class Cluster(ClusterAccess):
    """One local cluster. Attributes are valid after ``start()``."""

    def __init__(self, binaries: Binaries | None = None, options: ClusterOptions | None = None) -> None:
        self.binaries = binaries or load_binaries()
        self.options = options or ClusterOptions()
        self.workdir = Path(tempfile.mkdtemp(prefix="encoderpool-e2e-"))
        self.ports = components.Ports.pick()
        self.server = f"https://127.0.0.1:{self.ports.apiserver}"
        self.kubeconfig = self.workdir / "kubeconfig"
        try:
            self.pki = create_pki(self.workdir / "pki")
        except BaseException:
            shutil.rmtree(self.workdir, ignore_errors=True)
            raise
        self.token = self.pki.admin_token
        self.ca_file = self.pki.ca_cert
        self._reaper: Reaper | None = None
        self._procs: dict[str, ManagedProcess] = {}
        self._stopped = False

    # --- public helpers ---------------------------------------------------------------------------

    def api(self) -> ApiClient:
        """A new admin REST client (one per thread; close it, or use it as a context manager)."""
        return ApiClient(self.server, self.token, self.ca_file)

    def kubectl(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """``kubectl ARGS`` with the admin kubeconfig."""
        return self.run_tool(self.binaries.kubectl, *args, **kwargs)

    def helm(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """``helm ARGS`` with the admin kubeconfig."""
        return self.run_tool(self.binaries.helm, *args, **kwargs)

    def pids(self) -> dict[str, int]:
        """PIDs of every process this cluster started (components, reaper), by name."""
        pids = {name: proc.pid for name, proc in self._procs.items()}
        if self._reaper is not None:
            pids["reaper"] = self._reaper.pid
        return pids

    def log_path(self, component: str) -> Path:
        """Log file of a component (etcd, kube-apiserver, ...)."""
        return self.workdir / "logs" / f"{component}.log"

    # --- lifecycle --------------------------------------------------------------------------------

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Cluster:
        """Start every component and wait until nodes are Ready; on failure stop what started."""
        atexit.register(self.stop)
        self._reaper = Reaper()
        began = time.monotonic()
        try:
            for attempt in range(PORT_ATTEMPTS):
                try:
                    self._start_control_plane()
                    break
                except ComponentFailed as err:
                    # Free ports are picked, then released, then bound by the components: another
                    # process may take one in between. Rare; retry with fresh ports.
                    if "address already in use" not in str(err) or attempt == PORT_ATTEMPTS - 1:
                        raise
                    log.warning("local cluster: a port was taken meanwhile, retrying: %s", err)
                    self._stop_processes()
                    self.ports = components.Ports.pick()
                    self.server = f"https://127.0.0.1:{self.ports.apiserver}"
            self._register_nodes()
        except BaseException:
            self.stop()
            raise
        log.info("local cluster up in %.1fs: %s (kubeconfig %s)", time.monotonic() - began,
                 self.server, self.kubeconfig)
        return self

    def _spawn(self, name: str, argv: Sequence[str]) -> ManagedProcess:
        assert self._reaper is not None
        proc = ManagedProcess(name, argv, self.log_path(name), self._reaper)
        self._procs[name] = proc
        return proc

    def _wait_healthy(self, name: str, check: Callable[[], Any], timeout: float | None = None) -> None:
        """Wait for ``check`` to pass; fail at once, with the log tail, if the process died."""
        proc = self._procs[name]

        def alive_and_healthy() -> Any:
            if proc.poll() is not None:
                raise ComponentFailed(f"{name} exited with {proc.poll()}:\n{proc.log_tail()}")
            return check()

        try:
            wait_for(alive_and_healthy, timeout or self.options.start_timeout, f"{name} to become healthy")
        except TimeoutError as err:
            raise ComponentFailed(f"{err}\n--- {name} log tail ---\n{proc.log_tail()}") from err

    def _start_control_plane(self) -> None:
        b, ports = self.binaries, self.ports
        self._spawn("etcd", components.etcd_argv(b, ports, self.workdir / "etcd"))
        self._wait_healthy("etcd", lambda: httpx.get(
            f"http://127.0.0.1:{ports.etcd_client}/health", timeout=2).json().get("health") == "true")
        self._spawn("kube-apiserver", components.apiserver_argv(b, ports, self.pki))
        write_kubeconfig(self.kubeconfig, self.server, self.ca_file, self.token)
        with self.api() as api:
            self._wait_healthy("kube-apiserver", lambda: api.request("GET", "/readyz") is not None)
        self._spawn("kube-controller-manager",
                    components.controller_manager_argv(b, ports, self.pki, self.kubeconfig))
        self._spawn("kube-scheduler", components.scheduler_argv(b, ports, self.kubeconfig))
        self._spawn("kwok", components.kwok_argv(b, ports, self.kubeconfig))
        for name, port in (("kube-controller-manager", ports.controller_manager),
                           ("kube-scheduler", ports.scheduler)):
            # Self-signed serving certs generated by the component itself: nothing to verify against.
            self._wait_healthy(name, lambda port=port: httpx.get(
                f"https://127.0.0.1:{port}/healthz", verify=False, timeout=2).status_code == 200)
        with self.api() as api:
            # The serviceaccount controller must be running before any pod can be admitted.
            self._wait_healthy("kube-controller-manager", lambda: api.get_or_none(
                path_for("v1", "serviceaccounts", "default", "default")))

    def _register_nodes(self) -> None:
        with self.api() as api:
            for node in self.options.fake_gpu_nodes:
                api.create(path_for("v1", "nodes"), fake_gpu_node_manifest(node))
            for node in self.options.fake_gpu_nodes:
                self._wait_healthy("kwok", lambda name=node.name: node_ready(
                    api.get(path_for("v1", "nodes", name=name))))

    def _stop_processes(self) -> None:
        """Stop components in reverse start order and forget them."""
        for name in reversed(list(self._procs)):
            # Short grace: the data is thrown away, and kube-apiserver's graceful termination
            # otherwise waits seconds for clients' open watches to go away.
            began = time.monotonic()
            code = self._procs.pop(name).stop(grace=STOP_GRACE_SECONDS)
            log.info("local cluster: %s stopped in %.1fs (exit %s)", name, time.monotonic() - began, code)

    def stop(self) -> None:
        """Stop pods, then components in reverse start order; idempotent."""
        if self._stopped:
            return
        self._stopped = True
        atexit.unregister(self.stop)
        began = time.monotonic()
        try:
            self._stop_processes()
        finally:
            if self._reaper is not None:
                self._reaper.close()
            log.info("local cluster: stopped in %.1fs", time.monotonic() - began)
            keep = self.options.keep_workdir or os.environ.get("ENCODERPOOL_E2E_KEEP") == "1"
            if keep:
                log.warning("local cluster: kept logs and data in %s", self.workdir)
            else:
                shutil.rmtree(self.workdir, ignore_errors=True)
