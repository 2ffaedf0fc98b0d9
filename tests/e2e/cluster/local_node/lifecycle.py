"""Container lifecycle hooks on the local node: the preStop handler, run the way the kubelet runs it.

``sleep`` (the PodLifecycleSleepAction), ``exec`` and ``httpGet`` are supported. The kubelet
runs preStop before it sends SIGTERM, and the whole of it counts against the pod's grace period;
so does the harness (the caller bounds the wait by the remaining grace).
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Mapping
from typing import Any

import httpx

from .probes import _port


def run_handler(handler: Mapping[str, Any] | None, container: Mapping[str, Any], pod_ip: str,
                env: Mapping[str, str], stop: threading.Event, timeout: float) -> str:
    """Run one lifecycle handler; returns what happened (for the pod's log). ``stop`` cuts a sleep short."""
    if not handler:
        return "no handler"
    try:
        if "sleep" in handler:
            seconds = float(handler["sleep"]["seconds"])
            stop.wait(min(seconds, timeout))
            return f"slept {seconds:g}s"
        if "exec" in handler:
            done = subprocess.run(list(handler["exec"]["command"]), env=dict(env), capture_output=True,
                                  timeout=timeout, check=False)
            return f"exec exited {done.returncode}"
        if "httpGet" in handler:
            get = handler["httpGet"]
            url = f"{get.get('scheme', 'HTTP').lower()}://{get.get('host') or pod_ip}:{_port(get['port'], container)}" \
                  f"{get.get('path', '/')}"
            return f"httpGet {httpx.get(url, timeout=timeout, verify=False).status_code}"
    except (OSError, subprocess.TimeoutExpired, httpx.HTTPError) as err:
        return f"handler failed: {err}"  # the kubelet logs a failed preStop and goes on to SIGTERM
    return f"unsupported handler {sorted(handler)}"


class PreStop(threading.Thread):
    """The preStop hook in the background, so probes and status go on while it runs."""

    def __init__(self, container: Mapping[str, Any], pod_ip: str, env: Mapping[str, str], timeout: float) -> None:
        super().__init__(name="pre-stop", daemon=True)
        self._handler = ((container.get("lifecycle") or {}).get("preStop"))
        self._container = container
        self._pod_ip = pod_ip
        self._env = env
        self._timeout = timeout
        self.cancel = threading.Event()
        self.outcome = ""

    def run(self) -> None:
        """Thread body."""
        self.outcome = run_handler(self._handler, self._container, self._pod_ip, self._env, self.cancel, self._timeout)
