"""Claims filled by Jobs of the encoder image: tiny checkpoints on a PersistentVolumeClaim (what a
user's copy Job does with a real checkpoint), and a Hugging Face cache laid out on one.

kind's default StorageClass (``standard``) provisions hostPath directories on the node; the Job
runs as root to write there and leaves everything world-readable for the encoder's uid.
"""

from __future__ import annotations

from testkit.cluster.api import path_for, wait_for
from tests.e2e.pools import Pools
from tests.kind.images import ENCODER_CPU_IMAGE
from tests.kind.incluster import MOUNT, SCRIPTS_CONFIGMAP, scripts_configmap

JOB_SECONDS = 600.0


def claim(pools: Pools, name: str, size: str = "1Gi") -> None:
    """A ReadWriteOnce claim of kind's default StorageClass (one node: every pod can mount it)."""
    pools.api.create(path_for("v1", "persistentvolumeclaims", pools.namespace), {
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}})


def fill(pools: Pools, claim_name: str, script: str, timeout: float = JOB_SECONDS) -> None:
    """Run ``sh -c script`` in a Job of the encoder image with the claim at /data and the scripts of
    tests/kind/scripts/ at /scripts; wait for it."""
    job = f"fill-{claim_name}"
    scripts_configmap(pools)
    pools.api.create(path_for("batch/v1", "jobs", pools.namespace), {
        "metadata": {"name": job},
        "spec": {"backoffLimit": 0, "template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{
                "name": "fill", "image": ENCODER_CPU_IMAGE, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", f"set -e; {script}; chmod -R a+rX /data"],
                "securityContext": {"runAsUser": 0, "runAsNonRoot": False},
                "env": [{"name": "HF_HUB_OFFLINE", "value": "1"}, {"name": "HOME", "value": "/tmp"}],
                "volumeMounts": [{"name": "data", "mountPath": "/data"},
                                 {"name": "scripts", "mountPath": MOUNT, "readOnly": True}],
            }],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim_name}},
                        {"name": "scripts", "configMap": {"name": SCRIPTS_CONFIGMAP}}],
        }}}})

    def finished() -> bool:
        status = pools.api.get(path_for("batch/v1", "jobs", pools.namespace, job)).get("status") or {}
        if status.get("failed"):
            logs = pools.kubectl("logs", f"job/{job}", check=False)
            raise AssertionError(f"Job {job} failed:\n{logs.stdout[-3000:]}{logs.stderr[-2000:]}")
        return bool(status.get("succeeded"))

    wait_for(finished, timeout, f"Job {job} to finish", interval=1.0)


def tiny_checkpoints(pools: Pools, claim_name: str, *names: str) -> None:
    """A claim holding one random-weight qwen2_vl checkpoint per name (different weights each)."""
    claim(pools, claim_name)
    fill(pools, claim_name, "; ".join(
        f"encoder-pod make-tiny-model --arch qwen2_vl --out /data/{n}" for n in names))
