"""Throwaway credentials for one local cluster: a CA, the API server's serving cert, the
service-account signing key, a static admin token, and the aggregation layer's front-proxy CA
and client cert (kube-apiserver proxies API groups served by APIServices with it).

openssl (present on every machine of this kind) does the crypto, so the test venv needs no
``cryptography`` wheel. Everything is valid for two days and lives in the cluster's temp dir.
"""

from __future__ import annotations

import dataclasses
import secrets
import subprocess
from pathlib import Path

ADMIN_USER = "encoderpool-e2e-admin"
FRONT_PROXY_CLIENT = "front-proxy-client"

_SERVER_EXTENSIONS = """\
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid, issuer
subjectAltName = IP:127.0.0.1, DNS:localhost, DNS:kubernetes, DNS:kubernetes.default, \
DNS:kubernetes.default.svc, DNS:kubernetes.default.svc.cluster.local, IP:10.96.0.1
"""


@dataclasses.dataclass(frozen=True)
class Pki:
    """Paths of the generated files and the admin bearer token."""

    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    service_account_key: Path
    token_file: Path
    admin_token: str
    front_proxy_ca: Path
    proxy_client_cert: Path
    proxy_client_key: Path


def _openssl(*args: str | Path) -> None:
    """Run openssl quietly; on failure raise with its stderr (the only useful diagnostic)."""
    result = subprocess.run(["openssl", *map(str, args)], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {result.stderr.strip()}")


def create_pki(directory: Path) -> Pki:
    """Generate a CA, a serving cert for 127.0.0.1, an SA signing key and a token file."""
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(
        ca_cert=directory / "ca.crt",
        ca_key=directory / "ca.key",
        server_cert=directory / "apiserver.crt",
        server_key=directory / "apiserver.key",
        service_account_key=directory / "sa.key",
        token_file=directory / "tokens.csv",
        admin_token=secrets.token_hex(24),
        front_proxy_ca=directory / "front-proxy-ca.crt",
        proxy_client_cert=directory / "front-proxy-client.crt",
        proxy_client_key=directory / "front-proxy-client.key",
    )
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
             "-subj", "/CN=encoderpool-e2e-ca", "-keyout", pki.ca_key, "-out", pki.ca_cert)
    csr = directory / "apiserver.csr"
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=kube-apiserver",
             "-keyout", pki.server_key, "-out", csr)
    extensions = directory / "apiserver.ext"
    extensions.write_text(_SERVER_EXTENSIONS)
    _openssl("x509", "-req", "-in", csr, "-CA", pki.ca_cert, "-CAkey", pki.ca_key,
             "-CAcreateserial", "-days", "2", "-extfile", extensions, "-out", pki.server_cert)
    # One RSA key both signs (controller-manager, apiserver TokenRequest) and verifies SA tokens.
    _openssl("genrsa", "-out", pki.service_account_key, "2048")
    _front_proxy(directory, pki)
    # Static token auth: system:masters bypasses RBAC, which is what an admin kubeconfig means.
    pki.token_file.write_text(f'{pki.admin_token},{ADMIN_USER},{ADMIN_USER},"system:masters"\n')
    for path in (pki.ca_key, pki.server_key, pki.service_account_key, pki.token_file, pki.proxy_client_key):
        path.chmod(0o600)
    return pki


def _front_proxy(directory: Path, pki: Pki) -> None:
    """The aggregation layer's CA and the client cert kube-apiserver presents to extension servers."""
    ca_key = directory / "front-proxy-ca.key"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
             "-subj", "/CN=encoderpool-e2e-front-proxy-ca", "-keyout", ca_key, "-out", pki.front_proxy_ca)
    csr = directory / "front-proxy-client.csr"
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={FRONT_PROXY_CLIENT}",
             "-keyout", pki.proxy_client_key, "-out", csr)
    extensions = directory / "front-proxy-client.ext"
    extensions.write_text("basicConstraints = critical, CA:FALSE\nkeyUsage = critical, digitalSignature, "
                          "keyEncipherment\nextendedKeyUsage = clientAuth\n")
    _openssl("x509", "-req", "-in", csr, "-CA", pki.front_proxy_ca, "-CAkey", ca_key, "-CAcreateserial",
             "-days", "2", "-extfile", extensions, "-out", pki.proxy_client_cert)
    ca_key.chmod(0o600)
