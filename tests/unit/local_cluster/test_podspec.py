"""How the local node turns a pod's container into a host command (pure functions)."""

from __future__ import annotations

import base64

import pytest

from tests.e2e.cluster.local_node import podspec

pytestmark = pytest.mark.unit

POD = {
    "metadata": {"name": "enc-0", "namespace": "ml", "uid": "u-1", "labels": {"app": "enc"}},
    "spec": {"nodeName": "local-0", "serviceAccountName": "sa"},
}


def no_lookup(kind: str, namespace: str, name: str) -> None:
    return None


def test_env_resolves_values_field_refs_and_earlier_variables() -> None:
    container = {"env": [
        {"name": "PORT", "value": "30000"},
        {"name": "ADDR", "value": "$(HOST_IP):$(PORT)"},
        {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
    ]}
    env = podspec.resolve_env(POD, container, "127.5.5.2", "127.0.0.1", no_lookup)
    assert env == {"PORT": "30000", "ADDR": "$(HOST_IP):30000", "NAME": "enc-0", "NS": "ml",
                   "IP": "127.5.5.2", "APP": "enc"}


def test_env_reads_config_maps_and_decoded_secrets_and_fails_on_missing_keys() -> None:
    data = {("ConfigMap", "cm"): {"k": "v"}, ("Secret", "s"): podspec.decode_secret_data(
        {"t": base64.b64encode(b"tok").decode()})}

    def lookup(kind: str, namespace: str, name: str) -> dict[str, str] | None:
        return data.get((kind, name))

    container = {"envFrom": [{"configMapRef": {"name": "cm"}, "prefix": "CM_"}], "env": [
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "t"}}},
        {"name": "OPT", "valueFrom": {"configMapKeyRef": {"name": "gone", "key": "x", "optional": True}}},
    ]}
    assert podspec.resolve_env(POD, container, "ip", "host", lookup) == {"CM_k": "v", "TOKEN": "tok"}
    broken = {"env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "nope"}}}]}
    with pytest.raises(podspec.ContainerConfigError, match="no key 'nope'"):
        podspec.resolve_env(POD, broken, "ip", "host", lookup)


def test_resource_field_ref_rounds_up_like_the_kubelet() -> None:
    container = {"resources": {"limits": {"cpu": "1500m", "memory": "1Gi"}}, "env": [
        {"name": "CPUS", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
        {"name": "MEM_MI", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
    ]}
    assert podspec.resolve_env(POD, container, "ip", "host", no_lookup) == {"CPUS": "2", "MEM_MI": "1024"}


@pytest.mark.parametrize(("value", "expected"), [
    ("0.0.0.0", "127.9.9.2"),
    ("::", "127.9.9.2"),
    ("--host=0.0.0.0", "--host=127.9.9.2"),
    ("0.0.0.0:8080", "127.9.9.2:8080"),
    ("127.0.0.1", "127.0.0.1"),
    ("10.0.0.0", "10.0.0.0"),
    ("--name=::1", "--name=::1"),
])
def test_rebind_moves_only_wildcard_addresses(value: str, expected: str) -> None:
    assert podspec.rebind(value, "127.9.9.2") == expected


def test_argv_is_expanded_and_rebound_and_escapes_survive() -> None:
    container = {"command": ["encoder-pod", "serve"], "args": ["--host", "0.0.0.0", "--port", "$(PORT)", "$$(PORT)"]}
    argv = podspec.container_argv(container, {"PORT": "30000"}, "127.1.1.2")
    assert argv == ["encoder-pod", "serve", "--host", "127.1.1.2", "--port", "30000", "$(PORT)"]


def test_a_container_without_command_cannot_run_on_the_local_node() -> None:
    with pytest.raises(podspec.ContainerConfigError, match="no command"):
        podspec.container_argv({"name": "c", "args": ["x"]}, {}, "ip")
