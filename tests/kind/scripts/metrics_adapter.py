"""TEST-ONLY custom metrics API server (custom.metrics.k8s.io/v1beta2), for the autoscaling e2e tests.

It stands where prometheus-adapter or KEDA's metrics server stands in a real cluster: the
kube-apiserver's aggregation layer proxies the HPA controller's metric queries to it through an
APIService. Its values are not measured: the test sets them (``PUT /test/values`` with
``{"metric": value}``), and every pod matching the HPA's label selector reports that value.

It runs as a pod of the kind cluster behind a Service (tests/kind/test_autoscaling.py), serves
HTTPS with a throwaway self-signed certificate it is given (the APIService skips TLS verification;
test-only), and lists pods through the API server with its ServiceAccount's token. Nothing here
authenticates callers: never run it outside a throwaway test cluster.

    python metrics_adapter.py --port 6443 --cert-file tls.crt --key-file tls.key
"""

from __future__ import annotations

import argparse
import json
import ssl
import threading
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

import httpx

GROUP = "custom.metrics.k8s.io"
VERSION = "v1beta2"
METRICS = ("encoder_queue_depth", "encoder_inflight_requests")
SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


def discovery() -> dict[str, Any]:
    """The APIResourceList of the group version: one pods/<metric> resource per metric."""
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{GROUP}/{VERSION}",
            "resources": [{"name": f"pods/{m}", "singularName": "", "namespaced": True, "kind": "MetricValueList",
                           "verbs": ["get"]} for m in METRICS]}


def metric_values(namespace: str, pods: list[str], metric: str, value: str) -> dict[str, Any]:
    """A MetricValueList with ``value`` for every pod."""
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"kind": "MetricValueList", "apiVersion": f"{GROUP}/{VERSION}", "metadata": {},
            "items": [{"describedObject": {"kind": "Pod", "namespace": namespace, "name": pod, "apiVersion": "/v1"},
                       "metric": {"name": metric}, "timestamp": now, "windowSeconds": 30, "value": value}
                      for pod in pods]}


class Adapter:
    """The state of the server: the test's values and a client of the API server."""

    def __init__(self, server: str, token: str, ca_file: str) -> None:
        self.values: dict[str, str] = {m: "0" for m in METRICS}
        self.queries = 0
        self.lock = threading.Lock()
        self.api = httpx.Client(base_url=server, headers={"Authorization": f"Bearer {token}"},
                                verify=ssl.create_default_context(cafile=ca_file), timeout=10)

    def pods(self, namespace: str, selector: str) -> list[str]:
        """Names of the running pods matching a label selector."""
        found = self.api.get(f"/api/v1/namespaces/{namespace}/pods", params={"labelSelector": selector}).json()
        return [p["metadata"]["name"] for p in found.get("items", [])
                if not p["metadata"].get("deletionTimestamp") and p.get("status", {}).get("phase") == "Running"]

    def answer(self, path: str, query: dict[str, list[str]]) -> tuple[int, dict[str, Any]]:
        """(status, body) of a GET."""
        parts = [p for p in path.split("/") if p]
        if path in ("/apis", "/apis/"):
            return 200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": [{"name": GROUP, "versions": [
                {"groupVersion": f"{GROUP}/{VERSION}", "version": VERSION}],
                "preferredVersion": {"groupVersion": f"{GROUP}/{VERSION}", "version": VERSION}}]}
        if parts == ["apis", GROUP, VERSION]:
            return 200, discovery()
        if parts[:1] == ["openapi"]:
            return 200, {"swagger": "2.0", "info": {"title": "test metrics", "version": VERSION}, "paths": {}}
        # /apis/custom.metrics.k8s.io/v1beta2/namespaces/<ns>/pods/<name or *>/<metric>
        if len(parts) == 8 and parts[:3] == ["apis", GROUP, VERSION] and parts[3] == "namespaces" and parts[5] == "pods":
            namespace, name, metric = parts[4], parts[6], parts[7]
            if metric not in METRICS:
                return 404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404,
                             "message": f"metric {metric} not served"}
            selector = (query.get("labelSelector") or [""])[0]
            pods = self.pods(namespace, selector) if name == "*" else [name]
            with self.lock:
                self.queries += 1
                value = self.values[metric]
            return 200, metric_values(namespace, pods, metric, value)
        if path == "/test/values":
            with self.lock:
                return 200, {"values": dict(self.values), "queries": self.queries}
        return 404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404, "message": path}


def make_handler(adapter: Adapter) -> type[BaseHTTPRequestHandler]:
    """The HTTP handler class bound to one adapter."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            url = urlparse(self.path)
            # The HPA asks for pods/%2A/<metric>: "*" arrives percent-encoded.
            self._send(*adapter.answer(unquote(url.path), parse_qs(url.query)))

        def do_PUT(self) -> None:  # noqa: N802
            if urlparse(self.path).path != "/test/values":
                self._send(404, {"message": "not found"})
                return
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
            with adapter.lock:
                adapter.values.update({k: str(v) for k, v in body.items() if k in METRICS})
            self._send(200, {"values": adapter.values})

        def _send(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            print("metrics-adapter:", format % args, flush=True)

    return Handler


def main() -> None:
    """Serve until killed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=6443)
    parser.add_argument("--server", default="https://kubernetes.default.svc", help="the API server, to list pods")
    parser.add_argument("--token-file", default=f"{SERVICE_ACCOUNT}/token")
    parser.add_argument("--ca-file", default=f"{SERVICE_ACCOUNT}/ca.crt")
    parser.add_argument("--cert-file", required=True)
    parser.add_argument("--key-file", required=True)
    args = parser.parse_args()
    adapter = Adapter(args.server, Path(args.token_file).read_text().strip(), args.ca_file)
    httpd = ThreadingHTTPServer((args.host, args.port), make_handler(adapter))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(args.cert_file, args.key_file)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    print(f"metrics-adapter: serving {GROUP}/{VERSION} on {args.host}:{args.port}", flush=True)
    httpd.serve_forever()


if __name__ == "__main__":
    main()
