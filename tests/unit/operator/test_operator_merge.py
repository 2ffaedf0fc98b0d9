"""spec.podTemplate: strategic merge by the core/v1 merge keys, and the fields the operator keeps."""

from __future__ import annotations

from typing import Any

import pytest

from encoderpool_operator.merge import merge, protect

pytestmark = pytest.mark.unit

BASE: dict[str, Any] = {
    "metadata": {"labels": {"encoderpool.io/pool": "enc", "team": "a"}},
    "spec": {
        "containers": [{
            "name": "encoder", "image": "enc:1", "command": ["encoder-pod", "serve"],
            "ports": [{"name": "http", "containerPort": 30000}],
            "env": [{"name": "ENCODER_PORT", "value": "30000"}, {"name": "HOME", "value": "/cache"}],
            "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
            "resources": {"limits": {"nvidia.com/gpu": 2, "memory": "8Gi"}, "requests": {"nvidia.com/gpu": 2}},
            "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 5},
        }],
        "volumes": [{"name": "tmp", "emptyDir": {}}, {"name": "dshm", "emptyDir": {"medium": "Memory"}}],
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        "nodeSelector": {"gpu": "h100"},
    },
}
OWNED_LABELS = ("encoderpool.io/pool",)
OWNED_ENV = ("ENCODER_PORT",)


def keep(merged: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    return protect(BASE, merged, "encoder", OWNED_LABELS, OWNED_ENV, "nvidia.com/gpu")


def test_lists_with_a_merge_key_merge_item_by_item() -> None:
    out = merge(BASE, {"spec": {
        "containers": [{"name": "encoder", "env": [{"name": "HOME", "value": "/home"}, {"name": "X", "value": "1"}],
                        "volumeMounts": [{"name": "extra", "mountPath": "/extra"}]},
                       {"name": "sidecar", "image": "side:1"}],
        "volumes": [{"name": "extra", "emptyDir": {}}],
    }})
    encoder, sidecar = out["spec"]["containers"]
    assert sidecar == {"name": "sidecar", "image": "side:1"}
    assert encoder["env"] == [{"name": "ENCODER_PORT", "value": "30000"}, {"name": "HOME", "value": "/home"},
                              {"name": "X", "value": "1"}]
    assert [m["mountPath"] for m in encoder["volumeMounts"]] == ["/tmp", "/extra"]
    assert [v["name"] for v in out["spec"]["volumes"]] == ["tmp", "dshm", "extra"]
    assert encoder["image"] == "enc:1", "what the override leaves out stays"


def test_maps_merge_and_other_lists_are_replaced() -> None:
    out = merge(BASE, {"spec": {"tolerations": [{"key": "spot", "operator": "Exists"}], "nodeSelector": {"zone": "b"},
                                "containers": [{"name": "encoder", "readinessProbe": {"periodSeconds": 1}}]}})
    assert out["spec"]["tolerations"] == [{"key": "spot", "operator": "Exists"}]
    assert out["spec"]["nodeSelector"] == {"gpu": "h100", "zone": "b"}
    probe = out["spec"]["containers"][0]["readinessProbe"]
    assert probe == {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 1}


def test_patch_delete_and_null_remove() -> None:
    out = merge(BASE, {"spec": {"volumes": [{"name": "dshm", "$patch": "delete"}], "nodeSelector": None}})
    assert [v["name"] for v in out["spec"]["volumes"]] == ["tmp"] and "nodeSelector" not in out["spec"]


def test_merge_leaves_its_inputs_alone() -> None:
    patch = {"spec": {"containers": [{"name": "encoder", "env": [{"name": "Y", "value": "2"}]}]}}
    before = repr(BASE)
    merge(BASE, patch)
    assert repr(BASE) == before


def test_an_override_of_nothing_owned_collides_with_nothing() -> None:
    merged = merge(BASE, {"metadata": {"labels": {"team": "b"}},
                          "spec": {"containers": [{"name": "encoder", "resources": {"limits": {"memory": "16Gi"}}}]}})
    out, collisions = keep(merged)
    assert collisions == [] and out == merged


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"spec": {"containers": [{"name": "encoder", "command": ["sleep"]}]}}, "spec.containers[encoder].command"),
        ({"spec": {"containers": [{"name": "encoder", "args": ["--x"]}]}}, "spec.containers[encoder].args"),
        ({"spec": {"containers": [{"name": "encoder", "image": "evil:1"}]}}, "spec.containers[encoder].image"),
        ({"spec": {"containers": [{"name": "encoder", "ports": [{"containerPort": 8080}]}]}},
         "spec.containers[encoder].ports"),
        ({"spec": {"containers": [{"name": "encoder", "env": [{"name": "ENCODER_PORT", "value": "1"}]}]}},
         "spec.containers[encoder].env[ENCODER_PORT]"),
        ({"spec": {"containers": [{"name": "encoder", "resources": {"limits": {"nvidia.com/gpu": 8}}}]}},
         "spec.containers[encoder].resources.limits[nvidia.com/gpu]"),
        ({"metadata": {"labels": {"encoderpool.io/pool": "other"}}}, "metadata.labels[encoderpool.io/pool]"),
        ({"spec": {"containers": [{"name": "encoder", "$patch": "delete"}]}}, "spec.containers[encoder]"),
    ],
)
def test_owned_fields_keep_the_operators_value_and_are_reported(patch: dict[str, Any], field: str) -> None:
    out, collisions = keep(merge(BASE, patch))
    assert collisions == [field]
    encoder = out["spec"]["containers"][0]
    assert encoder["name"] == "encoder" and encoder["command"] == ["encoder-pod", "serve"]
    assert "args" not in encoder and encoder["image"] == "enc:1"
    assert encoder["ports"] == BASE["spec"]["containers"][0]["ports"]
    assert {"name": "ENCODER_PORT", "value": "30000"} in encoder["env"]
    assert encoder["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert out["metadata"]["labels"]["encoderpool.io/pool"] == "enc"


def test_a_cpu_pool_cannot_be_given_gpus_through_an_override() -> None:
    cpu = merge(BASE, {"spec": {"containers": [{"name": "encoder", "resources": {"limits": {"nvidia.com/gpu": None},
                                                                                 "requests": {"nvidia.com/gpu": None}}}]}})
    merged = merge(cpu, {"spec": {"containers": [{"name": "encoder", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}})
    out, collisions = protect(cpu, merged, "encoder", OWNED_LABELS, OWNED_ENV, "nvidia.com/gpu")
    assert collisions == ["spec.containers[encoder].resources.limits[nvidia.com/gpu]"]
    assert "nvidia.com/gpu" not in out["spec"]["containers"][0]["resources"]["limits"]
