"""Write the admin kubeconfig of a local cluster (CA embedded so the file stands alone)."""

from __future__ import annotations

import base64
from pathlib import Path

import yaml

CONTEXT = "encoderpool-e2e"


def kubeconfig_dict(server: str, ca_cert: Path, token: str, user: str = "admin") -> dict:
    """A one-cluster, one-user, one-context kubeconfig as a dict."""
    ca_data = base64.b64encode(ca_cert.read_bytes()).decode()
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CONTEXT, "cluster": {"server": server, "certificate-authority-data": ca_data}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": CONTEXT, "context": {"cluster": CONTEXT, "user": user, "namespace": "default"}}],
        "current-context": CONTEXT,
    }


def write_kubeconfig(path: Path, server: str, ca_cert: Path, token: str, user: str = "admin") -> Path:
    """Write a kubeconfig (mode 0600: it holds a bearer token) and return its path."""
    path.write_text(yaml.safe_dump(kubeconfig_dict(server, ca_cert, token, user), sort_keys=False))
    path.chmod(0o600)
    return path
