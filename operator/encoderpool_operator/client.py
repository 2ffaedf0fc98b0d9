"""The operator's door to the API server: the official (synchronous) Kubernetes client.

Only this module and the handler module import a Kubernetes library. Everything is plain dicts
in the API's own JSON shape, so the pure builders and the status function never see client
model classes. Every client exception leaves as one of the operator's own errors.

Calls block; the engine runs them in worker threads (``asyncio.to_thread``).
"""

from __future__ import annotations

import json
import logging
import os
from datetime import datetime, timezone
from typing import Any

import kubernetes.client
import kubernetes.config
import urllib3

from encoderpool_operator import errors, names
from encoderpool_operator.conditions import Event, rfc3339
from encoderpool_operator.metrics import OperatorMetrics

log = logging.getLogger(__name__)

# kind -> (API prefix, plural). Only the kinds the operator touches.
RESOURCES: dict[str, tuple[str, str]] = {
    "StatefulSet": ("/apis/apps/v1", "statefulsets"),
    "Service": ("/api/v1", "services"),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets"),
    "HorizontalPodAutoscaler": ("/apis/autoscaling/v2", "horizontalpodautoscalers"),
    "Pod": ("/api/v1", "pods"),
    "Event": ("/api/v1", "events"),
    "Lease": ("/apis/coordination.k8s.io/v1", "leases"),
    names.KIND: (f"/apis/{names.API_VERSION}", names.PLURAL),
}
# Concurrent reconciles share one connection pool; urllib3's default of 4 would drop connections.
CONNECTION_POOL_SIZE = 32

APPLY = "application/apply-patch+yaml"  # JSON is YAML: the body is sent as JSON
MERGE = "application/merge-patch+json"


def resource_path(kind: str, namespace: str | None, name: str | None = None, sub: str | None = None) -> str:
    """The REST path of a collection or object."""
    prefix, plural = RESOURCES[kind]
    path = f"{prefix}/namespaces/{namespace}/{plural}" if namespace else f"{prefix}/{plural}"
    if name:
        path += f"/{name}"
    if sub:
        path += f"/{sub}"
    return path


def _status_message(body: Any) -> str:
    """The message of a metav1.Status error body, else the raw body."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body or "")
    try:
        return str(json.loads(text).get("message") or text)
    except (ValueError, AttributeError):
        return text


def translate(exc: BaseException, verb: str, resource: str) -> errors.ApiError:
    """A client-library or transport exception as one of the operator's errors."""
    if isinstance(exc, kubernetes.client.ApiException):
        status = int(exc.status or 0)
        message = f"{verb} {resource}: HTTP {status}: {_status_message(exc.body)}"
        kind: type[errors.ApiError] = errors.UnavailableError
        if status == 404:
            kind = errors.NotFoundError
        elif status == 409:
            kind = errors.ConflictError
        elif status in (401, 403):
            kind = errors.ForbiddenError
        elif status in (400, 422):
            kind = errors.RejectedError
        return kind(message, status=status, verb=verb, resource=resource)
    return errors.UnavailableError(f"{verb} {resource}: {type(exc).__name__}: {exc}", verb=verb, resource=resource)


def load_configuration() -> kubernetes.client.Configuration:
    """In-cluster config in a pod, else $KUBECONFIG / ~/.kube/config; never the global default."""
    config = kubernetes.client.Configuration()
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        kubernetes.config.load_incluster_config(client_configuration=config)
    else:
        kubernetes.config.load_kube_config(client_configuration=config, persist_config=False)
    config.connection_pool_maxsize = CONNECTION_POOL_SIZE
    return config


def resource_of(path: str) -> tuple[str, bool]:
    """(resource, is a collection) of a REST path: ('statefulsets', False), ('encoderpools/status', False)."""
    parts = [p for p in path.split("/") if p]
    if "namespaces" in parts and len(parts) > parts.index("namespaces") + 2:
        parts = parts[parts.index("namespaces") + 2:]
    else:
        parts = parts[2:] if parts[:1] == ["api"] else parts[3:]
    if not parts:
        return "unknown", True
    return parts[0] + (f"/{parts[2]}" if len(parts) > 2 else ""), len(parts) == 1


