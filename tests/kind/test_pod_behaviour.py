"""What the kubelet and the kernel do to a pool's pods, for real, on kind (restricted Pod Security,
non-root and the read-only root are in test_cpu_pool.py):

- a memory limit too small for the model gets the container OOMKilled by the kernel, and the pool
  says so with what to change;
- a sidecar from spec.podTemplate runs beside the encoder, in the same network namespace.
"""

from __future__ import annotations

from typing import Any

import pytest

from testkit.cluster.objects import condition
from tests.e2e.pools import Pools, cpu_pool, pool_ready
from tests.kind.images import ENCODER_CPU_IMAGE
from tests.kind.incluster import ClientPod, restricted_security

pytestmark = pytest.mark.kind

READY_SECONDS = 420.0


def exec_in(pools: Pools, pod: str, container: str, *command: str) -> Any:
    return pools.kubectl("exec", pod, "-c", container, "--", *command, check=False)


def test_a_memory_limit_too_small_is_reported_oom_killed(pools: Pools) -> None:
    pools.apply(cpu_pool("starved", resources={"requests": {"cpu": "100m", "memory": "100Mi"},
                                               "limits": {"memory": "100Mi"}}))
    pool = pools.wait("starved", lambda p: (p.get("status") or {}).get("reason") == "CrashLoop"
                      and "OOMKilled" in p["status"].get("message", ""), READY_SECONDS, "CrashLoop (OOMKilled)")
    message = pool["status"]["message"]
    assert "raise spec.resources.limits.memory" in message, message
    ready = condition(pool, "Ready")
    assert ready is not None and ready["status"] == "False" and ready["reason"] == "CrashLoop"
    [pod] = pools.pods("starved")
    last = pod["status"]["containerStatuses"][0]["lastState"]["terminated"]
    assert last["reason"] == "OOMKilled" and last["exitCode"] == 137, last
    print(f"\nOOM: the pool says: {message}")


def test_a_pod_template_sidecar_runs_beside_the_encoder(pools: Pools, client: ClientPod) -> None:
    _, container_security = restricted_security()
    sidecar = {"name": "probe-sidecar", "image": ENCODER_CPU_IMAGE, "imagePullPolicy": "IfNotPresent",
               # A container's PID 1 ignores any signal it has no handler for: this sidecar handles
               # SIGTERM, as a real one does, so its pod ends at once instead of at its grace period.
               "command": ["python", "-c", "import functools, http.server, signal, sys; "
                           "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)); "
                           "http.server.ThreadingHTTPServer(('', 8081), functools.partial("
                           "http.server.SimpleHTTPRequestHandler, directory='/tmp')).serve_forever()"],
               "securityContext": container_security,
               "ports": [{"name": "sidecar", "containerPort": 8081}],
               "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}]}
    pools.apply(cpu_pool("sidecar", podTemplate={"spec": {"containers": [sidecar]}}))
    pools.wait("sidecar", pool_ready, READY_SECONDS, "Ready with a sidecar")
    [pod] = pools.pods("sidecar")
    statuses = {s["name"]: s for s in pod["status"]["containerStatuses"]}
    assert set(statuses) == {"encoder", "probe-sidecar"}
    assert "running" in statuses["probe-sidecar"]["state"] and statuses["probe-sidecar"]["restartCount"] == 0
    # One network namespace: the sidecar reaches the encoder on localhost ...
    health = exec_in(pools, "sidecar-0", "probe-sidecar", "python", "-c",
                     "import httpx; print(httpx.get('http://127.0.0.1:30000/health', timeout=60).status_code)")
    assert health.stdout.strip() == "200", health.stderr
    # ... and the rest of the cluster reaches the sidecar on the pod's IP.
    reached = client.pools.kubectl("exec", client.name, "--", "python", "-c",
                                   f"import httpx; print(httpx.get('http://{pod['status']['podIP']}:8081/', "
                                   "timeout=30).status_code)")
    assert reached.stdout.strip() == "200", reached.stderr
