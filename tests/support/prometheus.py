"""A real Prometheus server (Debian's package, 2.42) on a free loopback port, for tests and pictures.

The binary is run directly with a temporary config and data directory, never as the package's
system service. ``hack/prometheus.sh`` installs the package when it is missing (``make test``
runs it).
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from testkit.server import free_port

INSTALL_HINT = "Prometheus is not installed: run `bash hack/prometheus.sh` (Debian's prometheus package, 2.42, with promtool)"


def binary(name: str) -> str | None:
    """Path of ``prometheus`` or ``promtool``, or None."""
    return shutil.which(name)


class Prometheus:
    """``prometheus`` scraping ``scrape_configs`` every ``interval``, with ``rule_files`` loaded."""

    def __init__(self, scrape_configs: list[dict[str, Any]], *, interval: str = "1s",
                 rule_files: list[Path] | None = None, workdir: Path | None = None) -> None:
        path = binary("prometheus")
        if path is None:
            raise RuntimeError(INSTALL_HINT)
        self._binary = path
        self._own_dir = workdir is None
        self.dir = Path(workdir or tempfile.mkdtemp(prefix="prometheus-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.config = self.dir / "prometheus.yml"
        self._scrape_configs = scrape_configs
        self._interval = interval
        self._rule_files = [str(p) for p in rule_files or []]
        self._write_config()
        self._log = open(self.dir / "prometheus.log", "wb")
        self.proc: subprocess.Popen[bytes] | None = None

    def _write_config(self) -> None:
        config = {
            "global": {"scrape_interval": self._interval, "evaluation_interval": self._interval},
            "rule_files": self._rule_files,
            "scrape_configs": self._scrape_configs,
        }
        self.config.write_text(yaml.safe_dump(config, sort_keys=False))

    def start(self, timeout: float = 60.0) -> "Prometheus":
        """Launch and wait until it is ready."""
        cmd = [
            self._binary, f"--config.file={self.config}", f"--storage.tsdb.path={self.dir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-lifecycle",
            "--storage.tsdb.retention.time=1d", "--log.level=warn",
        ]
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.proc.returncode}:\n{self.log_text()}")
            try:
                if httpx.get(self.base_url + "/-/ready", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"prometheus never got ready:\n{self.log_text()}")

    def reload(self, scrape_configs: list[dict[str, Any]] | None = None, rule_files: list[Path] | None = None) -> None:
        """Rewrite the config (targets, rules) and tell Prometheus to read it again."""
        if scrape_configs is not None:
            self._scrape_configs = scrape_configs
        if rule_files is not None:
            self._rule_files = [str(p) for p in rule_files]
        self._write_config()
        response = httpx.post(self.base_url + "/-/reload", timeout=10)
        response.raise_for_status()

    def api(self, path: str, **params: Any) -> Any:
        """``GET /api/v1/<path>``'s data; raises with Prometheus's error text on a failure."""
        response = httpx.get(f"{self.base_url}/api/v1/{path}", params=params, timeout=30)
        body = response.json()
        if body.get("status") != "success":
            raise RuntimeError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query's result vector (or a scalar as one sample)."""
        params: dict[str, Any] = {"query": expr}
        if at is not None:
            params["time"] = at
        data = self.api("query", **params)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """A range query's matrix."""
        return list(self.api("query_range", query=expr, start=start, end=end, step=step)["result"])

    def targets(self) -> list[dict[str, Any]]:
        """The active scrape targets with their health."""
        return list(self.api("targets")["activeTargets"])

    def wait_targets_up(self, count: int, timeout: float = 60.0) -> None:
        """Wait until ``count`` targets are scraped successfully."""
        deadline = time.monotonic() + timeout
        targets: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            targets = self.targets()
            if sum(1 for t in targets if t["health"] == "up") >= count:
                return
            time.sleep(0.5)
        raise TimeoutError(f"{count} targets never all up: {[(t['scrapeUrl'], t['health'], t['lastError']) for t in targets]}")

    def rule_groups(self) -> list[dict[str, Any]]:
        """Loaded rule groups with each rule's health, state and last error."""
        return list(self.api("rules")["groups"])

    def series_names(self) -> set[str]:
        """Every metric name Prometheus holds."""
        return set(self.api("label/__name__/values"))

    def log_text(self) -> str:
        """What the server printed."""
        self._log.flush()
        return (self.dir / "prometheus.log").read_text(errors="replace")

    def stop(self) -> None:
        """Stop the server (and remove its directory if it made it)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "Prometheus":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
