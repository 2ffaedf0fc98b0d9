"""The Kubernetes client wrapper: exceptions become the operator's, requests have the right shape.

The wire-shape tests talk to a small HTTP server on loopback that records what it receives (a
stand-in for kube-apiserver, which runs for real in tests/e2e); they are integration tests.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import kubernetes.client
import pytest
import urllib3

from encoderpool_operator import errors
from encoderpool_operator.client import KubeClient, resource_path, translate
from encoderpool_operator.status import Event


@pytest.mark.unit
@pytest.mark.parametrize(
    ("status", "kind", "retryable"),
    [(404, errors.NotFoundError, True), (409, errors.ConflictError, True), (403, errors.ForbiddenError, True),
     (401, errors.ForbiddenError, True), (422, errors.RejectedError, False), (400, errors.RejectedError, False),
     (429, errors.UnavailableError, True), (500, errors.UnavailableError, True), (503, errors.UnavailableError, True)],
)
def test_api_exceptions_are_translated(status: int, kind: type, retryable: bool) -> None:
    body = json.dumps({"kind": "Status", "message": f"the server says {status}"})
    err = translate(kubernetes.client.ApiException(status=status, reason="x", body=body), "PATCH", "/api/v1/x")
    assert type(err) is kind and err.status == status and err.retryable is retryable
    assert f"the server says {status}" in str(err) and "PATCH /api/v1/x" in str(err)


@pytest.mark.unit
def test_transport_errors_are_unavailable() -> None:
    err = translate(urllib3.exceptions.MaxRetryError(None, "/x", "refused"), "GET", "/x")
    assert isinstance(err, errors.UnavailableError) and err.status == 0


@pytest.mark.unit
@pytest.mark.parametrize(
    ("args", "path"),
    [
        (("StatefulSet", "ml", "enc"), "/apis/apps/v1/namespaces/ml/statefulsets/enc"),
        (("Service", "ml", "enc"), "/api/v1/namespaces/ml/services/enc"),
        (("PodDisruptionBudget", "ml", "enc"), "/apis/policy/v1/namespaces/ml/poddisruptionbudgets/enc"),
        (("EncoderPool", "ml", "enc", "status"), "/apis/encoderpool.io/v1alpha1/namespaces/ml/encoderpools/enc/status"),
        (("EncoderPool", None), "/apis/encoderpool.io/v1alpha1/encoderpools"),
        (("Pod", "ml"), "/api/v1/namespaces/ml/pods"),
    ],
)
def test_resource_paths(args: tuple[Any, ...], path: str) -> None:
    assert resource_path(*args) == path


class Recorder(BaseHTTPRequestHandler):
    """Answers every request from a canned table and records it."""

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.server.seen.append(  # type: ignore[attr-defined]
            (self.command, self.path, self.headers.get("Content-Type"), self.headers.get("Authorization"), body))
        status, answer = self.server.answers.get((self.command, self.path.split("?")[0]), (404, {"message": "nope"}))  # type: ignore[attr-defined]
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_PATCH = do_POST = do_DELETE = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def stub() -> Iterator[tuple[ThreadingHTTPServer, KubeClient]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    server.seen, server.answers = [], {}  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    config = kubernetes.client.Configuration(host=f"http://127.0.0.1:{server.server_port}")
    config.api_key = {"BearerToken": "secret-token"}
    config.api_key_prefix = {"BearerToken": "Bearer"}
    client = KubeClient(kubernetes.client.ApiClient(config), field_manager="encoderpool-operator", timeout=5)
    yield server, client
    client.close()
    server.shutdown()
    server.server_close()


@pytest.mark.integration
def test_apply_is_a_forced_server_side_apply(stub: tuple[ThreadingHTTPServer, KubeClient]) -> None:
    server, client = stub
    path = "/apis/apps/v1/namespaces/ml/statefulsets/enc"
    server.answers[("PATCH", path)] = (200, {"kind": "StatefulSet", "metadata": {"name": "enc"}})  # type: ignore[attr-defined]
    manifest = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "enc", "namespace": "ml"}}
    assert client.apply(manifest)["kind"] == "StatefulSet"
    method, url, content_type, auth, body = server.seen[0]  # type: ignore[attr-defined]
    assert method == "PATCH" and content_type == "application/apply-patch+yaml"
    assert url == f"{path}?fieldManager=encoderpool-operator&force=true"
    assert auth == "Bearer secret-token" and json.loads(body) == manifest


@pytest.mark.integration
def test_status_is_merge_patched_on_the_subresource(stub: tuple[ThreadingHTTPServer, KubeClient]) -> None:
    server, client = stub
    path = "/apis/encoderpool.io/v1alpha1/namespaces/ml/encoderpools/enc/status"
    server.answers[("PATCH", path)] = (200, {"status": {"reason": "Ready"}})  # type: ignore[attr-defined]
    client.patch_pool_status("ml", "enc", {"status": {"reason": "Ready", "old": None}})
    _, url, content_type, _, body = server.seen[0]  # type: ignore[attr-defined]
    assert url == path and content_type == "application/merge-patch+json"
    assert json.loads(body) == {"status": {"reason": "Ready", "old": None}}


@pytest.mark.integration
def test_errors_and_absent_objects(stub: tuple[ThreadingHTTPServer, KubeClient]) -> None:
    server, client = stub
    assert client.get("Service", "ml", "missing") is None
    server.answers[("PATCH", "/api/v1/namespaces/ml/services/bad")] = (  # type: ignore[attr-defined]
        422, {"kind": "Status", "message": "Service \"bad\" is invalid: spec.ports[0].port: Invalid value: 0"})
    with pytest.raises(errors.RejectedError, match="spec.ports"):
        client.apply({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "bad", "namespace": "ml"}})
    server.answers[("GET", "/api/v1/namespaces/ml/pods")] = (403, {"message": "pods is forbidden"})  # type: ignore[attr-defined]
    with pytest.raises(errors.ForbiddenError, match="forbidden"):
        client.list_pods("ml", "encoderpool.io/pool=enc")


@pytest.mark.integration
def test_delete_carries_a_uid_precondition(stub: tuple[ThreadingHTTPServer, KubeClient]) -> None:
    server, client = stub
    path = "/apis/policy/v1/namespaces/ml/poddisruptionbudgets/enc"
    server.answers[("DELETE", path)] = (200, {"kind": "Status"})  # type: ignore[attr-defined]
    client.delete("PodDisruptionBudget", "ml", "enc", "uid-7")
    assert json.loads(server.seen[0][4])["preconditions"] == {"uid": "uid-7"}  # type: ignore[attr-defined]


@pytest.mark.integration
def test_events_are_posted_and_their_failure_is_swallowed(stub: tuple[ThreadingHTTPServer, KubeClient]) -> None:
    server, client = stub
    pool = {"apiVersion": "encoderpool.io/v1alpha1", "kind": "EncoderPool",
            "metadata": {"name": "enc", "namespace": "ml", "uid": "u1"}}
    server.answers[("POST", "/api/v1/namespaces/ml/events")] = (201, {"kind": "Event"})  # type: ignore[attr-defined]
    client.post_event(pool, Event("Warning", "Unschedulable", "0/3 nodes"))
    event = json.loads(server.seen[0][4])  # type: ignore[attr-defined]
    assert event["involvedObject"]["uid"] == "u1" and event["reason"] == "Unschedulable"
    assert event["type"] == "Warning" and event["metadata"]["namespace"] == "ml"
    server.answers[("POST", "/api/v1/namespaces/ml/events")] = (500, {"message": "etcd down"})  # type: ignore[attr-defined]
    client.post_event(pool, Event("Normal", "Ready", "ok"))  # no exception


@pytest.mark.integration
def test_an_unreachable_api_server_is_unavailable() -> None:
    config = kubernetes.client.Configuration(host="http://127.0.0.1:9")
    config.retries = 0
    client = KubeClient(kubernetes.client.ApiClient(config), field_manager="f", timeout=2)
    with pytest.raises(errors.UnavailableError):
        client.get_pool("ml", "enc")
    client.close()