class KubeClient:
    """Plain-dict CRUD, server-side apply and events against one API server."""

    def __init__(self, api: kubernetes.client.ApiClient, *, field_manager: str, timeout: float,
                 metrics: OperatorMetrics | None = None) -> None:
        self._api = api
        self._field_manager = field_manager
        self._timeout = timeout
        self._metrics = metrics

    @classmethod
    def from_environment(cls, *, field_manager: str, timeout: float,
                         metrics: OperatorMetrics | None = None) -> "KubeClient":
        """A client configured like kubectl (or from the pod's ServiceAccount)."""
        return cls(kubernetes.client.ApiClient(load_configuration()), field_manager=field_manager, timeout=timeout,
                   metrics=metrics)

    @property
    def verifies_tls(self) -> bool:
        """Whether the API server's certificate is checked."""
        return bool(self._api.configuration.verify_ssl)

    def close(self) -> None:
        """Release the connection pool."""
        self._api.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> Any:
        """One HTTP request; the decoded JSON answer, or an :class:`errors.ApiError`."""
        headers = {"Accept": "application/json", "Content-Type": content_type}
        if self._metrics is not None:
            resource, collection = resource_of(path)
            verb = "LIST" if method == "GET" and collection else method
            self._metrics.api_request(verb, resource, dry_run=(query or {}).get("dryRun") == "All")
        try:
            serialized = self._api.param_serialize(
                method=method,
                resource_path=path,
                query_params=list((query or {}).items()),
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            response = self._api.call_api(*serialized, _request_timeout=self._timeout)
            data = response.read()
            if not 200 <= response.status <= 299:
                raise kubernetes.client.ApiException(status=response.status, reason=response.reason, body=data)
        except (kubernetes.client.ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
            raise translate(exc, method, path) from None
        return json.loads(data) if data else None

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """An object, or None when it does not exist."""
        try:
            return self.request("GET", resource_path(kind, namespace, name))
        except errors.NotFoundError:
            return None

    def get_pool(self, namespace: str, name: str) -> dict[str, Any] | None:
        """An EncoderPool, or None."""
        return self.get(names.KIND, namespace, name)

    def list_pools(self, namespace: str | None) -> list[dict[str, Any]]:
        """All EncoderPools in one namespace, or in all of them (None)."""
        return list(self.request("GET", resource_path(names.KIND, namespace)).get("items") or [])

    def serves_pools(self) -> bool:
        """Whether the API server serves EncoderPools yet (its discovery lists them; 404 before the
        CRD is established)."""
        try:
            found = self.request("GET", f"/apis/{names.API_VERSION}")
        except errors.NotFoundError:
            return False
        return any(r.get("name") == names.PLURAL for r in (found or {}).get("resources") or [])

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        """Pods matching a label selector."""
        found = self.request("GET", resource_path("Pod", namespace), query={"labelSelector": selector})
        return list(found.get("items") or [])

    def apply(self, manifest: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        """Server-side apply under the operator's field manager, forcing ownership of its fields.

        force: a person who hand-edits a field the operator owns loses it to the spec (drift is
        undone); fields the operator does not set stay theirs. ``dry_run``: validated and admitted
        by the API server, nothing stored.
        """
        meta = manifest["metadata"]
        path = resource_path(manifest["kind"], meta.get("namespace"), meta["name"])
        query = {"fieldManager": self._field_manager, "force": "true"}
        if dry_run:
            query["dryRun"] = "All"
        return dict(self.request("PATCH", path, query=query, body=manifest, content_type=APPLY))

    def create(self, kind: str, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST a new object."""
        return dict(self.request("POST", resource_path(kind, namespace), body=body))

    def replace(self, kind: str, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """PUT an object (optimistic concurrency through its resourceVersion)."""
        return dict(self.request("PUT", resource_path(kind, namespace, name), body=body))

    def delete(self, kind: str, namespace: str, name: str, uid: str) -> None:
        """Delete one object, only if it is still the one we saw (uid precondition)."""
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}, "propagationPolicy": "Background"}
        self.request("DELETE", resource_path(kind, namespace, name), body=body)

    def patch_pool_status(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """JSON-merge-patch the status subresource."""
        path = resource_path(names.KIND, namespace, name, "status")
        return dict(self.request("PATCH", path, body=patch, content_type=MERGE))

    def post_event(self, obj: dict[str, Any], event: Event) -> None:
        """A core/v1 Event about ``obj``; a failure is logged, never raised (events are best effort)."""
        meta = obj.get("metadata") or {}
        now = rfc3339(datetime.now(timezone.utc))
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta.get('name', 'pool')}.", "namespace": meta.get("namespace")},
            "involvedObject": {
                "apiVersion": obj.get("apiVersion", names.API_VERSION),
                "kind": obj.get("kind", names.KIND),
                "name": meta.get("name"),
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "type": event.type,
            "reason": event.reason,
            "message": event.message[:1024],
            "source": {"component": names.OPERATOR_NAME},
            "reportingComponent": names.OPERATOR_NAME,
            "reportingInstance": os.environ.get("HOSTNAME", names.OPERATOR_NAME),
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self.request("POST", resource_path("Event", meta.get("namespace")), body=body)
        except errors.ApiError as exc:
            log.warning("could not post event %s on %s: %s", event.reason, meta.get("name"), exc)
