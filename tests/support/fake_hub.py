"""The Hugging Face hub's file endpoint, served from a local folder, and a real HF cache layout.

No hub is reachable from the test machines. :class:`FakeHub` speaks the part of the hub's HTTP API
that ``huggingface_hub.hf_hub_download`` uses (HEAD and GET of ``/<repo>/resolve/<rev>/<file>``,
with the ``X-Repo-Commit`` / ``ETag`` / ``X-Error-Code`` headers), so the pod's download code runs
for real, through the real library, against it; it records every file asked for.
:func:`write_hf_cache` lays a checkpoint out as ``huggingface_hub``'s cache does
(``models--org--name/{blobs,refs,snapshots}``), for the offline path.
"""

from __future__ import annotations

import hashlib
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterable

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".model")


def etag_of(name: str, data: bytes) -> str:
    """The hub's etag: sha256 of an LFS file, the git blob sha1 of any other."""
    if name.endswith(LFS_SUFFIXES):
        return hashlib.sha256(data).hexdigest()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def write_hf_cache(ckpt: Path, hub_cache: Path, repo_id: str, commit: str, branch: str = "main",
                   files: Iterable[str] | None = None) -> Path:
    """Snapshot ``files`` of ``ckpt`` (default: all) at ``commit`` with ``refs/<branch>``; returns the snapshot."""
    repo = hub_cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    for folder in (repo / "blobs", repo / "refs", snapshot):
        folder.mkdir(parents=True, exist_ok=True)
    chosen = sorted(files) if files is not None else sorted(p.name for p in ckpt.iterdir() if p.is_file())
    for name in chosen:
        data = (ckpt / name).read_bytes()
        blob = repo / "blobs" / etag_of(name, data)
        if not blob.exists():
            blob.write_bytes(data)
        link = snapshot / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(os.path.relpath(blob, snapshot))  # ../../blobs/<etag>, as huggingface_hub links
    (repo / "refs" / branch).write_text(commit)  # no trailing newline, as huggingface_hub writes it
    return snapshot


class FakeHub:
    """One repo (``repo_id`` at ``commit``, files of ``ckpt``) on a loopback HTTP server."""

    def __init__(self, ckpt: Path, repo_id: str, commit: str, token: str | None = None) -> None:
        self.ckpt, self.repo_id, self.commit, self.token = Path(ckpt), repo_id, commit, token
        self.requested: list[tuple[str, str]] = []
        """(method, file name) of every file request, in order."""
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        """The endpoint (``HF_ENDPOINT``)."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def downloaded(self) -> set[str]:
        """Files whose bytes were sent (GET answered 200)."""
        return {name for method, name in self.requested if method == "GET-200"}

    def __enter__(self) -> "FakeHub":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # quiet
                return

            def do_HEAD(self) -> None:  # noqa: N802 (http.server's naming)
                self._answer(body=False)

            def do_GET(self) -> None:  # noqa: N802
                self._answer(body=True)

            def _error(self, status: int, code: str) -> None:
                self.send_response(status)
                self.send_header("X-Error-Code", code)
                self.send_header("X-Error-Message", code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def _answer(self, body: bool) -> None:
                prefix = f"/{hub.repo_id}/resolve/"
                if not self.path.startswith(prefix):
                    return self._error(401, "RepoNotFound")
                if hub.token and self.headers.get("Authorization") != f"Bearer {hub.token}":
                    return self._error(401, "RepoNotFound")
                revision, _, name = self.path[len(prefix):].partition("/")
                if revision not in ("main", hub.commit):
                    return self._error(404, "RevisionNotFound")
                path = hub.ckpt / name
                if "/" in name or not path.is_file():
                    hub.requested.append(("HEAD-404" if not body else "GET-404", name))
                    return self._error(404, "EntryNotFound")
                data = path.read_bytes()
                hub.requested.append(("GET-200" if body else "HEAD", name))
                self.send_response(200)
                self.send_header("X-Repo-Commit", hub.commit)
                etag = etag_of(name, data)
                self.send_header("ETag", f'"{etag}"')
                if name.endswith(LFS_SUFFIXES):
                    self.send_header("X-Linked-Etag", f'"{etag}"')
                    self.send_header("X-Linked-Size", str(len(data)))
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if body:
                    self.wfile.write(data)

        return Handler
