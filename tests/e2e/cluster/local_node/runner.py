"""One pod on the local node: its init containers and first container as host processes, its
volumes as directories, probes, restarts with back-off, graceful termination, and its status
written through the API (a kubelet in miniature).

Each pod gets its own thread. The thread owns the pod's processes from start to stop and is the
only writer of that pod's status, so no locking is needed around the pod's state.

Termination, as the kubelet does it: on deletion the preStop hook runs (readiness probes and
status go on meanwhile), then SIGTERM goes to the process group, then SIGKILL once the pod's
grace period (counted from the deletion) is over; only then is the pod object finalized.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx

from ..api import ApiClient, ApiError, path_for
from ..procs import ManagedProcess, Reaper
from . import podspec, volumes
from .lifecycle import PreStop
from .probes import ProbeWorker, parse_probe, run_probe
from .status import ConditionClock, ContainerView, now_rfc3339, pod_status_patch

log = logging.getLogger(__name__)

MAX_BACKOFF_SECONDS = 300.0
START_ERROR_CODE = 128  # what the kubelet reports when the runtime could not exec the command


@dataclasses.dataclass(frozen=True)
class RunnerSettings:
    """What every pod runner of one local node shares."""

    api_factory: Callable[[], ApiClient]
    reaper: Reaper
    workdir: Path
    host_ip: str
    base_env: Mapping[str, str]
    node_allocatable: Mapping[str, str]
    backoff_base: float = 10.0
    max_stop_grace: float = 10.0  # kills for restarts and teardown
    max_termination_grace: float = 300.0  # a pod's own grace period, bounded so a test cannot hang


@dataclasses.dataclass
class _Container:
    """A container ready to start: its view, argv, env and probes."""

    spec: dict[str, Any]
    view: ContainerView
    argv: list[str] = dataclasses.field(default_factory=list)
    env: dict[str, str] = dataclasses.field(default_factory=dict)


class PodRunner(threading.Thread):
    """Runs one pod until ``stop()``; with ``finalize=True`` it then deletes the pod object."""

    def __init__(self, pod: dict[str, Any], pod_ip: str, settings: RunnerSettings,
                 on_exit: Callable[[PodRunner], None]) -> None:
        meta = pod["metadata"]
        super().__init__(name=f"pod-{meta['namespace']}/{meta['name']}", daemon=True)
        self.pod = pod
        self.uid: str = meta["uid"]
        self.pod_ip = pod_ip
        self._settings = settings
        self._on_exit = on_exit
        self._stop_event = threading.Event()
        self._terminate = threading.Event()
        self._grace = 30.0
        self._finalize = False
        self._phase = "Pending"
        self._start_time = now_rfc3339()
        self._clock = ConditionClock()
        spec = pod["spec"]
        self._main = _Container(spec["containers"][0], ContainerView(spec["containers"][0]["name"],
                                                                     spec["containers"][0].get("image", "")))
        self._inits = [_Container(c, ContainerView(c["name"], c.get("image", "")))
                       for c in spec.get("initContainers") or []]
        # Only the first container runs; the others are reported, honestly, as not started.
        self._others = [ContainerView(c["name"], c.get("image", "")) for c in spec["containers"][1:]]
        for view in self._others:
            view.set_waiting("NotRunOnLocalNode", "the local node runs only a pod's first container")
        self._last_published: dict[str, Any] | None = None
        self._dir = settings.workdir / f"{meta['namespace']}_{meta['name']}_{self.uid[:8]}"

    @property
    def pod_path(self) -> str:
        """REST path of the pod."""
        return path_for("v1", "pods", self.pod["metadata"]["namespace"], self.pod["metadata"]["name"])

    def stop(self, finalize: bool = False) -> None:
        """Ask the thread to kill the processes (and, if ``finalize``, to delete the pod object)."""
        self._finalize = self._finalize or finalize
        self._stop_event.set()

    def _interrupted(self, seconds: float | None = None) -> bool:
        """Wait ``seconds`` (None: for ever) unless stopped or deleted first; True if interrupted."""
        deadline = None if seconds is None else time.monotonic() + seconds
        while deadline is None or time.monotonic() < deadline:
            if self._stop_event.wait(0.1) or self._terminate.is_set():
                return True
        return False

    def terminate(self, grace: float) -> None:
        """The pod was deleted: preStop, SIGTERM, SIGKILL after ``grace`` seconds, then finalize."""
        if self._terminate.is_set():
            return
        self._grace = min(max(grace, 0.0), self._settings.max_termination_grace)
        self._finalize = True
        self._terminate.set()

    def run(self) -> None:
        """Thread body: run the pod, always kill its processes, then report back."""
        api = self._settings.api_factory()
        try:
            self._run(api)
            if self._finalize:
                self._delete_pod(api)
        except Exception:  # a bug here must not kill the harness silently: log it with the pod name
            log.exception("local node: runner of %s failed", self.name)
        finally:
            api.close()
            self._on_exit(self)

    def _run(self, api: ApiClient) -> None:
        self._dir.mkdir(parents=True, exist_ok=True)
        self._publish(api)
        try:
            for container in [*self._inits, self._main]:
                self._prepare(api, container)
        except (podspec.ContainerConfigError, ValueError, KeyError) as err:
            self._main.view.set_waiting("CreateContainerConfigError", str(err))
            self._publish(api)
            self._interrupted()
            return
        for init in self._inits:
            if not self._run_to_completion(api, init):
                return
        self._phase = "Running"
        self._run_main(api)

    def _prepare(self, api: ApiClient, container: _Container) -> None:
        """Resolve env and argv now, so a config error shows before anything starts."""

        def lookup(kind: str, namespace: str, name: str) -> Mapping[str, str] | None:
            obj = api.get_or_none(path_for("v1", kind.lower() + "s", namespace, name))
            if obj is None:
                return None
            return podspec.decode_secret_data(obj.get("data")) if kind == "Secret" else obj.get("data") or {}

        def claim_dir(namespace: str, claim: str) -> str | None:
            pvc = api.get_or_none(path_for("v1", "persistentvolumeclaims", namespace, claim))
            bound = ((pvc or {}).get("spec") or {}).get("volumeName")
            pv = api.get_or_none(path_for("v1", "persistentvolumes", name=bound)) if bound else None
            source = (pv or {}).get("spec") or {}
            return (source.get("hostPath") or source.get("local") or {}).get("path")

        mounts = volumes.container_mounts(container.spec, volumes.volume_dirs(self.pod, self._dir, claim_dir))
        volumes.prepare(mounts)
        env = podspec.resolve_env(self.pod, container.spec, self.pod_ip, self._settings.host_ip, lookup,
                                  self._settings.node_allocatable)
        container.argv = [volumes.translate(a, mounts) for a in podspec.container_argv(container.spec, env, self.pod_ip)]
        container.env = {**self._settings.base_env, "HOSTNAME": self.pod["metadata"]["name"],
                         **{k: volumes.translate(v, mounts) for k, v in podspec.container_env(env, self.pod_ip).items()}}
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            parse_probe(container.spec.get(kind), container.spec)  # fail early on a bad probe

    def _spawn(self, container: _Container) -> ManagedProcess:
        workdir = Path(container.spec.get("workingDir") or self._dir)
        if not workdir.is_dir():
            workdir = self._dir
        proc = ManagedProcess(container.view.name, container.argv, self._dir / f"{container.view.name}.log",
                              self._settings.reaper, env=container.env, cwd=workdir)
        container.view.set_running(f"local://{proc.pid}")
        return proc

    def _stop_grace(self) -> float:
        grace = self.pod["spec"].get("terminationGracePeriodSeconds", 30)
        return float(min(grace, self._settings.max_stop_grace))

    def _run_to_completion(self, api: ApiClient, init: _Container) -> bool:
        """Run an init container until it exits 0 (retrying unless restartPolicy is Never)."""
        while True:
            try:
                proc = self._spawn(init)
            except OSError as err:
                terminated = init.view.set_terminated(START_ERROR_CODE, f"failed to start: {err}", "StartError")
                if not self._restart_or_finish(api, init.view, terminated):
                    return False
                continue
            self._publish(api)
            while proc.poll() is None:
                if self._stop_event.wait(0.1) or self._terminate.is_set():
                    proc.stop(self._stop_grace())
                    return False
            code = _exit_code(proc.poll())
            terminated = init.view.set_terminated(code, proc.log_tail(5) if code else "")
            if code == 0:
                self._publish(api)
                return True
            if not self._restart_or_finish(api, init.view, terminated):
                return False

    def _run_main(self, api: ApiClient) -> None:
        """Run the first container, restarting it per restartPolicy, until stopped."""
        while not self._stop_event.is_set() and not self._terminate.is_set():
            outcome = self._run_once(api)
            if outcome is None:
                return
            terminated = self._main.view.set_terminated(*outcome)
            if not self._restart_or_finish(api, self._main.view, terminated):
                return

    def _restart_or_finish(self, api: ApiClient, view: ContainerView, terminated: dict[str, Any]) -> bool:
        """After an exit: back off and return True to restart, or end the pod and return False."""
        policy = self.pod["spec"].get("restartPolicy", "Always")
        if policy == "Never" or (policy == "OnFailure" and terminated["exitCode"] == 0):
            self._phase = "Succeeded" if terminated["exitCode"] == 0 else "Failed"
            self._publish(api)
            self._interrupted()
            return False
        view.restart_count += 1
        view.last_state = {"terminated": terminated}
        backoff = min(self._settings.backoff_base * 2 ** (view.restart_count - 1), MAX_BACKOFF_SECONDS)
        meta = self.pod["metadata"]
        view.set_waiting("CrashLoopBackOff", f"back-off {backoff:g}s restarting failed container={view.name} "
                                             f"pod={meta['name']}_{meta['namespace']}({self.uid})")
        self._publish(api)
        return not self._interrupted(backoff)

    def _run_once(self, api: ApiClient) -> tuple[int, str, str] | None:
        """Start the container and probe it until it exits (code, message, reason) or we stop (None)."""
        spec = self._main.spec
        try:
            proc = self._spawn(self._main)
        except OSError as err:  # command not found, not executable: the kubelet's StartError
            return START_ERROR_CODE, f"failed to start: {err}", "StartError"
        begun = time.monotonic()
        workers = {kind: ProbeWorker(probe, begun) for kind in ("startupProbe", "readinessProbe", "livenessProbe")
                   if (probe := parse_probe(spec.get(kind), spec)) is not None}
        view = self._main.view
        view.started = "startupProbe" not in workers
        view.ready = view.started and "readinessProbe" not in workers
        self._publish(api)
        while not self._stop_event.wait(0.1):
            if self._terminate.is_set():
                self._graceful_stop(api, proc, workers)
                return None
            code = proc.poll()
            if code is not None:
                return _exit_code(code), proc.log_tail(5) if code else "", ""
            failure = self._probe_step(workers)
            if failure:
                return _exit_code(proc.stop(self._stop_grace())), failure, ""
            self._publish(api)
        proc.stop(self._stop_grace())
        return None

    def _graceful_stop(self, api: ApiClient, proc: ManagedProcess, workers: dict[str, ProbeWorker]) -> None:
        """preStop, SIGTERM, SIGKILL at the end of the grace period; readiness is probed throughout."""
        deadline = time.monotonic() + self._grace
        hook = PreStop(self._main.spec, self.pod_ip, self._main.env, self._grace)
        hook.start()
        signalled = False
        while proc.poll() is None and time.monotonic() < deadline and not self._stop_event.is_set():
            if not signalled and not hook.is_alive():
                log.info("local node: %s: preStop %s; SIGTERM", self.name, hook.outcome)
                proc.send_signal(signal.SIGTERM)
                signalled = True
            self._probe_step(workers, readiness_only=True)
            self._publish(api)
            time.sleep(0.1)
        hook.cancel.set()
        killed = proc.poll() is None
        code = _exit_code(proc.stop(0.5))
        log.info("local node: %s stopped %.1fs after its deletion (%s, exit code %d)", self.name,
                 self._grace - max(deadline - time.monotonic(), 0.0), "SIGKILL at the grace period" if killed
                 else "exited", code)
        self._main.view.set_terminated(code, "" if code == 0 else proc.log_tail(5))
        self._publish(api)

    def _probe_step(self, workers: dict[str, ProbeWorker], readiness_only: bool = False) -> str:
        """Run due probes, update the view; return a message if the container must be killed.

        A terminating pod only keeps its readiness probe (the kubelet stops the others).
        """
        view = self._main.view
        kinds = ("readinessProbe",) if readiness_only else ("startupProbe", "readinessProbe", "livenessProbe")
        for kind in kinds:
            worker = workers.get(kind)
            # The startup probe runs until it succeeds; the others only after that (kubelet rule).
            if worker is None or not worker.due() or view.started != (kind != "startupProbe"):
                continue
            worker.record(*run_probe(worker.spec, self.pod_ip, self._main.env))
            if kind == "startupProbe" and worker.result is not None:
                if not worker.result:
                    return f"Startup probe failed: {worker.message}"
                view.started = True
                view.ready = "readinessProbe" not in workers
            elif kind == "readinessProbe" and worker.result is not None:
                view.ready = worker.result
            elif kind == "livenessProbe" and worker.result is False:
                return f"Liveness probe failed: {worker.message}"
        return ""

    def _publish(self, api: ApiClient) -> None:
        """PATCH the pod status if it changed since the last successful write."""
        patch = pod_status_patch(self._phase, self.pod_ip, self._settings.host_ip, self._start_time,
                                 [self._main.view, *self._others], [c.view for c in self._inits], self._clock)
        if patch == self._last_published:
            return
        try:
            api.patch(self.pod_path + "/status", patch)
            self._last_published = patch
        except ApiError as err:
            if err.status_code == 404:
                self._stop_event.set()  # the pod is gone: nothing left to run it for
            else:
                log.warning("local node: status of %s not written: %s", self.name, err)
        except httpx.HTTPError as err:
            log.warning("local node: status of %s not written: %s", self.name, err)

    def _delete_pod(self, api: ApiClient) -> None:
        """What the kubelet does once containers are gone: finish the graceful deletion."""
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": self.uid}}
        try:
            api.request("DELETE", self.pod_path, body)
        except ApiError as err:
            if err.status_code not in (404, 409):  # 409: a new pod with the same name exists
                log.warning("local node: could not finalize %s: %s", self.name, err)


def _exit_code(returncode: int | None) -> int:
    """Popen reports death by signal N as -N; containers report it as 128+N (SIGKILL: 137)."""
    if returncode is None:
        return 137
    return 128 - returncode if returncode < 0 else returncode
