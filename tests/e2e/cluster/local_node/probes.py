"""The pod's own probes (startup, readiness, liveness), run the way the kubelet runs them:
httpGet / tcpSocket / exec, with initialDelaySeconds, periodSeconds, timeoutSeconds,
successThreshold and failureThreshold, and the same defaults (10 s period, 1 s timeout, 3 failures).
"""

from __future__ import annotations

import dataclasses
import socket
import subprocess
import time
from collections.abc import Mapping
from typing import Any

import httpx


@dataclasses.dataclass(frozen=True)
class ProbeSpec:
    """One probe, with kubelet defaults applied and named ports resolved."""

    kind: str  # "http", "tcp" or "exec"
    port: int = 0
    path: str = "/"
    scheme: str = "http"
    host: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    command: tuple[str, ...] = ()
    initial_delay: float = 0.0
    period: float = 10.0
    timeout: float = 1.0
    success_threshold: int = 1
    failure_threshold: int = 3


def _port(value: Any, container: Mapping[str, Any]) -> int:
    """A probe port is a number or the name of one of the container's ports."""
    if isinstance(value, int) or str(value).isdigit():
        return int(value)
    for port in container.get("ports") or []:
        if port.get("name") == value:
            return int(port["containerPort"])
    raise ValueError(f"probe names port {value!r}, which the container does not declare")


def parse_probe(probe: Mapping[str, Any] | None, container: Mapping[str, Any]) -> ProbeSpec | None:
    """A ProbeSpec from a pod's probe dict (None stays None). grpc probes are not supported."""
    if not probe:
        return None
    timing = {
        "initial_delay": float(probe.get("initialDelaySeconds", 0)),
        "period": float(probe.get("periodSeconds", 10)),
        "timeout": float(probe.get("timeoutSeconds", 1)),
        "success_threshold": int(probe.get("successThreshold", 1)),
        "failure_threshold": int(probe.get("failureThreshold", 3)),
    }
    if "httpGet" in probe:
        get = probe["httpGet"]
        headers = tuple((h["name"], h["value"]) for h in get.get("httpHeaders") or [])
        return ProbeSpec("http", port=_port(get["port"], container), path=get.get("path", "/"),
                         scheme=get.get("scheme", "HTTP").lower(), host=get.get("host"),
                         headers=headers, **timing)
    if "tcpSocket" in probe:
        tcp = probe["tcpSocket"]
        return ProbeSpec("tcp", port=_port(tcp["port"], container), host=tcp.get("host"), **timing)
    if "exec" in probe:
        return ProbeSpec("exec", command=tuple(probe["exec"]["command"]), **timing)
    raise ValueError(f"unsupported probe handler: {sorted(probe)}")


def run_probe(spec: ProbeSpec, pod_ip: str, env: Mapping[str, str]) -> tuple[bool, str]:
    """Run a probe once: (success, message). Like the kubelet, 200-399 is an HTTP success."""
    host = spec.host or pod_ip
    try:
        if spec.kind == "http":
            url = f"{spec.scheme}://{host}:{spec.port}{spec.path}"
            # verify=False: the kubelet does not verify certificates of HTTPS probes either.
            response = httpx.get(url, headers=dict(spec.headers), timeout=spec.timeout, verify=False)
            return 200 <= response.status_code < 400, f"HTTP probe failed with statuscode: {response.status_code}"
        if spec.kind == "tcp":
            with socket.create_connection((host, spec.port), timeout=spec.timeout):
                return True, ""
        result = subprocess.run(list(spec.command), env=dict(env), capture_output=True,
                                timeout=spec.timeout, check=False)
        return result.returncode == 0, result.stdout.decode(errors="replace")[-200:]
    except (httpx.HTTPError, OSError, subprocess.TimeoutExpired) as err:
        return False, f"probe error: {err}"


class ProbeWorker:
    """Schedules one probe against one container start and keeps its thresholded result."""

    def __init__(self, spec: ProbeSpec, started_at: float) -> None:
        self.spec = spec
        self._next = started_at + spec.initial_delay
        self._successes = 0
        self._failures = 0
        self.result: bool | None = None  # None until a threshold is crossed
        self.message = ""

    def due(self, now: float | None = None) -> bool:
        """True when the next probe should run."""
        return (time.monotonic() if now is None else now) >= self._next

    def record(self, success: bool, message: str, now: float | None = None) -> bool:
        """Feed one probe outcome; return True if the thresholded result changed."""
        self._next = (time.monotonic() if now is None else now) + self.spec.period
        if success:
            self._successes, self._failures = self._successes + 1, 0
        else:
            self._successes, self._failures = 0, self._failures + 1
            self.message = message
        before = self.result
        if success and self._successes >= self.spec.success_threshold:
            self.result = True
        elif not success and self._failures >= self.spec.failure_threshold:
            self.result = False
        return self.result != before
