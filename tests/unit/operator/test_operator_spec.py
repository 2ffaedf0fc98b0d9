"""The typed spec (spec.py) says what the CRD says: same fields, same defaults, same refusals."""

from __future__ import annotations

import types
import typing
from typing import Any, Callable

import pytest
from pydantic import BaseModel

from encoderpool_operator.errors import InvalidSpecError
from encoderpool_operator.spec import PoolSpec, parse_pool, parse_quantity, parse_spec

pytestmark = pytest.mark.unit


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside X, X | None or list[X]."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, list):
        for arg in typing.get_args(annotation):
            found = _model_of(arg)
            if found is not None:
                return found
    return None


def mismatches(model: type[BaseModel], schema: dict[str, Any], path: str = "spec") -> list[str]:
    """Fields present on one side only, and leaf defaults that differ."""
    if schema.get("type") == "array":
        schema = schema["items"]
    fields = {(info.alias or name): info for name, info in model.model_fields.items()}
    props = schema.get("properties") or {}
    out = [f"{path}.{k}: only in spec.py" for k in fields.keys() - props.keys()]
    out += [f"{path}.{k}: only in the CRD" for k in props.keys() - fields.keys()]
    for key in fields.keys() & props.keys():
        info, node = fields[key], props[key]
        nested = _model_of(info.annotation)
        if nested is not None and "properties" in (node.get("items") or node):
            out += mismatches(nested, node, f"{path}.{key}")
        elif "default" in node and info.get_default(call_default_factory=True) != node["default"]:
            out.append(f"{path}.{key}: default {info.get_default()!r} != CRD {node['default']!r}")
    return out


def test_spec_py_mirrors_the_crd(openapi: dict[str, Any]) -> None:
    assert mismatches(PoolSpec, openapi["properties"]["spec"]) == []


def test_the_mirror_check_can_fail(openapi: dict[str, Any]) -> None:
    spec = openapi["properties"]["spec"]
    altered = {**spec, "properties": {**spec["properties"], "port": {**spec["properties"]["port"], "default": 8080}}}
    altered["properties"].pop("image")
    assert sorted(mismatches(PoolSpec, altered)) == [
        "spec.image: only in spec.py", "spec.port: default 30000 != CRD 8080",
    ]


def test_cel_refusals_are_also_made_by_the_operator(invalid_pools: list[dict[str, Any]]) -> None:
    """A pool that slipped past the API server's CEL rules still becomes InvalidSpec, same words."""
    for doc in invalid_pools:
        body = {**doc, "metadata": {**doc["metadata"], "namespace": "ml", "uid": "u", "generation": 1}}
        with pytest.raises(InvalidSpecError) as caught:
            parse_pool(body)
        if doc["metadata"]["annotations"]["test.encoderpool.io/layer"] == "cel":
            assert doc["metadata"]["annotations"]["test.encoderpool.io/expect"] in str(caught.value)


def test_defaults_and_derived_values() -> None:
    spec = parse_spec({"model": "qwen2-vl", "parallelism": {"tensor": 2, "data": 4}})
    assert (spec.replicas, spec.port, spec.device, spec.gpu_resource_name) == (1, 30000, "cuda", "nvidia.com/gpu")
    assert spec.gpus_per_pod == 8 and spec.model_path == "qwen2-vl"
    cpu = parse_spec({"model": "m", "device": "cpu", "parallelism": {"data": 4}})
    assert cpu.gpus_per_pod == 0


@pytest.mark.parametrize(
    ("volume", "model", "path"),
    [
        ({"persistentVolumeClaim": {"claimName": "c"}}, "qwen", "/models/qwen"),
        ({"mountPath": "/weights/", "hostPath": {"path": "/srv"}}, "a/b", "/weights/a/b"),
        ({"persistentVolumeClaim": {"claimName": "c"}}, "/opt/baked", "/opt/baked"),
    ],
)
def test_model_path_is_resolved_inside_the_volume(volume: dict[str, Any], model: str, path: str) -> None:
    assert parse_spec({"model": model, "modelVolume": volume}).model_path == path


def test_a_cpu_pool_ignores_the_gpu_bound() -> None:
    assert parse_spec({"model": "m", "device": "cpu", "parallelism": {"data": 16}}).gpus_per_pod == 0


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(InvalidSpecError) as caught:
        parse_spec({"model": "", "replicas": -1, "bogus": True})
    message = str(caught.value)
    assert "spec.model" in message and "spec.replicas" in message and "spec.bogus" in message


def test_a_missing_spec_is_invalid(pool_body: Callable[..., dict[str, Any]]) -> None:
    body = pool_body({})
    body.pop("spec")
    with pytest.raises(InvalidSpecError, match="spec is missing"):
        parse_pool(body)


@pytest.mark.parametrize(
    ("text", "value"),
    [("16Gi", 16 * 2**30), ("500m", 0.5), (4, 4.0), ("1e3", 1000.0), ("1.5G", 1.5e9), ("128974848", 128974848.0)],
)
def test_quantities(text: Any, value: float) -> None:
    assert parse_quantity(text) == pytest.approx(value)


def test_a_bad_quantity_is_refused() -> None:
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        parse_quantity("lots")


def test_wire_round_trip_is_stable() -> None:
    spec = parse_spec({"model": "m", "resources": {"requests": {"cpu": 2, "memory": "8Gi"}}})
    assert parse_spec(spec.wire()) == spec
    assert spec.wire()["resources"]["requests"] == {"cpu": 2, "memory": "8Gi"}
