"""Pod IPs for the local node.

Every pod gets its own address, so that two pods can listen on the same container port. Two kinds:

- routed (needs CAP_NET_ADMIN, i.e. root, as on CI): a random /24 inside 198.18.0.0/15 is made a
  *local* range on ``lo`` (``ip route add local 198.18.X.0/24 dev lo``, the mechanism that makes all
  of 127/8 local). 198.18.0.0/15 is reserved for benchmarking (RFC 2544) and never used on real
  networks. These are ordinary unicast addresses, so EndpointSlices accept them: the whole chain
  Pod -> Ready -> EndpointSlice -> request works. The route is removed at teardown, and by the
  reaper if the test runner is killed.
- loopback (fallback, no privileges): 127.X.Y.Z. Pods run, are probed and become Ready, but the
  API server refuses loopback addresses in EndpointSlices (and Endpoints), so Services never list
  them. ``routable`` says which kind is in use.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import subprocess
import threading

from ..procs import Reaper

log = logging.getLogger(__name__)

ROUTED_RANGE_SECOND_OCTETS = (18, 19)  # 198.18.0.0/15


class PodNetwork:
    """A /24 of pod addresses (.2-.254) handed out one per pod."""

    def __init__(self, prefix: str, routable: bool, reaper: Reaper | None = None) -> None:
        self.prefix = prefix
        self.routable = routable
        self._route_owned = routable
        self._reaper = reaper
        self._free = [f"{prefix}.{i}" for i in range(2, 255)]
        self._lock = threading.Lock()

    @property
    def cidr(self) -> str:
        """The /24 pods get their IPs from."""
        return f"{self.prefix}.0/24"

    def take(self) -> str:
        """An unused IP (raises RuntimeError when all 253 are in use)."""
        with self._lock:
            if not self._free:
                raise RuntimeError(f"local node: no free pod IP left in {self.cidr}")
            return self._free.pop(0)

    def give_back(self, ip: str) -> None:
        """Return an IP; it is reused last, so a recreated pod rarely gets a just-freed address."""
        with self._lock:
            self._free.append(ip)

    def close(self) -> None:
        """Remove the local route (routed kind); idempotent."""
        if not self._route_owned:
            return
        delete = _route_cmd("del", self.cidr)
        subprocess.run(delete, capture_output=True, check=False)
        if self._reaper is not None:
            self._reaper.forget_command(delete)
        self._route_owned = False


def _route_cmd(action: str, cidr: str) -> list[str]:
    return ["ip", "route", action, "local", cidr, "dev", "lo"]


def loopback_network(rng: random.Random) -> PodNetwork:
    """127.X.Y.0/24, random so that two clusters on one machine do not share addresses."""
    return PodNetwork(f"127.{rng.randint(1, 254)}.{rng.randint(1, 254)}", routable=False)


def routed_network(rng: random.Random, reaper: Reaper, attempts: int = 8) -> PodNetwork | None:
    """Claim a free 198.18.X.0/24 as a local range; None if that is not permitted here."""
    if shutil.which("ip") is None:
        return None
    for _ in range(attempts):
        prefix = f"198.{rng.choice(ROUTED_RANGE_SECOND_OCTETS)}.{rng.randint(0, 255)}"
        cidr = f"{prefix}.0/24"
        # Registered before adding, so a kill between the two cannot leave the route behind.
        reaper.run_at_exit(_route_cmd("del", cidr))
        added = subprocess.run(_route_cmd("add", cidr), capture_output=True, text=True, check=False)
        if added.returncode == 0:
            return PodNetwork(prefix, routable=True, reaper=reaper)
        reaper.forget_command(_route_cmd("del", cidr))
        if "File exists" not in added.stderr:  # not permitted (no CAP_NET_ADMIN) or no iproute2
            log.info("local node: cannot add a local route (%s)", added.stderr.strip())
            return None
    return None


def choose_network(mode: str, reaper: Reaper, rng: random.Random | None = None) -> PodNetwork:
    """``mode``: "routed", "loopback" or "auto" (routed when permitted, else loopback)."""
    rng = rng or random.Random()
    if mode not in ("auto", "routed", "loopback"):
        raise ValueError(f"pod network mode must be auto, routed or loopback, not {mode!r}")
    if mode != "loopback" and (mode == "routed" or os.geteuid() == 0):
        network = routed_network(rng, reaper)
        if network is not None:
            return network
        if mode == "routed":
            raise RuntimeError("routed pod network requested, but `ip route add local ... dev lo` failed "
                               "(it needs CAP_NET_ADMIN)")
    log.warning("local node: pod IPs are loopback addresses; EndpointSlices will not list local pods "
                "(run as root for routed pod IPs)")
    return loopback_network(rng)
