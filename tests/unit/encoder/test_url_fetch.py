"""http(s) items: SGLang's allowed-media-domains rule, wildcards, the private-address guard, redirects, caps.

A real HTTP server on loopback plays the media host. Loopback is exactly what the guard refuses
by default, so the tests that fetch opt in explicitly (the host listed by exact address, or
ALLOW_PRIVATE_MEDIA_HOSTS).
"""

from __future__ import annotations

import base64
import hashlib
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import pytest

from encoder_pod.media.sources import MediaSources, SourceError
from encoder_pod.media.url_fetch import UrlPolicy
from encoder_pod.protocol import ItemSpec
from encoder_pod.settings import load_settings

pytestmark = pytest.mark.unit

BODY = b"\x89PNG-not-really-but-bytes" * 40


class _Host:
    def __init__(self) -> None:
        host = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                host.seen.append((self.path, self.headers.get("Host")))
                path, _, arg = self.path.partition("?")
                if path == "/img":
                    self._send(200, BODY)
                elif path == "/to":
                    self.send_response(302)
                    self.send_header("Location", arg)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                elif path == "/loop":
                    self.send_response(301)
                    self.send_header("Location", "/loop")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                elif path == "/chunked":
                    self.send_response(200)
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for _ in range(int(arg or "4")):
                        self.wfile.write(b"400\r\n" + b"x" * 1024 + b"\r\n")
                        self.wfile.flush()
                        time.sleep(float(host.drip))
                    self.wfile.write(b"0\r\n\r\n")
                else:
                    self._send(404, b"")

            def _send(self, code: int, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.seen: list[tuple[str, str | None]] = []
        self.drip = 0.0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"


@pytest.fixture(scope="module")
def media_host() -> Iterator[_Host]:
    host = _Host()
    yield host
    host.server.shutdown()
    host.server.server_close()


def _sources(max_bytes: int = 1 << 20, **env: str) -> MediaSources:
    return MediaSources(load_settings(env=env).media, max_bytes=max_bytes)


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:{port}/img", "http://localhost:{port}/img", "http://[::1]:{port}/img", "http://10.1.2.3/img",
    "http://169.254.169.254/latest/meta-data", "http://[::ffff:127.0.0.1]:{port}/img", "http://0.0.0.0:{port}/img",
])
def test_private_loopback_and_link_local_targets_are_refused_by_default(media_host, url):
    with pytest.raises(SourceError, match="private, loopback or link-local.*ALLOW_PRIVATE_MEDIA_HOSTS"):
        _sources().fetch(url.format(port=media_host.port))


def test_a_host_listed_by_exact_address_or_the_switch_lifts_the_guard(media_host):
    assert _sources(ENCODER_ALLOWED_MEDIA_DOMAINS="127.0.0.1").fetch(media_host.url("/img")) == BODY
    assert _sources(ENCODER_ALLOW_PRIVATE_MEDIA_HOSTS="true").fetch(media_host.url("/img", "localhost")) == BODY
    with pytest.raises(SourceError, match="not in ENCODER_ALLOWED_MEDIA_DOMAINS"):
        _sources(ENCODER_ALLOWED_MEDIA_DOMAINS="127.0.0.1").fetch(media_host.url("/img", "localhost"))
    with pytest.raises(SourceError, match="ENCODER_ALLOW_URL_FETCH"):
        _sources(ENCODER_ALLOWED_MEDIA_DOMAINS="127.0.0.1", ENCODER_ALLOW_URL_FETCH="false").fetch(media_host.url("/img"))


def test_the_connection_goes_to_the_checked_address_with_the_original_host_header(media_host):
    media_host.seen.clear()
    _sources(ENCODER_ALLOW_PRIVATE_MEDIA_HOSTS="true").fetch(media_host.url("/img", "localhost"))
    assert media_host.seen == [("/img", f"localhost:{media_host.port}")]


def test_domain_matching_is_sglangs_exact_rule_plus_wildcards():
    policy = UrlPolicy(load_settings(env={"ENCODER_ALLOWED_MEDIA_DOMAINS": "img.example,*.cdn.example"}).media)
    assert policy._allowed("img.example") and policy._allowed("a.cdn.example") and policy._allowed("x.y.cdn.example")
    for host in ["cdn.example", "sub.img.example", "evilcdn.example", "img.example.evil"]:
        assert not policy._allowed(host), host
    assert UrlPolicy(load_settings(env={}).media)._allowed("anything.example")  # empty list: any (public) host
    with pytest.raises(SourceError, match="'evil.example' is not in"):
        policy.check("https://EVIL.example./a.png")
    with pytest.raises(SourceError, match="not an http"):
        policy.check("ftp://img.example/a.png")


def test_redirects_are_followed_and_every_hop_is_checked_again(media_host):
    src = _sources(ENCODER_ALLOWED_MEDIA_DOMAINS="127.0.0.1")
    assert src.fetch(media_host.url("/to?/img")) == BODY  # relative Location, same host
    assert src.fetch(media_host.url("/to?" + media_host.url("/img"))) == BODY
    with pytest.raises(SourceError, match="'localhost' is not in"):
        src.fetch(media_host.url("/to?" + media_host.url("/img", "localhost")))
    guarded = _sources(ENCODER_ALLOWED_MEDIA_DOMAINS="127.0.0.1,*.example")  # a wildcard never lifts the guard
    with pytest.raises(SourceError, match="'10.1.2.3' is not in"):
        guarded.fetch(media_host.url("/to?http://10.1.2.3/img"))
    with pytest.raises(SourceError, match="redirected more than 5 times"):
        src.fetch(media_host.url("/loop"))


def test_size_cap_and_one_deadline_over_the_whole_fetch(media_host):
    src = _sources(max_bytes=100, ENCODER_ALLOWED_MEDIA_DOMAINS="127.0.0.1")
    with pytest.raises(SourceError, match="larger than 100"):
        src.fetch(media_host.url("/img"))  # declared by Content-Length
    with pytest.raises(SourceError, match="larger than 100"):
        src.fetch(media_host.url("/chunked?2"))  # counted while streaming
    media_host.drip = 0.4
    slow = _sources(ENCODER_ALLOWED_MEDIA_DOMAINS="127.0.0.1", ENCODER_URL_FETCH_TIMEOUT="1")
    started = time.monotonic()
    with pytest.raises(SourceError, match="took over 1s|timed out|Timeout"):
        slow.fetch(media_host.url("/chunked?20"))  # every chunk in time, the whole body not
    assert time.monotonic() - started < 5
    media_host.drip = 0.0


def test_content_hash_names_the_exact_bytes(media_host):
    src = _sources(ENCODER_ALLOWED_MEDIA_DOMAINS="127.0.0.1")
    good = "sha256:" + hashlib.sha256(BODY).hexdigest()
    assert src.fetch_item(ItemSpec(media_host.url("/img"), content_hash=good)) == BODY
    data_uri = "data:image/png;base64," + base64.b64encode(BODY).decode()
    assert src.fetch_item(ItemSpec(data_uri, content_hash=good)) == BODY  # the decoded payload is hashed
    with pytest.raises(SourceError, match="content hash mismatch: expected sha256:0+, got " + good):
        src.fetch_item(ItemSpec(media_host.url("/img"), content_hash="sha256:" + "0" * 64))
