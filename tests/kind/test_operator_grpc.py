"""spec.grpc on the kind cluster, the operator installed by the chart: examples/encoderpool-grpc.yaml
applied as it is.

The pool's pods carry ENCODER_GRPC_PORT, a container port named grpc and the kubelet's native
gRPC probes (grpc.health.v1: service "" for startup and readiness, encoderpool.liveness for
liveness), accepted by the API server's own pod validation; the headless Service names the port.
The pool lands on kwok's fake GPU nodes (the probes are not run there): the probe itself, the
grpc.health.v1/Check the kubelet sends, is exercised against a real pod on loopback in
tests/integration/test_grpc_face.py.
"""

from __future__ import annotations

import pytest

from tests.e2e.pools import EXAMPLES, Pools, load_example, pool_ready

pytestmark = [pytest.mark.kind, pytest.mark.usefixtures("gpu_nodes")]

EXAMPLE = "encoderpool-grpc.yaml"
NAME = load_example(EXAMPLE)["metadata"]["name"]


def test_a_grpc_pool_renders_its_port_and_native_grpc_probes(pools: Pools) -> None:
    pools.apply(EXAMPLES / EXAMPLE)
    pools.wait(NAME, pool_ready, 90, "Ready")
    [pod] = pools.pods(NAME)
    [container] = [c for c in pod["spec"]["containers"] if c["name"] == "encoder"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["ENCODER_GRPC_PORT"] == "50051"
    assert {"name": "grpc", "containerPort": 50051, "protocol": "TCP"} in container["ports"]
    for probe in ("startupProbe", "readinessProbe"):
        assert container[probe]["grpc"]["port"] == 50051 and "httpGet" not in container[probe]
        assert container[probe]["grpc"].get("service", "") == ""  # the API server may fill in the default
    assert container["livenessProbe"]["grpc"] == {"port": 50051, "service": "encoderpool.liveness"}
    service = pools.child("Service", NAME)
    assert service is not None
    assert {"name": "grpc", "port": 50051, "targetPort": "grpc", "protocol": "TCP"} in service["spec"]["ports"]
