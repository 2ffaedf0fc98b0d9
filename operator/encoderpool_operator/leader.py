"""Leader election on a coordination.k8s.io Lease, the way client-go's leaderelection does it.

Replicas compete for one Lease. The holder renews it every ``retry_period``; a standby takes it
over once the holder's record has not changed for ``lease_duration`` (measured on the standby's
own monotonic clock, so clock skew between nodes does not matter). A leader that cannot renew
for ``renew_deadline`` (< lease_duration) gives up before anyone may take over, and the process
exits: it never acts without the lease. A leader that stops cleanly releases the Lease, so the
standby takes over at its next retry instead of waiting out the duration.

Writes use the Lease's resourceVersion (PUT), so two standbys cannot both win.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timezone
from typing import Any, Callable, Protocol

from encoderpool_operator.errors import ApiError, ConflictError
from encoderpool_operator.metrics import OperatorMetrics
from encoderpool_operator.settings import OperatorSettings

log = logging.getLogger(__name__)


class LeaseClient(Protocol):
    """What the elector needs from the API server."""

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """An object, or None."""

    def create(self, kind: str, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST a new object."""

    def replace(self, kind: str, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """PUT an object."""


def micro_time(moment: datetime | None = None) -> str:
    """A metav1.MicroTime."""
    return (moment or datetime.now(timezone.utc)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """One replica's side of the election."""

    def __init__(self, client: LeaseClient, settings: OperatorSettings, identity: str, namespace: str,
                 metrics: OperatorMetrics | None = None, clock: Callable[[], float] = time.monotonic,
                 pause: Callable[[float], bool] | None = None) -> None:
        self.client = client
        self.settings = settings
        self.identity = identity
        self.namespace = namespace
        self.metrics = metrics
        self._clock = clock
        self._observed: tuple[Any, ...] | None = None  # (holder, renewTime) as last seen
        self._observed_at = 0.0
        self._last_renew = 0.0
        self._renewer: threading.Thread | None = None
        self._renewing = threading.Event()
        # Waits between renewals; True when release() asked the renewals to end.
        self._pause = pause or self._renewing.wait
        self.leading = False

    @property
    def name(self) -> str:
        """The Lease's name."""
        return self.settings.lease_name

    def _lease(self, spec: dict[str, Any], previous: dict[str, Any] | None = None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if previous is not None:
            meta = {**previous["metadata"], **meta}
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}

    def _expired(self, spec: dict[str, Any]) -> bool:
        record = (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("leaseTransitions"))
        now = self._clock()
        if record != self._observed:
            self._observed, self._observed_at = record, now
        duration = float(spec.get("leaseDurationSeconds") or self.settings.lease_duration_seconds)
        return not spec.get("holderIdentity") or now - self._observed_at > duration

    def try_acquire_or_renew(self) -> bool:
        """One attempt; True when this replica holds the Lease afterwards."""
        now = micro_time()
        duration = int(round(self.settings.lease_duration_seconds))
        lease = self.client.get("Lease", self.namespace, self.name)
        if lease is None:
            spec: dict[str, Any] = {"holderIdentity": self.identity, "leaseDurationSeconds": duration,
                    "acquireTime": now, "renewTime": now, "leaseTransitions": 0}
            try:
                self.client.create("Lease", self.namespace, self._lease(spec))
            except ConflictError:
                return False  # another replica created it first
            return self._won(spec)
        spec = dict(lease.get("spec") or {})
        holder = spec.get("holderIdentity")
        if holder != self.identity and not self._expired(spec):
            return False
        if holder != self.identity:
            spec.update(acquireTime=now, leaseTransitions=int(spec.get("leaseTransitions") or 0) + 1)
        spec.update(holderIdentity=self.identity, leaseDurationSeconds=duration, renewTime=now)
        try:
            self.client.replace("Lease", self.namespace, self.name, self._lease(spec, lease))
        except ConflictError:
            return False  # someone else wrote it in between
        return self._won(spec)

    def _won(self, spec: dict[str, Any]) -> bool:
        self._last_renew = self._clock()
        if not self.leading:
            self.leading = True
            log.info("became leader (Lease %s/%s, identity %s)", self.namespace, self.name, self.identity)
            if self.metrics is not None:
                self.metrics.leader.set(1)
                self.metrics.transitions.inc()
        return True

    def acquire(self, stop: threading.Event) -> bool:
        """Block until this replica leads (True) or ``stop`` is set (False)."""
        log.info("waiting for the leader Lease %s/%s as %s", self.namespace, self.name, self.identity)
        while not stop.is_set():
            try:
                if self.try_acquire_or_renew():
                    return True
            except ApiError as exc:
                log.warning("leader election: %s", exc)
            stop.wait(self.settings.retry_period_seconds)
        return False

    def renew_forever(self, stop: threading.Event, on_lost: Callable[[], None]) -> None:
        """Renew until ``stop``; call ``on_lost`` once the renew deadline passes without a renewal."""
        while not self._pause(self.settings.retry_period_seconds) and not stop.is_set():
            try:
                renewed = self.try_acquire_or_renew()
            except ApiError as exc:
                log.warning("leader election: renew failed: %s", exc)
                renewed = False
            if not renewed and self._clock() - self._last_renew > self.settings.renew_deadline_seconds:
                self.leading = False
                if self.metrics is not None:
                    self.metrics.leader.set(0)
                log.error("lost the leader Lease %s/%s: stopping", self.namespace, self.name)
                on_lost()
                return

    def start_renewing(self, stop: threading.Event, on_lost: Callable[[], None]) -> threading.Thread:
        """Renew in a daemon thread."""
        thread = threading.Thread(target=self.renew_forever, args=(stop, on_lost), name="lease-renew", daemon=True)
        self._renewer = thread
        thread.start()
        return thread

    def release(self) -> None:
        """Hand the Lease back (holder cleared), so a standby takes over at once.

        The renewals stop first: a renewal racing the release would take the Lease back for a
        process that is on its way out, and the standby would wait out the whole lease duration.
        """
        self._renewing.set()
        if self._renewer is not None:
            self._renewer.join(timeout=self.settings.renew_deadline_seconds)
        if not self.leading:
            return
        self.leading = False
        if self.metrics is not None:
            self.metrics.leader.set(0)
        try:
            lease = self.client.get("Lease", self.namespace, self.name)
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            spec = {**lease["spec"], "holderIdentity": "", "leaseDurationSeconds": 1, "renewTime": micro_time()}
            self.client.replace("Lease", self.namespace, self.name, self._lease(spec, lease))
            log.info("released the leader Lease %s/%s", self.namespace, self.name)
        except ApiError as exc:
            log.warning("could not release the leader Lease: %s", exc)
