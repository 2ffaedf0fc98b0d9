"""spec.grpc: the gRPC port rendered into the pod (env, container port, Service port) and native gRPC probes."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from encoder_pod.settings import load_settings
from encoderpool_operator import names
from encoderpool_operator.children import service
from encoderpool_operator.podenv import container_env
from encoderpool_operator.podparts import container_ports, probes
from encoderpool_operator.spec import Pool, parse_pool

pytestmark = pytest.mark.unit

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "encoderpool-grpc.yaml"


def _example() -> Pool:
    body = yaml.safe_load(EXAMPLE.read_text())
    body["metadata"].update(namespace="ml", uid="u", generation=1)
    return parse_pool(body)


def test_the_example_renders_the_port_the_pod_reads_and_grpc_probes() -> None:
    spec = _example().spec
    env = {e["name"]: e["value"] for e in container_env(spec) if "value" in e}
    assert load_settings(env=env).server.grpc_port == 50051  # the pod's own reader agrees
    assert {"name": names.GRPC_PORT_NAME, "containerPort": 50051, "protocol": "TCP"} in container_ports(spec)
    rendered = probes(spec)
    for probe in ("startupProbe", "readinessProbe"):
        assert rendered[probe]["grpc"] == {"port": 50051} and "httpGet" not in rendered[probe]
    assert rendered["livenessProbe"]["grpc"] == {"port": 50051, "service": "encoderpool.liveness"}


def test_the_headless_service_names_the_grpc_port() -> None:
    ports = service(_example())["spec"]["ports"]
    assert {"name": "grpc", "port": 50051, "targetPort": "grpc", "protocol": "TCP"} in ports


def test_a_port_without_probes_keeps_the_http_probes_and_no_port_renders_nothing(make_pool: Callable[..., Pool]) -> None:
    with_port = make_pool({"model": "/m", "grpc": {"port": 50051}}).spec
    assert probes(with_port)["readinessProbe"]["httpGet"]["path"] == "/health"
    assert len(container_ports(with_port)) == 2
    plain = make_pool({"model": "/m"}).spec
    env: list[dict[str, Any]] = container_env(plain)
    assert all(e["name"] != "ENCODER_GRPC_PORT" for e in env) and len(container_ports(plain)) == 1
