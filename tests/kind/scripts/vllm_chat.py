"""In-cluster client: what vLLM's disagg_epd_proxy sends an encoder instance, then /encode of each image.

    python vllm_chat.py http://POOL.NS.svc:30000

One POST /v1/chat/completions with only the media parts and ``stream: false``, as the proxy sends
it: two noisy RGB PNGs of different sizes, the first with ``uuid`` = sha256 of its URL (the proxy's
rule), the second without one. Then each image alone to /encode (the pod's own answer for it).
Prints one JSON line: the addresses the host name resolves to (the cluster's DNS), the uuid sent,
the chat answer's status and body, and per image the /encode status and embedding (shape, dtype,
base64 of its little-endian bytes) or the error body.
"""

import base64
import hashlib
import io
import json
import socket
import sys
from urllib.parse import urlparse

import httpx
import numpy as np
from PIL import Image

SIZES = [(56, 56), (112, 84)]  # (width, height): 4 and 12 merged patches for a 28 px merge unit


def png_url(width: int, height: int, seed: int) -> str:
    pixels = np.random.default_rng(seed).integers(0, 255, size=(height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def main(base: str) -> dict:
    host = urlparse(base).hostname or ""
    try:
        addresses = sorted({a[4][0] for a in socket.getaddrinfo(host, None, socket.AF_INET)})
    except socket.gaierror as err:
        return {"error": f"DNS: {err}"}
    urls = [png_url(w, h, seed) for seed, (w, h) in enumerate(SIZES)]
    uuid = hashlib.sha256(urls[0].encode()).hexdigest()
    parts = [{"type": "image_url", "image_url": {"url": urls[0]}, "uuid": uuid},
             {"type": "image_url", "image_url": {"url": urls[1]}}]
    body = {"model": "served-model", "messages": [{"role": "user", "content": parts}], "stream": False}
    out: dict = {"addresses": addresses, "uuid": uuid, "sizes": SIZES}
    try:
        chat = httpx.post(base.rstrip("/") + "/v1/chat/completions", json=body, timeout=120)
    except httpx.HTTPError as err:
        return {**out, "error": f"{type(err).__name__}: {err}"}
    out["chat_status"] = chat.status_code
    out["chat"] = chat.json() if chat.headers.get("content-type", "").startswith("application/json") else chat.text[:500]
    out["encode"] = []
    for n, url in enumerate(urls):
        response = httpx.post(base.rstrip("/") + "/encode", json={"req_id": f"vllm-kind-{n}", "modality": "IMAGE",
                                                                  "mm_items": [url]}, timeout=120)
        if response.status_code == 200:
            embedding = response.json()["embedding"]
            out["encode"].append({"status": 200, "shape": embedding["shape"], "dtype": embedding["dtype"],
                                  "data": embedding["data"], "grids": response.json().get("item_grids")})
        else:
            out["encode"].append({"status": response.status_code, "body": response.text[:500]})
    return out


print(json.dumps(main(sys.argv[1])))
