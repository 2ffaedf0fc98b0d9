"""kopf wiring: thin handlers that hand every cause to the engine, the watch cache, kopf's settings.

Handlers are registered on a registry built at run time (never kopf's global default registry
at import), so importing this module has no side effects and tests can build their own.

The watch cache is kopf's indexes: one per child kind and one of pods, keyed by (namespace,
pool), filled from the same watches that nudge the engine. kopf starts calling handlers only
once every index has been listed, so a reconcile never sees a half-filled cache; reconciles
then read children and pods from memory instead of issuing a GET or LIST per event.

Why no finalizer: children are deleted by garbage collection through their ownerReferences.
kopf's own timers would add a finalizer to every pool (so that deleting a pool would hang while
the operator is down); the periodic resync is therefore the engine's own task, not a kopf timer.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf

from encoderpool_operator import errors, names, podstate
from encoderpool_operator.engine import Engine
from encoderpool_operator.reconcile import Outcome, Snapshot
from encoderpool_operator.settings import OperatorSettings

log = logging.getLogger(__name__)

# The children and pods the operator watches: kind -> (group, version, plural). Events on them
# nudge the owning pool, so a deleted or hand-edited child is restored at once, and status
# follows pods; their indexes are the watch cache reconciles read.
WATCHED: dict[str, tuple[str, str, str]] = {
    "StatefulSet": ("apps", "v1", "statefulsets"),
    "Service": ("", "v1", "services"),
    "PodDisruptionBudget": ("policy", "v1", "poddisruptionbudgets"),
    "HorizontalPodAutoscaler": ("autoscaling", "v2", "horizontalpodautoscalers"),
    "Pod": ("", "v1", "pods"),
}
FORBIDDEN_RETRY_SECONDS = 60.0


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
    """Tell kopf how a reconcile of a create/update/resume went (returning = done).

    Waiting for the StatefulSet controller is no retry: its status update is a watch event that
    nudges the pool again (and the resync backs that up), so a kopf retry would only repeat it.
    """
    if outcome.failed:
        # kopf stops retrying; the next spec change (an update) runs the handler again.
        raise kopf.PermanentError(outcome.failed)


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
    # Only the EncoderPool CRD is ours; other CRDs coming and going need not be watched (this
    # also spares a namespaced install a cluster-wide permission on CustomResourceDefinitions).
    ks.scanning.disabled = True
    return ks


def _any(handler: Any) -> Any:
    """A handler as kopf's decorators take it. kopf types each handler kind as a callback that
    declares every kwarg it may pass; ours take the few they use plus ``**_``, as kopf allows."""
    return handler


def index_name(kind: str) -> str:
    """The kopf index (and handler kwarg) name of a watched kind."""
    return f"encoderpool_{kind.lower()}s"


def _cached_child(body: kopf.Body) -> dict[str, Any]:
    """A child as the cache keeps it: everything but managedFields (large, and never read)."""
    meta = {k: v for k, v in dict(body.get("metadata") or {}).items() if k != "managedFields"}
    return {**dict(body), "metadata": meta}


class WatchCache:
    """Reads a pool's snapshot out of kopf's indexes (captured when the operator starts)."""

    def __init__(self) -> None:
        self.indices: dict[str, Any] = {}

    def snapshot(self, namespace: str, name: str) -> Snapshot:
        """The pool's children and pods as last seen by the watches."""
        def values(kind: str) -> list[dict[str, Any]]:
            store = self.indices[index_name(kind)].get((namespace, name))
            return list(store) if store is not None else []

        children = {kind: next(iter(values(kind)), None) for kind in WATCHED if kind != "Pod"}
        return Snapshot(children, values("Pod"))


def register_watches(registry: kopf.OperatorRegistry, engine: Engine) -> None:
    """Index every watched kind by pool; nudge the pool on every event."""
    selector = {names.MANAGED_BY_LABEL: names.OPERATOR_NAME}

    for kind, (group, version, plural) in WATCHED.items():
        def index(body: kopf.Body, namespace: str, name: str, labels: kopf.Labels, kind: str = kind,
                  **_: Any) -> dict[tuple[str, str], dict[str, Any]] | None:
            pool = labels.get(names.POOL_LABEL)
            if not pool or (kind != "Pod" and name != names.child_name(pool)):
                return None
            return {(namespace, pool): podstate.compact(dict(body)) if kind == "Pod" else _cached_child(body)}

        kopf.index(group, version, plural, labels=selector, id=index_name(kind), registry=registry)(_any(index))

        async def changed(labels: kopf.Labels, namespace: str, plural: str = plural, **_: Any) -> None:
            engine.cache_ready()
            engine.metrics.events.labels(plural).inc()
            pool = labels.get(names.POOL_LABEL)
            if pool:
                await engine.nudge(namespace, pool)

        kopf.on.event(group, version, plural, labels=selector, id=f"child-{plural}", registry=registry)(_any(changed))


def build_registry(engine: Engine, cache: WatchCache) -> kopf.OperatorRegistry:
    """All handlers, bound to one engine; ``cache`` receives kopf's indexes at startup (the
    engine reads its snapshots from it)."""
    registry = kopf.OperatorRegistry()
    settings = engine.settings
    # Same credentials as client.KubeClient: in-cluster ServiceAccount, else the kubeconfig.
    kopf.on.login(registry=registry)(kopf.login_via_client)
    register_watches(registry, engine)

    async def reconcile_pool(namespace: str, name: str, **_: Any) -> None:
        engine.cache_ready()
        try:
            outcome = await engine.reconcile(namespace, name)
        except errors.OperatorError as exc:
            raise to_kopf(exc, settings) from exc
        raise_for(outcome, settings)
        # Nothing is returned: kopf would store a return value under status.

    for cause in (kopf.on.create, kopf.on.update, kopf.on.resume):
        cause(names.GROUP, names.VERSION, names.PLURAL, id="reconcile", registry=registry)(_any(reconcile_pool))

    @kopf.on.startup(registry=registry)
    async def start_resync(**kwargs: Any) -> None:
        # kopf looks up which resources the API server serves once, right after the startup
        # handlers, and (scanning disabled) never again: a pool API not served yet (the operator
        # started before its CRD was established) would go unwatched for the process's life, and
        # the resync waits for a handler that would never run. So the start waits for it, and
        # retries any API error the same way (kopf retries a TemporaryError in a startup handler).
        try:
            served = await asyncio.to_thread(engine.client.serves_pools)
        except errors.ApiError as exc:
            raise kopf.TemporaryError(f"cannot tell whether {names.PLURAL} are served: {exc}",
                                      delay=settings.wait_seconds) from exc
        if not served:
            raise kopf.TemporaryError(f"the API server does not serve {names.PLURAL}.{names.GROUP}/"
                                      f"{names.VERSION} yet (is the CRD installed?)", delay=settings.wait_seconds)
        # kopf hands every handler its indexes (still empty at startup, filled by the watches).
        cache.indices.update({index_name(kind): kwargs[index_name(kind)] for kind in WATCHED})
        engine.start()

    @kopf.on.cleanup(registry=registry)
    async def stop_resync(**_: Any) -> None:
        await engine.stop()

    return registry
