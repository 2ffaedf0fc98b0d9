"""Pod volumes as directories on the local node, and the path rewriting that stands in for mounts."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.cluster.local_node import volumes
from tests.e2e.cluster.local_node.podspec import ContainerConfigError

pytestmark = pytest.mark.unit

POD = {
    "metadata": {"name": "enc-0", "namespace": "ml"},
    "spec": {"volumes": [
        {"name": "tmp", "emptyDir": {}},
        {"name": "scratch", "emptyDir": {}},
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        {"name": "cache", "persistentVolumeClaim": {"claimName": "hf-cache"}},
        {"name": "host", "hostPath": {"path": "/srv/models"}},
        {"name": "conf", "configMap": {"name": "c"}},
    ]},
}
CONTAINER = {"volumeMounts": [
    {"name": "tmp", "mountPath": "/tmp"},
    {"name": "scratch", "mountPath": "/cache"},
    {"name": "dshm", "mountPath": "/dev/shm"},
    {"name": "cache", "mountPath": "/model-cache"},
    {"name": "cache", "mountPath": "/model-cache/triton", "subPath": "compile/triton"},
    {"name": "host", "mountPath": "/models/"},
    {"name": "conf", "mountPath": "/etc/conf"},
]}


def claims(namespace: str, claim: str) -> str | None:
    return "/pv/hf" if (namespace, claim) == ("ml", "hf-cache") else None


def mounts(tmp_path: Path) -> list[volumes.Mount]:
    return volumes.container_mounts(CONTAINER, volumes.volume_dirs(POD, tmp_path, claims))


def test_each_volume_kind_becomes_a_directory(tmp_path: Path) -> None:
    by_path = {m.container_path: m.host_path for m in mounts(tmp_path)}
    assert by_path == {
        "/cache": tmp_path / "volumes" / "scratch",
        "/model-cache": Path("/pv/hf"),
        "/model-cache/triton": Path("/pv/hf/compile/triton"),
        "/models": Path("/srv/models"),
    }, "/tmp, /dev/shm and configMaps are left alone"


@pytest.mark.parametrize(
    ("value", "moved"),
    [
        ("/model-cache/huggingface", "/pv/hf/huggingface"),
        ("/model-cache/triton/x", "/pv/hf/compile/triton/x"),  # the longer mountPath wins
        ("/model-cache", "/pv/hf"),
        ("/model-cachex", "/model-cachex"),
        ("--cache-dir=/model-cache/hf", "--cache-dir=/pv/hf/hf"),
        ("/models/qwen", "/srv/models/qwen"),
        ("/dev/shm", "/dev/shm"),
        ("/tmp/pytest-of-root/m", "/tmp/pytest-of-root/m"),
        ("/cache/huggingface", "{tmp}/volumes/scratch/huggingface"),
        ("http://x/model-cache", "http://x/model-cache"),
        ("0.0.0.0", "0.0.0.0"),
        ("/model-cache/a:/usr/lib:/models/b", "/pv/hf/a:/usr/lib:/srv/models/b"),
        ("/model-cache/x,/model-cache/y", "/pv/hf/x,/pv/hf/y"),
    ],
)
def test_paths_under_a_mount_are_moved(tmp_path: Path, value: str, moved: str) -> None:
    assert volumes.translate(value, mounts(tmp_path)) == moved.format(tmp=tmp_path)


def test_an_unbound_claim_cannot_start(tmp_path: Path) -> None:
    pod = {"metadata": {"namespace": "ml"}, "spec": {"volumes": [
        {"name": "c", "persistentVolumeClaim": {"claimName": "pending"}}]}}
    with pytest.raises(ContainerConfigError, match="ml/pending is not bound"):
        volumes.volume_dirs(pod, tmp_path, claims)


def test_empty_dirs_are_created(tmp_path: Path) -> None:
    found = [m for m in mounts(tmp_path) if m.container_path == "/cache"]
    volumes.prepare(found)
    assert (tmp_path / "volumes" / "scratch").is_dir()
