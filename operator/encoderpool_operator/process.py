"""The operator process: its HTTP endpoint, leader election, then kopf until stopped.

Every replica serves /healthz and /metrics at once. With leader election (the default), a
replica waits as a standby until it holds the Lease, and only then starts kopf (watches,
caches, reconciles); a standby does nothing else, so two replicas never both write. A leader
that loses the Lease stops kopf and exits (its Deployment restarts it as a standby); one that is
stopped releases the Lease on the way out.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import uuid

import kopf
import urllib3

from encoderpool_operator.client import KubeClient
from encoderpool_operator.engine import Engine
from encoderpool_operator.handlers import WatchCache, build_registry, kopf_settings
from encoderpool_operator.leader import LeaderElector
from encoderpool_operator.metrics import OperatorMetrics
from encoderpool_operator.serving import StatusServer
from encoderpool_operator.settings import OperatorSettings

log = logging.getLogger(__name__)
# After losing the Lease, kopf gets this long to stop before the process exits regardless.
LOST_LEASE_EXIT_SECONDS = 5.0
LOST_LEASE_EXIT_CODE = 1


def identity(settings: OperatorSettings) -> str:
    """This replica's name in the Lease: the pod name plus a suffix unique to this process."""
    if settings.identity:
        return settings.identity
    return f"{os.environ.get('HOSTNAME', 'encoderpool-operator')}_{uuid.uuid4().hex[:8]}"


def lease_namespace(settings: OperatorSettings) -> str:
    """The Lease's namespace: as set, else the pod's own (downward API), else the first watched one."""
    return (settings.lease_namespace or os.environ.get("POD_NAMESPACE", "")
            or (settings.namespaces[0] if settings.namespaces else "default"))


def _exit_soon() -> None:
    """Stop kopf, and leave for good if it has not stopped in time: a replica without the Lease must not act.

    kopf is stopped the way a kubelet stops it, by SIGTERM to this process: kopf's stop flags
    (threading.Event, concurrent Future) each park an executor thread that never returns when kopf
    stops for another reason, which then holds up the interpreter's exit.
    """
    timer = threading.Timer(LOST_LEASE_EXIT_SECONDS, os._exit, args=(LOST_LEASE_EXIT_CODE,))
    timer.daemon = True
    timer.start()
    os.kill(os.getpid(), signal.SIGTERM)


def run_kopf(settings: OperatorSettings, client: KubeClient, metrics: OperatorMetrics) -> None:
    """kopf with the engine and the watch cache, until a signal stops it."""
    cache = WatchCache()
    engine = Engine(client, settings, snapshot=cache.snapshot, metrics=metrics)
    kopf.run(
        registry=build_registry(engine, cache),
        settings=kopf_settings(settings),
        # No kopf peering: leader election (above kopf) makes sure only one replica runs it.
        standalone=True,
        clusterwide=settings.clusterwide,
        namespaces=settings.namespaces,
    )


def run(settings: OperatorSettings) -> None:
    """Run the operator until interrupted (blocking)."""
    kopf.configure(verbose=settings.log_level == "debug", log_format=kopf.LogFormat.FULL)
    logging.getLogger().setLevel(settings.log_level.upper())
    if settings.log_level != "debug":
        # kopf logs every child watch event's handler at INFO; our own log says what changed.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    metrics = OperatorMetrics()
    client = KubeClient.from_environment(field_manager=settings.field_manager,
                                         timeout=settings.request_timeout_seconds, metrics=metrics)
    if not client.verifies_tls:
        # Said once here instead of by urllib3 on every request.
        log.warning("the kubeconfig disables TLS verification of the API server")
        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
    standby_stop, lost = threading.Event(), threading.Event()
    elector = (LeaderElector(client, settings, identity(settings), lease_namespace(settings), metrics)
               if settings.leader_election else None)
    server = StatusServer(settings.liveness_port, metrics, healthy=lambda: not lost.is_set()) \
        if settings.liveness_port else None
    log.info("encoderpool-operator starting: %s", settings.model_dump(mode="json"))
    try:
        if server is not None:
            server.start()
        if elector is not None:
            if not elector.acquire(standby_stop):
                return

            def on_lost() -> None:
                lost.set()
                _exit_soon()

            elector.start_renewing(standby_stop, on_lost=on_lost)
        else:
            metrics.leader.set(1)
        run_kopf(settings, client, metrics)
    finally:
        standby_stop.set()  # ends the renewals
        if elector is not None and not lost.is_set():
            elector.release()
        if server is not None:
            server.close()
        client.close()
    if lost.is_set():
        sys.exit(LOST_LEASE_EXIT_CODE)
