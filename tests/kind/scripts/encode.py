"""In-cluster client: POST one /encode to each URL given; print one JSON line with what came back.

    python encode.py http://qwen2-vl-cpu.NS.svc:30000 [URL...]

For each URL: the addresses its host name resolves to (the cluster's DNS), the HTTP status, and the
embedding's shape and dtype (or the error body).
"""

import json
import socket
import sys
from urllib.parse import urlparse

import httpx

PNG_B64 = ("iVBORw0KGgoAAAANSUhEUgAAACAAAAAgCAIAAAD8GO2jAAAAKklEQVR42u3NMQEAAAQAMATRP4pYSvBtBZbTHZ8q"
           "ngkEAoFAIBAIBIIrC+AFAUQz669uAAAAAElFTkSuQmCC")


def one(url: str, n: int) -> dict:
    host = urlparse(url).hostname or ""
    try:
        addresses = sorted({a[4][0] for a in socket.getaddrinfo(host, None, socket.AF_INET)})
    except socket.gaierror as err:
        return {"url": url, "error": f"DNS: {err}"}
    body = {"req_id": f"incluster-{n}", "modality": "IMAGE", "mm_items": [f"data:image/png;base64,{PNG_B64}"]}
    try:
        response = httpx.post(url.rstrip("/") + "/encode", json=body, timeout=120)
    except httpx.HTTPError as err:
        return {"url": url, "addresses": addresses, "error": f"{type(err).__name__}: {err}"}
    out = {"url": url, "addresses": addresses, "status": response.status_code}
    if response.status_code == 200:
        answer = response.json()
        out.update(req_id=answer.get("req_id"), shape=answer["embedding"]["shape"], dtype=answer["embedding"]["dtype"])
    else:
        out["body"] = response.text[:500]
    return out


print(json.dumps([one(url, n) for n, url in enumerate(sys.argv[1:])]))
