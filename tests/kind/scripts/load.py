"""In-cluster load: closed-loop clients sending /encode to a pool's Service name until /tmp/stop
exists, the way a router in the cluster does; then one JSON line with the tally.

    python load.py HOST PORT WORKERS ITEMS

Every request resolves HOST through the cluster's DNS (a headless Service: one A record per ready
pod) and goes to the next address. Each answer is one of:

- ok: 200 with an embedding;
- refused_draining: 503 with Retry-After from a pod that says it is draining; the request is then
  sent again at once to another address of the Service, and that retry is recorded (retried_ok);
- lost: anything else (connection refused or reset, a timeout, another status, a failed retry).
"""

import base64
import io
import itertools
import json
import os
import random
import socket
import sys
import threading
import time
from collections import Counter

import httpx

HOST, PORT, WORKERS, ITEMS = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
STOP = "/tmp/stop"
TIMEOUT = 60.0
RETRY_SECONDS = 10.0
lock = threading.Lock()
tally = Counter()
lost = []
by_address = Counter()
counter = itertools.count()


def photo(seed: int) -> str:
    """A 512x512 JPEG of noise: a few hundred ms of work for a tiny CPU model."""
    from PIL import Image

    rng = random.Random(seed)
    image = Image.frombytes("RGB", (512, 512), bytes(rng.getrandbits(8) for _ in range(512 * 512 * 3)))
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=85)
    return "data:image/jpeg;base64," + base64.b64encode(out.getvalue()).decode()


MEDIA = [photo(i) for i in range(ITEMS)]


def addresses() -> list:
    try:
        return sorted({a[4][0] for a in socket.getaddrinfo(HOST, PORT, socket.AF_INET, socket.SOCK_STREAM)})
    except socket.gaierror:
        return []


def pick(avoid=None):
    found = [a for a in addresses() if a != avoid]
    return found[next(counter) % len(found)] if found else None


def draining(response) -> bool:
    if response.status_code != 503 or "retry-after" not in response.headers:
        return False
    try:
        return "drain" in str(response.json().get("message", "")).lower()
    except ValueError:
        return False


def send(client, address, n):
    body = {"req_id": f"load-{n}", "modality": "IMAGE", "mm_items": MEDIA}
    try:
        return client.post(f"http://{address}:{PORT}/encode", json=body, timeout=TIMEOUT)
    except httpx.HTTPError as err:
        return f"{type(err).__name__}: {err}"


def record(kind, address, detail=""):
    with lock:
        tally[kind] += 1
        if kind in ("ok", "retried_ok"):
            by_address[address] += 1
        if kind == "lost" and len(lost) < 20:
            lost.append(f"{address}: {detail}")


def describe(answer):
    return answer if isinstance(answer, str) else f"HTTP {answer.status_code}: {answer.text[:200]}"


def retry(client, refused_by, n):
    deadline = time.monotonic() + RETRY_SECONDS
    while time.monotonic() < deadline:
        address = pick(avoid=refused_by)
        if address is None:
            time.sleep(0.05)  # no other ready pod yet: a router waits
            continue
        answer = send(client, address, n)
        if not isinstance(answer, str) and answer.status_code == 200:
            record("retried_ok", address)
            return
        if not isinstance(answer, str) and draining(answer):
            continue
        record("lost", address, "retry: " + describe(answer))
        return
    record("lost", refused_by, f"retry: no other ready pod within {RETRY_SECONDS:.0f}s")


def work():
    with httpx.Client() as client:
        while not os.path.exists(STOP):
            address = pick()
            if address is None:
                time.sleep(0.05)
                continue
            n = next(counter)
            answer = send(client, address, n)
            if not isinstance(answer, str) and answer.status_code == 200:
                record("ok", address)
            elif not isinstance(answer, str) and draining(answer):
                record("refused_draining", address)
                retry(client, address, n)
            else:
                record("lost", address, describe(answer))


print(json.dumps({"started": True}), flush=True)
threads = [threading.Thread(target=work, daemon=True) for _ in range(WORKERS)]
for t in threads:
    t.start()
for t in threads:
    t.join()
sent = tally["ok"] + tally["refused_draining"] + tally["lost"] - (tally["refused_draining"] - tally["retried_ok"])
print(json.dumps({"sent": sent, "ok": tally["ok"], "refused_draining": tally["refused_draining"],
                  "retried_ok": tally["retried_ok"], "lost": tally["lost"], "lost_details": lost,
                  "by_address": dict(by_address)}), flush=True)
