"""A deliberately small Kubernetes REST client (httpx, bearer token, the cluster's CA).

The infrastructure talks plain REST instead of using the kubernetes package so that what it
sends is visible in one screen: paths, patch content types and watch parameters. Tests are free
to use kubectl or the kubernetes package on top of the same kubeconfig.
"""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

STRATEGIC_MERGE = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"


class ApiError(RuntimeError):
    """A non-2xx answer from the API server, with its status code and Status message."""

    def __init__(self, status_code: int, message: str, body: dict[str, Any] | None = None) -> None:
        super().__init__(f"HTTP {status_code}: {message}")
        self.status_code = status_code
        self.message = message
        self.body = body or {}


def path_for(api_version: str, plural: str, namespace: str | None = None, name: str | None = None) -> str:
    """REST path of a collection or object: ("v1", "pods", "ns", "x") -> /api/v1/namespaces/ns/pods/x."""
    root = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    scope = f"/namespaces/{namespace}" if namespace else ""
    return f"{root}{scope}/{plural}" + (f"/{name}" if name else "")


class ApiClient:
    """Thread-confined client: create one per thread (httpx pools are not shared across threads)."""

    def __init__(self, server: str, token: str | None, ca_file: Path, timeout: float = 30.0,
                 client_cert: tuple[str, str] | None = None) -> None:
        verify = ssl.create_default_context(cafile=str(ca_file))
        if client_cert is not None:  # kind's kubeconfig authenticates with a client certificate
            verify.load_cert_chain(*client_cert)
        self._http = httpx.Client(
            base_url=server,
            headers={"Authorization": f"Bearer {token}"} if token else {},
            verify=verify,
            timeout=httpx.Timeout(timeout, connect=5.0),
        )

    def close(self) -> None:
        """Close the connection pool; an in-flight watch in another thread then fails fast."""
        self._http.close()

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
                params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send one request; return the decoded JSON body or raise ApiError."""
        headers = {"Content-Type": content_type} if body is not None else {}
        content = json.dumps(body) if body is not None else None
        response = self._http.request(method, path, content=content, headers=headers, params=params)
        return _decode(response)

    def get(self, path: str, **params: Any) -> dict[str, Any]:
        """GET an object or a list."""
        return self.request("GET", path, params=params or None)

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST to a collection."""
        return self.request("POST", path, body)

    def patch(self, path: str, body: dict[str, Any], content_type: str = STRATEGIC_MERGE) -> dict[str, Any]:
        """PATCH (strategic merge by default)."""
        return self.request("PATCH", path, body, content_type)

    def delete(self, path: str, grace_period_seconds: int | None = None) -> dict[str, Any] | None:
        """DELETE; a missing object is not an error (deletes are idempotent here)."""
        body = None if grace_period_seconds is None else {"gracePeriodSeconds": grace_period_seconds}
        try:
            return self.request("DELETE", path, body)
        except ApiError as err:
            if err.status_code == 404:
                return None
            raise

    def get_or_none(self, path: str) -> dict[str, Any] | None:
        """GET, returning None for 404."""
        try:
            return self.get(path)
        except ApiError as err:
            if err.status_code == 404:
                return None
            raise

    def watch(self, path: str, resource_version: str, timeout_seconds: int,
              **params: Any) -> Iterator[dict[str, Any]]:
        """Yield watch events ({"type", "object"}) until the server closes the window."""
        query = {"watch": "true", "resourceVersion": resource_version,
                 "timeoutSeconds": timeout_seconds, "allowWatchBookmarks": "true", **params}
        timeout = httpx.Timeout(timeout_seconds + 10.0, connect=5.0)
        with self._http.stream("GET", path, params=query, timeout=timeout) as response:
            if response.status_code >= 400:
                response.read()
                _decode(response)
            for line in response.iter_lines():
                if line:
                    yield json.loads(line)


def _decode(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json() if response.content else {}
    except ValueError:
        body = {"message": response.text}
    if response.status_code >= 400:
        message = body.get("message", response.text) if isinstance(body, dict) else response.text
        raise ApiError(response.status_code, message, body if isinstance(body, dict) else None)
    return body


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    """Poll until ``predicate()`` returns something truthy; return it, or raise TimeoutError.

    Exceptions from the predicate count as "not yet" (the API server may still be starting); the
    last one is reported if the wait times out.
    """
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            result = predicate()
            if result:
                return result
        except (ApiError, httpx.HTTPError, OSError) as err:
            last_error = err
        if time.monotonic() >= deadline:
            suffix = f" (last error: {last_error})" if last_error else ""
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}{suffix}")
        time.sleep(interval)
