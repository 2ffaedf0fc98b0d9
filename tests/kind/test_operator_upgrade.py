"""Issue 11, item 7: a Helm upgrade of the operator never rolls existing pools.

The image a pool runs is recorded on the pool (status.image). ``helm upgrade`` with a new default
encoder image (encoderImage.cuda) restarts the operator with it; the existing pool keeps its
image and its StatefulSet revision through several resyncs, a new pool gets the new default, and
spec.followDefaultImage is the explicit opt-in that moves an existing pool. The chart's values
are put back afterwards.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from testkit.cluster import Cluster
from testkit.cluster.api import path_for
from tests.e2e.chart import CHART, ENV_PREFIX, ChartInstall, InClusterOperator, install_chart
from tests.e2e.pools import Pools, load_example, pool_ready

pytestmark = [pytest.mark.kind, pytest.mark.usefixtures("gpu_nodes")]

NEW_IMAGE = "registry.example.com/encoderpool/encoder-pod:0.2.0-cuda"


@pytest.fixture
def upgradable(k8s_cluster: Cluster, encoderpool_operator: InClusterOperator) -> Iterator[Any]:
    """``upgrade(**values)`` runs helm upgrade and waits for the Deployment's rollout to what it renders."""
    original = encoderpool_operator.install

    def upgrade(**values: str) -> ChartInstall:
        sets = [a for k, v in values.items() for a in ("--set", f"{k}={v}")]
        k8s_cluster.helm("upgrade", original.release, str(CHART), "--reuse-values", *sets, "-n", original.namespace,
                         "--wait", "--timeout", "5m", timeout=360)
        install = ChartInstall(original.release, original.namespace, deployment_of(k8s_cluster, original))
        encoderpool_operator.reload(install)
        return install

    try:
        yield upgrade
    finally:
        encoderpool_operator.reload(install_chart(k8s_cluster))


def deployment_of(cluster: Cluster, install: ChartInstall) -> dict[str, Any]:
    """The operator Deployment as upgraded."""
    with cluster.api() as api:
        return api.get(path_for("apps/v1", "deployments", install.namespace, install.deployment_name))


def gpu_pool(name: str) -> dict[str, Any]:
    manifest = load_example("encoderpool.yaml")
    manifest["metadata"]["name"] = name
    manifest["spec"].update(replicas=1, parallelism={"tensor": 1, "data": 1})
    return manifest


def image_of(pools: Pools, name: str) -> str:
    sts = pools.child("StatefulSet", name)
    assert sts is not None
    return str(sts["spec"]["template"]["spec"]["containers"][0]["image"])


def test_a_new_default_image_applies_to_new_pools_and_on_opt_in_only(pools: Pools, upgradable: Any) -> None:
    pools.apply(gpu_pool("existing"))
    pool = pools.wait("existing", pool_ready, 60, "Ready")
    old_image = pool["status"]["image"]
    assert pool["status"]["imageDefaultFor"] == "cuda" and image_of(pools, "existing") == old_image
    before = pools.child("StatefulSet", "existing")
    assert before is not None

    install = upgradable(**{"encoderImage.cuda": NEW_IMAGE})
    assert install.env_value(ENV_PREFIX + "DEFAULT_IMAGE") == NEW_IMAGE
    time.sleep(12)  # two resyncs (5 s) of the upgraded operator
    after = pools.child("StatefulSet", "existing")
    assert after is not None
    assert after["metadata"]["generation"] == before["metadata"]["generation"], "the pool was rolled"
    assert after["status"]["updateRevision"] == before["status"]["updateRevision"]
    assert image_of(pools, "existing") == old_image and pools.get("existing")["status"]["image"] == old_image

    pools.apply(gpu_pool("fresh"))
    pools.wait("fresh", pool_ready, 60, "Ready")
    assert image_of(pools, "fresh") == NEW_IMAGE, "a new pool gets the new default"

    pools.kubectl("patch", "encpool", "existing", "--type=merge", "-p", '{"spec":{"followDefaultImage":true}}')
    pool = pools.wait("existing", lambda p: pool_ready(p) and p["status"].get("image") == NEW_IMAGE, 60,
                      "Ready on the new default image (opt-in)")
    assert image_of(pools, "existing") == NEW_IMAGE
    assert pool["status"]["updateRevision"] != before["status"]["updateRevision"]
