"""Bad input gets a clear 4xx naming the field or item, and never harms a good neighbour."""

from __future__ import annotations

import base64
import io
import os
import struct
import zlib
from pathlib import Path

import httpx
import pytest
from PIL import Image

from tests.integration.encode_client import encode, encode_concurrently
from tests.support.media_host import MediaHost
from testkit.media import png_data_uri
from testkit.server import EncoderServer

pytestmark = pytest.mark.integration


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _png_bytes(w: int, h: int) -> bytes:
    return base64.b64decode(png_data_uri(w, h).split(",", 1)[1])


def _header_bomb(w: int = 20000, h: int = 20000) -> bytes:
    """A PNG whose header declares w x h pixels but carries almost no data."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b"")


GOOD = png_data_uri(64, 64)

# name -> (body fields replacing the defaults, expected status, words the message must contain)
MATRIX = {
    "missing modality": ({"modality": None}, 400, ["modality", "required"]),
    "unknown modality": ({"modality": "TEXT"}, 400, ["modality", "IMAGE"]),
    "audio to a vision model": ({"modality": "AUDIO"}, 400, ["modality", "not supported"]),
    "empty items": ({"mm_items": []}, 400, ["mm_items", "empty"]),
    "non-list items": ({"mm_items": "abc"}, 400, ["mm_items", "list"]),
    "non-string item": ({"mm_items": [42]}, 400, ["mm_items[0]"]),
    "bad base64": ({"mm_items": [GOOD, "@@@ not base64 @@@"]}, 400, ["mm_items[1]", "base64"]),
    "not an image": ({"mm_items": [_b64(b"hello, this is certainly not an image file")]}, 400, ["mm_items[0]", "not a decodable image"]),
    "truncated png": ({"mm_items": [_b64(_png_bytes(128, 128)[:300])]}, 400, ["mm_items[0]", "truncated"]),
    "header bomb": ({"mm_items": [_b64(_header_bomb())]}, 400, ["mm_items[0]", "pixels"]),
    "url to a loopback host": ({"mm_items": ["http://127.0.0.1:9/x.png"]}, 400, ["mm_items[0]", "loopback", "ALLOWED_MEDIA_DOMAINS"]),
    "url to cloud metadata": ({"mm_items": ["http://169.254.169.254/latest"]}, 400, ["mm_items[0]", "link-local"]),
    "malformed content_hash": ({"mm_items": [{"url": GOOD, "content_hash": "sha256:xyz"}]}, 400, ["mm_items[0]", "content_hash"]),
    "content_hash mismatch": ({"mm_items": [GOOD, {"url": GOOD, "content_hash": "sha256:" + "0" * 64}]}, 400,
                              ["mm_items[1]", "content hash mismatch"]),
    "file path when refused": ({"mm_items": ["/etc/passwd"]}, 400, ["mm_items[0]", "ALLOWED_LOCAL_MEDIA_PATH"]),
    "part_idx >= num_parts": ({"num_parts": 2, "part_idx": 2}, 400, ["part_idx"]),
    "negative num_parts": ({"num_parts": -1}, 400, ["num_parts"]),
    "missing req_id": ({"req_id": None}, 400, ["req_id"]),
    "bad port": ({"embedding_port": "x", "prefill_host": "127.0.0.1"}, 400, ["embedding_port"]),
}


@pytest.fixture(scope="module")
def server(tiny_model):
    env = {"ENCODER_MAX_WAIT_MS": "200", "ENCODER_MAX_REQUEST_BYTES": str(2 * 1024 * 1024)}
    with EncoderServer(tiny_model("qwen2_vl"), env=env) as srv:
        yield srv


def test_bad_input_matrix_with_good_neighbours(server):
    """Every bad request is answered with its code and message while good ones in flight succeed."""
    names = list(MATRIX)
    bodies = []
    for i, name in enumerate(names):
        fields, _, _ = MATRIX[name]
        body = {"req_id": f"bad-{i}", "modality": "IMAGE", "mm_items": [GOOD], **fields}
        bodies.append({k: v for k, v in body.items() if v is not None})
    goods = [{"req_id": f"good-{i}", "modality": "IMAGE", "mm_items": [png_data_uri(48, 80, seed=i)]} for i in range(3)]
    responses = encode_concurrently(server.base_url, bodies + goods)
    for name, resp in zip(names, responses):
        _, status, words = MATRIX[name]
        assert resp.status_code == status, (name, resp.text)
        body = resp.json()
        assert body["status"] == "error"
        for word in words:
            assert word in body["message"], (name, body["message"])
    for resp in responses[len(names):]:
        assert resp.status_code == 200, resp.text
    assert httpx.get(server.base_url + "/health", timeout=30).status_code == 200


def test_error_body_names_req_id(server):
    resp = encode(server.base_url, "named-1", ["@@@"])
    assert resp.status_code == 400
    assert resp.json()["req_id"] == "named-1"


def test_oversized_body_is_413(server):
    big = png_data_uri(8, 8) + "A" * (3 * 1024 * 1024)
    resp = encode(server.base_url, "big", [big])
    assert resp.status_code == 413
    assert "ENCODER_MAX_REQUEST_BYTES" in resp.json()["message"]


@pytest.mark.parametrize("route", ["/scheduler_receive_url", "/start_profile"])
def test_oversized_control_body_is_413_naming_the_control_limit(server, route):
    """Control routes have a fixed 64 KiB limit: the 413 names it, not MAX_REQUEST_BYTES (which is
    2 MiB here, so a 1 MiB body would pass it), and an empty-body-allowed route is bounded too."""
    resp = httpx.post(server.base_url + route, content=b" " * (1024 * 1024), timeout=10)
    assert resp.status_code == 413, resp.text
    message = resp.json()["message"]
    assert "64 KiB limit of control routes" in message and "MAX_REQUEST_BYTES" not in message


def test_not_json_is_400(server):
    resp = httpx.post(server.base_url + "/encode", content=b"{not json", timeout=10)
    assert resp.status_code == 400
    assert "JSON" in resp.json()["message"]


def test_encode_takes_only_post_and_stays_documented(server):
    """/encode is served ahead of the app's router: other methods still get 405, and the OpenAPI
    document still describes its body and answers."""
    resp = httpx.get(server.base_url + "/encode", timeout=10)
    assert resp.status_code == 405 and resp.headers["allow"] == "POST"
    post = httpx.get(server.base_url + "/openapi.json", timeout=10).json()["paths"]["/encode"]["post"]
    assert post["requestBody"]["content"]["application/json"]["schema"]["required"] == ["req_id", "mm_items", "modality"]
    assert {"200", "400", "413", "503"} <= set(post["responses"])


def test_tiny_and_odd_images_get_an_answer(server):
    """A 1x1 image and a 3-pixel-wide strip are either encoded or refused with a clear 400."""
    for w, h in [(1, 1), (3, 500), (2, 2)]:
        resp = encode(server.base_url, f"odd-{w}x{h}", [png_data_uri(w, h)])
        assert resp.status_code in (200, 400), resp.text
        if resp.status_code == 400:
            assert "mm_items[0]" in resp.json()["message"]


@pytest.fixture()
def media_root(tmp_path):
    root = tmp_path / "media"
    root.mkdir()
    Image.open(io.BytesIO(_png_bytes(40, 40))).save(root / "ok.png")
    (tmp_path / "secret.png").write_bytes(_png_bytes(40, 40))
    os.symlink(tmp_path / "secret.png", root / "link.png")
    return root


def test_url_and_file_sources_follow_policy(tiny_model, media_root: Path):
    """Allowed host and allowed root work; other hosts, '..' and symlinks out are refused."""
    with MediaHost() as host:
        host.release()
        env = {
            "ENCODER_ALLOWED_MEDIA_DOMAINS": "127.0.0.1",  # loopback: the tests opt in by listing it
            "ENCODER_ALLOWED_LOCAL_MEDIA_PATH": str(media_root),
        }
        with EncoderServer(tiny_model("qwen2_vl"), env=env) as srv:
            ok = encode(srv.base_url, "url-ok", [host.base_url + "/img/50x40.png"])
            assert ok.status_code == 200, ok.text
            port = host.base_url.rsplit(":", 1)[1]
            other = encode(srv.base_url, "url-other", [f"http://localhost:{port}/img/50x40.png"])
            assert other.status_code == 400 and "ALLOWED_MEDIA_DOMAINS" in other.json()["message"]
            assert encode(srv.base_url, "file-ok", [str(media_root / "ok.png")]).status_code == 200
            assert encode(srv.base_url, "file-rel", ["file://ok.png"]).status_code == 200
            for i, path in enumerate([str(media_root / ".." / "secret.png"), str(media_root / "link.png"), "/etc/hostname"]):
                resp = encode(srv.base_url, f"file-bad-{i}", [path])
                assert resp.status_code == 400, (path, resp.text)
                assert "outside the allowed media directory" in resp.json()["message"]


def test_control_endpoints_refuse_bad_bodies(server):
    """Malformed bodies on the control endpoints are 400s naming the problem, never 500s."""
    bad_json = httpx.post(server.base_url + "/start_profile", content=b"{bad", timeout=10)
    assert bad_json.status_code == 400 and "JSON" in bad_json.json()["message"]
    not_object = httpx.post(server.base_url + "/scheduler_receive_url", json=[1], timeout=10)
    assert not_object.status_code == 400 and "JSON object" in not_object.json()["message"]
