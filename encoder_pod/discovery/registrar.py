"""Registering this pod with SGLang's ``EncoderBootstrapServer`` (the prefill side's dynamic discovery).

A prefill server started with ``--language-only`` runs a bootstrap server (port 8997 by
default) that keeps the list of encoder URLs it dispatches to. Its API is the same in SGLang
0.5.19 .. 0.5.23: ``POST /register_encoder_url {"url"}``, ``DELETE /unregister_encoder_url
{"url"}``, ``GET /list_encoder_urls``. It probes each URL's ``/health`` (every 10 s, 2 s timeout)
and evicts one after three misses in a row; an evicted URL that answers again comes back, and
one that stays dead is dropped for good after ten minutes.

The pod, unlike SGLang's own encoder (register before serving, unregister at exit):

- registers once it is READY (its first real encode worked), with each bootstrap on its own,
  retrying with exponential backoff (0.5 s doubling to 30 s) for as long as it runs;
- then checks every REGISTER_CHECK_INTERVAL that each bootstrap still lists it and registers
  again if not (a restarted bootstrap, or a URL dropped after a long outage). It never
  re-registers a URL that is listed: that would reset the bootstrap's failure count;
- withdraws at the START of a drain (:meth:`Registrar.withdraw`), before in-flight work
  finishes, so no new request is dispatched to a pod that is going away. Snapshots the prefill
  took earlier may still send to it; the pod keeps serving those until it exits.

The URL registered is ADVERTISE_URL, else ``http://HOST:PORT`` with a wildcard HOST replaced by
this host's address (no trailing slash: the prefill appends ``/encode``).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from dataclasses import dataclass
from typing import Awaitable, Callable

import httpx

from encoder_pod import json_limits
from encoder_pod.settings import ServerSettings

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 5.0
WITHDRAW_TIMEOUT_S = 2.0
BACKOFF_INITIAL_S = 0.5
BACKOFF_MAX_S = 30.0


def advertised_url(server: ServerSettings, local_ip: Callable[[], str]) -> str:
    """ADVERTISE_URL, or ``http://HOST:PORT`` with a wildcard HOST replaced by ``local_ip()``."""
    if server.advertise_url:
        return server.advertise_url
    host = server.host.strip("[]")
    try:
        if ipaddress.ip_address(host).is_unspecified:
            host = local_ip()
    except ValueError:
        pass  # a host name: advertised as is
    literal = f"[{host}]" if ":" in host else host
    return f"http://{literal}:{server.port}"


@dataclass
class BootstrapState:
    """What this pod knows about one bootstrap server (read by /server_info and tests)."""

    url: str
    registered: bool = False
    attempts: int = 0
    last_error: str | None = None


class Registrar:
    """Keeps this pod registered with every bootstrap server until :meth:`withdraw`; one task per bootstrap."""

    def __init__(self, bootstraps: list[str], advertise: str, *, check_interval: float = 30.0,
                 backoff_max: float = BACKOFF_MAX_S) -> None:
        self.advertise = advertise
        self.check_interval = check_interval
        self.backoff_max = backoff_max
        self.states = {url: BootstrapState(url) for url in bootstraps}
        self._tasks: list[asyncio.Task[None]] = []
        self._withdrawn = False
        self._withdrawal: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Begin registering (idempotent; no-op after :meth:`withdraw` or without bootstraps)."""
        if self._tasks or self._withdrawn:
            return
        self._tasks = [asyncio.create_task(self._keep(state), name=f"register-{state.url}") for state in self.states.values()]

    async def start_when_ready(self, is_ready: Callable[[], Awaitable[bool]], poll_s: float = 0.5) -> None:
        """Wait until ``is_ready()`` (the pod's readiness), then :meth:`start`; returns early on withdraw."""
        while not self._withdrawn:
            if await is_ready():
                self.start()
                return
            await asyncio.sleep(poll_s)

    async def _keep(self, state: BootstrapState) -> None:
        async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, trust_env=False) as client:
            delay = BACKOFF_INITIAL_S
            while not self._withdrawn:
                listed = state.registered and await self._listed(client, state)
                if not listed:
                    state.registered = await self._register(client, state)
                if state.registered:
                    delay = BACKOFF_INITIAL_S
                    if self.check_interval <= 0:
                        return
                    await asyncio.sleep(self.check_interval)
                else:
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, self.backoff_max)

    async def _register(self, client: httpx.AsyncClient, state: BootstrapState) -> bool:
        state.attempts += 1
        try:
            resp = await client.post(f"{state.url}/register_encoder_url", json={"url": self.advertise})
        except httpx.HTTPError as exc:
            state.last_error = f"{type(exc).__name__}: {exc}"
            self._log_failure(state)
            return False
        if resp.status_code != 200:
            state.last_error = f"HTTP {resp.status_code}: {resp.text[:200]}"
            self._log_failure(state)
            return False
        state.last_error = None
        log.info("registered %s with SGLang bootstrap %s", self.advertise, state.url)
        return True

    @staticmethod
    def _log_failure(state: BootstrapState) -> None:
        # First failure and then every tenth: a bootstrap that is not up yet must not flood the log.
        if state.attempts == 1 or state.attempts % 10 == 0:
            log.warning("registering with SGLang bootstrap %s failed (attempt %d): %s", state.url, state.attempts, state.last_error)

    async def _listed(self, client: httpx.AsyncClient, state: BootstrapState) -> bool:
        """Whether the bootstrap lists this pod; an unreachable bootstrap counts as listed (it will probe us)."""
        try:
            resp = await client.get(f"{state.url}/list_encoder_urls")
            urls = json_limits.loads(resp.content).get("encoder_urls", []) if resp.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            return True
        if urls is None or self.advertise in urls:
            return True
        log.warning("SGLang bootstrap %s no longer lists %s; registering again", state.url, self.advertise)
        return False

    def withdraw(self) -> asyncio.Task[None]:
        """Stop registering and unregister from every bootstrap now (the start of a drain); idempotent.

        Returns the task doing it (each DELETE bounded by 2 s); callable from a signal handler.
        """
        if self._withdrawal is None:
            self._withdrawn = True
            for task in self._tasks:
                task.cancel()
            self._withdrawal = asyncio.get_running_loop().create_task(self._unregister_all(), name="unregister")
        return self._withdrawal

    async def _unregister_all(self) -> None:
        await asyncio.gather(*self._tasks, return_exceptions=True)
        async with httpx.AsyncClient(timeout=WITHDRAW_TIMEOUT_S, trust_env=False) as client:
            await asyncio.gather(*(self._unregister(client, state) for state in self.states.values()))

    async def _unregister(self, client: httpx.AsyncClient, state: BootstrapState) -> None:
        try:
            resp = await client.request("DELETE", f"{state.url}/unregister_encoder_url", json={"url": self.advertise})
            ok = resp.status_code == 200
            reason = f"HTTP {resp.status_code}"
        except httpx.HTTPError as exc:
            ok, reason = False, f"{type(exc).__name__}: {exc}"
        state.registered = False
        if ok:
            log.info("unregistered %s from SGLang bootstrap %s", self.advertise, state.url)
        else:
            log.warning("unregistering from SGLang bootstrap %s failed (%s); its health probe will evict this pod", state.url, reason)
