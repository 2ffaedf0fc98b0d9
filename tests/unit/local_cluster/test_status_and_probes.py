"""Pod status and probe thresholds as the local node reports them (pure parts)."""

from __future__ import annotations

import pytest

from tests.e2e.cluster.binaries import parse_env_file
from tests.e2e.cluster.local_node.probes import ProbeWorker, parse_probe
from tests.e2e.cluster.local_node.status import ConditionClock, ContainerView, pod_status_patch

pytestmark = pytest.mark.unit


def test_probe_defaults_and_named_ports_follow_the_kubelet() -> None:
    container = {"ports": [{"name": "http", "containerPort": 30000}]}
    spec = parse_probe({"httpGet": {"path": "/health", "port": "http"}}, container)
    assert (spec.kind, spec.port, spec.path, spec.period, spec.timeout, spec.failure_threshold) == (
        "http", 30000, "/health", 10.0, 1.0, 3)
    assert parse_probe(None, container) is None
    with pytest.raises(ValueError, match="does not declare"):
        parse_probe({"tcpSocket": {"port": "grpc"}}, container)


def test_probe_worker_needs_consecutive_failures_to_flip_to_not_ready() -> None:
    spec = parse_probe({"exec": {"command": ["true"]}, "periodSeconds": 1, "failureThreshold": 2,
                        "initialDelaySeconds": 5}, {})
    worker = ProbeWorker(spec, started_at=100.0)
    assert not worker.due(now=104.9) and worker.due(now=105.0)
    assert worker.record(True, "", now=105.0) and worker.result is True
    assert not worker.record(False, "boom", now=106.0) and worker.result is True  # one failure is not enough
    assert worker.record(False, "boom", now=107.0) and worker.result is False
    assert not worker.due(now=107.5) and worker.due(now=108.0)


def test_status_patch_reports_ready_only_when_running_and_every_container_is_ready() -> None:
    main = ContainerView("main", "img")
    main.set_running("local://42")
    clock = ConditionClock()
    patch = pod_status_patch("Running", "127.1.1.2", "127.0.0.1", "t0", [main], [], clock)["status"]
    ready = {c["type"]: c for c in patch["conditions"]}["Ready"]
    assert ready["status"] == "False" and "main" in ready["message"]
    assert patch["podIP"] == "127.1.1.2" and patch["containerStatuses"][0]["containerID"] == "local://42"
    main.ready = main.started = True
    patch = pod_status_patch("Running", "127.1.1.2", "127.0.0.1", "t0", [main], [], clock)["status"]
    assert {c["type"]: c["status"] for c in patch["conditions"]} == {
        "ContainersReady": "True", "Initialized": "True", "PodReadyToStartContainers": "True", "Ready": "True"}


def test_terminated_state_carries_exit_code_reason_and_log_tail() -> None:
    view = ContainerView("main")
    view.set_running("local://1")
    terminated = view.set_terminated(3, "model not found")
    assert terminated["exitCode"] == 3 and terminated["reason"] == "Error"
    assert terminated["message"] == "model not found"
    assert view.to_status()["ready"] is False


def test_env_file_parsing_ignores_comments() -> None:
    assert parse_env_file("# c\nA=1\n\nB = /x/y\n") == {"A": "1", "B": "/x/y"}


def test_loopback_pod_network_hands_out_distinct_addresses_and_reuses_them_last() -> None:
    import random

    from tests.e2e.cluster.local_node.network import loopback_network

    network = loopback_network(random.Random(1))
    first, second = network.take(), network.take()
    assert first != second and first.startswith(network.prefix + ".") and network.prefix.startswith("127.")
    assert not network.routable
    network.give_back(first)
    assert network.take() not in (first, second)
