"""The mooncake transfer engine, as SGLang's encoder drives it (one per process, created on first use).

The engine comes from the optional extra ``encoderpool[mooncake]`` (PyPI
``mooncake-transfer-engine-non-cuda``: this pod sends from host memory, so the CUDA build is not
needed). Its native library needs ``libibverbs.so.1`` even for TCP (Debian/Ubuntu package
``libibverbs1``). It is initialised as SGLang's wrapper does
(``distributed/device_communicators/mooncake_transfer_engine.py``): ``initialize(hostname,
"P2PHANDSHAKE", protocol, device)``, no metadata server; protocol ``rdma`` falls back to TCP on a
host without RDMA devices. The engine listens on two TCP ports of its own (handshake and data);
a write opens a connection from this pod to the prefill rank's ports.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
from typing import Any

from encoder_pod.errors import InvalidRequest, TransferFailed

log = logging.getLogger(__name__)

INSTALL_HINT = (
    "install the optional extra encoderpool[mooncake] (pip package mooncake-transfer-engine-non-cuda) "
    "and the system library libibverbs.so.1 (apt-get install libibverbs1)"
)


class MooncakeUnavailable(InvalidRequest):
    """This pod cannot serve the mooncake backend (the package or its native library is missing) (400)."""


def local_ip() -> str:
    """This host's outward-facing address (no packet is sent: a UDP connect only picks the route)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))
            return str(probe.getsockname()[0])
        except OSError:
            return "127.0.0.1"


def engine_hostname(configured: str, bind_host: str) -> str:
    """What mooncake names this pod by: the setting, else the bind address unless it is a wildcard."""
    if configured:
        return configured
    try:
        wildcard = ipaddress.ip_address(bind_host).is_unspecified
    except ValueError:
        wildcard = False  # a host name: use it as is
    return local_ip() if wildcard or not bind_host else bind_host.strip("[]")


class MooncakeEngine:
    """A lazily created ``mooncake.engine.TransferEngine`` (thread-safe start; calls block, run them in a thread)."""

    def __init__(self, hostname: str, protocol: str = "rdma", device: str = "") -> None:
        self.hostname = hostname
        self.protocol = protocol
        self.device = device
        self._engine: Any = None
        self._error: str | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Import and initialise the engine once; raise :class:`MooncakeUnavailable` naming why it cannot."""
        with self._lock:
            if self._engine is not None:
                return
            if self._error is not None:
                raise MooncakeUnavailable(self._error)
            try:
                from mooncake.engine import TransferEngine  # type: ignore[import-untyped,import-not-found,unused-ignore]
            except ImportError as exc:  # the package, or libibverbs.so.1 under it
                self._error = f"the mooncake transfer backend is not available on this pod ({exc}); {INSTALL_HINT}"
                raise MooncakeUnavailable(self._error) from None
            engine = TransferEngine()
            ret = engine.initialize(self.hostname, "P2PHANDSHAKE", self.protocol, self.device)
            if ret != 0:
                self._error = f"mooncake TransferEngine.initialize({self.hostname!r}, P2PHANDSHAKE, {self.protocol!r}) returned {ret}"
                raise MooncakeUnavailable(self._error)
            self._engine = engine
            log.info("mooncake transfer engine up: session %s (%s)", self.session_id, self.protocol)

    @property
    def session_id(self) -> str:
        """``host:rpc_port``, as SGLang names a mooncake session."""
        port = self._engine.get_rpc_port() if self._engine is not None else 0
        host = f"[{self.hostname}]" if ":" in self.hostname else self.hostname
        return f"{host}:{port}"

    def register(self, ptr: int, length: int) -> None:
        """Register host memory for transfers (RDMA needs it; TCP tolerates its absence)."""
        self.start()
        ret = self._engine.register_memory(ptr, length)
        if ret != 0:
            raise TransferFailed(f"mooncake register_memory({length} bytes) returned {ret}")

    def unregister(self, ptr: int) -> None:
        """Undo :meth:`register` (failures only logged: the memory is being dropped anyway)."""
        if self._engine is None:
            return
        ret = self._engine.unregister_memory(ptr)
        if ret != 0:
            log.warning("mooncake unregister_memory returned %s", ret)

    def write(self, session_id: str, src: int, dst: int, length: int) -> None:
        """Write ``length`` bytes from local ``src`` to ``dst`` in the peer ``session_id``; TransferFailed on failure."""
        self.start()
        ret = self._engine.transfer_sync_write(session_id, src, dst, length)
        if ret < 0:
            raise TransferFailed(f"mooncake transfer_sync_write to {session_id} ({length} bytes at {dst:#x}) returned {ret}")
