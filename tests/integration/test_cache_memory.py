"""The cache stays within its byte budget under churn: resident memory measured, not assumed.

Two views. A fresh process runs the cache's own put path (a batch output sliced per item,
copied into entries, least recently used evicted) over ten times its budget of distinct items
of realistic size and reports its resident set; and a real server churns through many distinct
images with a small budget while its gauges, entries and evictions are read back.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

from tests.integration.encode_client import encode
from testkit.media import png_data_uri
from testkit.server import EncoderServer

pytestmark = pytest.mark.integration

BUDGET_MB = 64
CHURN = textwrap.dedent(
    """
    import gc, json, os, sys
    import torch
    from encoder_pod.cache.entries import split_part
    from encoder_pod.cache.store import EmbeddingStore
    from encoder_pod.models.base import EncodedPart

    def rss():
        return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    budget = int(sys.argv[1]) << 20
    store = EmbeddingStore(budget)
    gen = torch.Generator().manual_seed(0)
    torch.randn(1024, 1024, generator=gen)  # the allocator's first pools, before the baseline
    gc.collect()
    base, inserted, samples, n = rss(), 0, [], 0
    while inserted < 10 * budget:
        tokens = torch.randint(96, 480, (4,), generator=gen).tolist()  # 4 items of 0.4-1.9 MiB (width 1024, fp32)
        part = EncodedPart(torch.randn(sum(tokens), 1024, generator=gen), tokens, [[1, t, 1] for t in tokens])
        for item in split_part(part):
            store.put(n.to_bytes(8, "big"), item)
            inserted += item.nbytes
            n += 1
        del part
        samples.append(rss() - base)
    print(json.dumps({"inserted": inserted, "bytes": store.bytes, "entries": len(store),
                      "evictions": store.stats.evictions, "growth": samples}))
    """
)


def test_resident_memory_stays_within_the_budget_under_ten_times_its_churn():
    out = subprocess.run(
        [sys.executable, "-c", CHURN, str(BUDGET_MB)], capture_output=True, text=True, timeout=600,
        cwd=Path(__file__).resolve().parents[2], check=True,
    )
    report = json.loads(out.stdout.strip().splitlines()[-1])
    budget = BUDGET_MB << 20
    assert report["inserted"] >= 10 * budget and report["evictions"] > 0.8 * report["entries"] * 9
    assert report["bytes"] <= budget
    growth = report["growth"]
    # The rows the store holds, one batch output in flight and the allocator's slack (up to 130 MiB
    # was seen under load for this 64 MiB budget): never the churn, ten times the budget.
    assert max(growth) <= 1.25 * budget + (80 << 20), f"peak RSS growth {max(growth) >> 20} MiB over a {BUDGET_MB} MiB budget"
    # Growth after the cache is full is a trend, not a spike: glibc's heap keeps a freed batch output
    # of up to 60 MiB for a while (86 -> 145 -> 88 MiB was seen in one CI run), so the middle and the
    # last third are compared by their medians. A leak of a tenth of the churn would move it by 21 MiB.
    third = len(growth) // 3
    middle, last = statistics.median(growth[third : 2 * third]), statistics.median(growth[2 * third :])
    assert last - middle <= 16 << 20, f"resident memory keeps growing after the cache is full: {middle / 2**20:.0f} -> {last / 2**20:.0f} MiB"


def test_a_server_holds_its_budget_while_distinct_images_churn_through(tiny_model):
    env = {"ENCODER_CACHE_SIZE_MB": "2"}
    with EncoderServer(tiny_model("clip", preset="moderate"), env=env) as server:
        for k in range(48):
            assert encode(server.base_url, f"churn-{k}", [png_data_uri(224, 224, seed=k)]).status_code == 200
        info = httpx.get(server.base_url + "/server_info", timeout=10).json()["cache"]
        entry_bytes = info["bytes"] / info["entries"]
        assert info["bytes"] <= 2 << 20 and server.metric("encoder_cache_bytes") == info["bytes"]
        assert info["entries"] == int((2 << 20) // entry_bytes)  # full, to within one entry
        assert server.metric("encoder_cache_evictions_total") == 48 - info["entries"] == info["evictions"]
        assert server.metric("encoder_cache_misses_total") == 48
