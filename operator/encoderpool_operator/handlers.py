"""kopf wiring: thin handlers that hand every cause to the engine, and the kopf settings.

Handlers are registered on a registry built at run time (never kopf's global default registry
at import), so importing this module has no side effects and tests can build their own.

Why no finalizer: children are deleted by garbage collection through their ownerReferences.
kopf's own timers would add a finalizer to every pool (so that deleting a pool would hang while
the operator is down); the periodic resync is therefore the engine's own task, not a kopf timer.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf
import urllib3

from encoderpool_operator import errors, names
from encoderpool_operator.client import KubeClient
from encoderpool_operator.engine import Engine
from encoderpool_operator.reconcile import Outcome
from encoderpool_operator.settings import OperatorSettings

log = logging.getLogger(__name__)

# The children and pods the operator watches: (group, version, plural). Events on them nudge the
# owning pool, so a deleted or hand-edited child is restored at once, and status follows pods.
WATCHED_CHILDREN = (
    ("apps", "v1", "statefulsets"),
    ("", "v1", "services"),
    ("policy", "v1", "poddisruptionbudgets"),
    ("", "v1", "pods"),
)
FORBIDDEN_RETRY_SECONDS = 60.0
# The StatefulSet controller usually observes a write within a second: look once more before
# handing the wait to kopf, whose retry is logged as an error.
SETTLE_SECONDS = 1.0


def to_kopf(exc: errors.OperatorError, settings: OperatorSettings) -> Exception:
    """The one place where the operator's errors become kopf's retry semantics."""
    if not exc.retryable:
        return kopf.PermanentError(str(exc))
    if isinstance(exc, errors.ForbiddenError):
        # Usually RBAC (someone has to fix the ClusterRole), sometimes a terminating namespace:
        # either way a quick retry cannot help.
        return kopf.TemporaryError(f"forbidden (check the operator's RBAC): {exc}", delay=FORBIDDEN_RETRY_SECONDS)
    return kopf.TemporaryError(str(exc), delay=settings.wait_seconds)


def raise_for(outcome: Outcome, settings: OperatorSettings) -> None:
    """Tell kopf how a reconcile of a create/update/resume went (returning = done)."""
    if outcome.failed:
        # kopf stops retrying; the next spec change (an update) runs the handler again.
        raise kopf.PermanentError(outcome.failed)
    if outcome.waiting:
        raise kopf.TemporaryError(outcome.waiting, delay=settings.wait_seconds)


def kopf_settings(settings: OperatorSettings) -> kopf.OperatorSettings:
    """kopf's settings: our annotation prefix, quiet event posting, request timeouts."""
    ks = kopf.OperatorSettings()
    ks.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=names.GROUP)
    ks.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=names.GROUP, key="last-handled-configuration"
    )
    # kopf posts "Handler succeeded" Events at INFO; the pool's own Events carry the meaning.
    ks.posting.level = logging.WARNING
    ks.networking.request_timeout = settings.request_timeout_seconds
    return ks


def build_registry(engine: Engine) -> kopf.OperatorRegistry:
    """All handlers, bound to one engine."""
    registry = kopf.OperatorRegistry()
    settings = engine.settings
    # Same credentials as client.KubeClient: in-cluster ServiceAccount, else the kubeconfig.
    kopf.on.login(registry=registry)(kopf.login_via_client)

    async def reconcile_pool(namespace: str, name: str, **_: Any) -> None:
        try:
            outcome = await engine.reconcile(namespace, name)
            if outcome.waiting:
                await asyncio.sleep(SETTLE_SECONDS)
                outcome = await engine.reconcile(namespace, name)
        except errors.OperatorError as exc:
            raise to_kopf(exc, settings) from exc
        raise_for(outcome, settings)
        # Nothing is returned: kopf would store a return value under status.

    for cause in (kopf.on.create, kopf.on.update, kopf.on.resume):
        cause(names.GROUP, names.VERSION, names.PLURAL, id="reconcile", registry=registry)(reconcile_pool)

    async def child_changed(body: kopf.Body, namespace: str, **_: Any) -> None:
        pool = (body.get("metadata", {}).get("labels") or {}).get(names.POOL_LABEL)
        if pool:
            await engine.nudge(namespace, pool)

    for group, version, plural in WATCHED_CHILDREN:
        kopf.on.event(
            group, version, plural,
            labels={names.MANAGED_BY_LABEL: names.OPERATOR_NAME},
            id=f"child-{plural}",
            registry=registry,
        )(child_changed)

    @kopf.on.startup(registry=registry)
    async def start_resync(**_: Any) -> None:
        engine.start()

    @kopf.on.cleanup(registry=registry)
    async def stop_resync(**_: Any) -> None:
        await engine.stop()

    @kopf.on.probe(id="lastResync", registry=registry)
    def last_resync(**_: Any) -> str | None:
        return engine.last_resync.isoformat() if engine.last_resync else None

    return registry


def run(settings: OperatorSettings) -> None:
    """Run the operator until interrupted (blocking)."""
    kopf.configure(verbose=settings.log_level == "debug", log_format=kopf.LogFormat.FULL)
    logging.getLogger().setLevel(settings.log_level.upper())
    if settings.log_level != "debug":
        # kopf logs every child watch event's handler at INFO; our own log says what changed.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    client = KubeClient.from_environment(field_manager=settings.field_manager, timeout=settings.request_timeout_seconds)
    if not client.verifies_tls:
        # Said once here instead of by urllib3 on every request.
        log.warning("the kubeconfig disables TLS verification of the API server")
        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
    engine = Engine(client, settings)
    liveness = f"http://0.0.0.0:{settings.liveness_port}/healthz" if settings.liveness_port else None
    log.info("encoderpool-operator starting: %s", settings.model_dump(mode="json"))
    try:
        kopf.run(
            registry=build_registry(engine),
            settings=kopf_settings(settings),
            # One replica with the Recreate strategy: kopf has no leader election, and peering
            # would need its own CRDs for no gain at one replica.
            standalone=True,
            clusterwide=settings.clusterwide,
            namespaces=settings.namespaces,
            liveness_endpoint=liveness,
        )
    finally:
        client.close()
