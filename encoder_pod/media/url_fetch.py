"""Fetching http(s) items: SGLang's ``--allowed-media-domains`` rule, wildcards, and a private-address guard.

SGLang's rule (``utils/common.py``, the same in 0.5.19 .. 0.5.23): an empty list allows every
host; otherwise the URL's host, normalised (IDNA, lower case, canonical IPs, no trailing dot),
must equal an entry; the port is not part of it. Redirects are followed by hand, at most five,
and every hop is checked again; one deadline covers every hop and the body; the body is capped.

This pod adds two things. ``*.example.com`` entries match any subdomain of example.com (not the
name itself). And a guard SGLang does not have, on by default: a host must resolve only to
public addresses, so an item URL cannot reach the pod's loopback, the cluster's private network
or a cloud metadata endpoint (link-local). A host listed by its exact name or IP, or
ALLOW_PRIVATE_MEDIA_HOSTS, lifts the guard for it. The connection goes to the address that was
checked (the name is not resolved twice), with the original Host header and TLS server name.
Proxy variables are not used, for the same reason.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit, urlunsplit

import httpx

from encoder_pod.errors import MediaError
from encoder_pod.settings import MediaSettings, normalise_media_domain

MAX_REDIRECTS = 5
REDIRECT_CODES = frozenset({301, 302, 303, 307, 308})


class SourceError(MediaError):
    """The item's bytes cannot be had (refused source, bad base64, fetch failed); the message says why (400)."""


@dataclass(frozen=True)
class Target:
    """One hop, checked: where to connect and what to call the host."""

    url: str
    host: str
    address: str


def _public(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


class UrlPolicy:
    """Which http(s) URLs may be fetched, and the address each hop connects to."""

    def __init__(self, media: MediaSettings) -> None:
        self._exact = frozenset(d for d in media.allowed_media_domains if not d.startswith("*."))
        self._suffixes = tuple(d[1:] for d in media.allowed_media_domains if d.startswith("*."))
        self._private_ok = media.allow_private_media_hosts

    def _allowed(self, host: str) -> bool:
        if not self._exact and not self._suffixes:
            return True
        return host in self._exact or any(host.endswith(suffix) for suffix in self._suffixes)

    def check(self, url: str) -> Target:
        """The hop's target; SourceError when the scheme, the host or its addresses are not allowed."""
        try:
            parts = urlsplit(url)
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError as exc:
            raise SourceError(f"malformed URL ({exc})") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise SourceError(f"{url!r:.120} is not an http(s) URL with a host")
        try:
            host = normalise_media_domain(parts.hostname)
        except ValueError as exc:
            raise SourceError(f"malformed URL host ({exc})") from None
        if not self._allowed(host):
            raise SourceError(f"host {host!r} is not in ENCODER_ALLOWED_MEDIA_DOMAINS")
        address = self._resolve(host, port, guarded=not (self._private_ok or host in self._exact))
        return Target(url, host, address)

    @staticmethod
    def _resolve(host: str, port: int, guarded: bool) -> str:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as exc:
            raise SourceError(f"host {host!r} does not resolve ({exc})") from None
        addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
        if not addresses:
            raise SourceError(f"host {host!r} does not resolve")
        if guarded:
            private = [a for a in addresses if not _public(a)]
            if private:
                raise SourceError(
                    f"host {host!r} resolves to a private, loopback or link-local address ({private[0]}); list it in "
                    "ENCODER_ALLOWED_MEDIA_DOMAINS by its exact name or set ENCODER_ALLOW_PRIVATE_MEDIA_HOSTS to allow it"
                )
        return addresses[0]


def _pinned(target: Target) -> tuple[str, dict[str, str], dict[str, str]]:
    """The hop's URL with the checked address as host, its Host header, and the TLS server name."""
    parts = urlsplit(target.url)
    literal = f"[{target.address}]" if ":" in target.address else target.address
    netloc = f"{literal}:{parts.port}" if parts.port else literal
    host_header = parts.netloc.rpartition("@")[2]
    extensions = {"sni_hostname": target.host} if parts.scheme == "https" else {}
    return urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, "")), {"Host": host_header}, extensions


def fetch_url(url: str, policy: UrlPolicy, *, timeout: float, max_bytes: int) -> bytes:
    """The body of ``url`` under ``policy``: redirects followed and re-checked, one deadline, a size cap."""
    deadline = time.monotonic() + timeout
    current = url
    with httpx.Client(trust_env=False, follow_redirects=False) as client:
        for hop in range(MAX_REDIRECTS + 1):
            target = policy.check(current)
            pinned, headers, extensions = _pinned(target)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SourceError(f"fetching {url} took over {timeout:g}s (ENCODER_URL_FETCH_TIMEOUT)")
            try:
                request = client.build_request("GET", pinned, headers=headers, extensions=extensions, timeout=remaining)
                resp = client.send(request, stream=True)
                try:
                    location = resp.headers.get("location")
                    if resp.status_code in REDIRECT_CODES and location:
                        if hop == MAX_REDIRECTS:
                            raise SourceError(f"{url} redirected more than {MAX_REDIRECTS} times")
                        current = urljoin(current, location)
                        continue
                    if resp.status_code != 200:
                        raise SourceError(f"fetching {current} gave HTTP {resp.status_code}")
                    return _read_body(resp, current, deadline, timeout, max_bytes)
                finally:
                    resp.close()
            except httpx.HTTPError as exc:  # unreachable, timed out, reset: the URL's fault
                raise SourceError(f"fetching {current} failed ({type(exc).__name__}: {exc})") from None
    raise AssertionError("unreachable")


def _read_body(resp: httpx.Response, url: str, deadline: float, timeout: float, max_bytes: int) -> bytes:
    declared = resp.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise SourceError(f"{url} is {declared} bytes, larger than {max_bytes}")
    chunks, size = [], 0
    for chunk in resp.iter_bytes():
        size += len(chunk)
        if size > max_bytes:
            raise SourceError(f"{url} is larger than {max_bytes} bytes")
        if time.monotonic() > deadline:
            raise SourceError(f"fetching {url} took over {timeout:g}s (ENCODER_URL_FETCH_TIMEOUT)")
        chunks.append(chunk)
    return b"".join(chunks)
