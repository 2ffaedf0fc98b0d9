"""The EncoderPool CRD: a structural schema, documented and bounded, that the examples satisfy.

The CEL rules need a real API server (tests/e2e applies tests/unit/operator/data/invalid-pools.yaml
for real); here the openAPIV3Schema itself is checked, with jsonschema as the validator.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

import jsonschema
import pytest
import yaml

from encoderpool_operator import names
from encoderpool_operator.podsettings import RESERVED_ENV
from encoderpool_operator.spec import parse_pool

pytestmark = pytest.mark.unit

# Nodes whose only content may be a type: the API server forbids more under metadata, and the
# two branches of an int-or-string anyOf are not fields.
UNDOCUMENTED_OK = re.compile(r"^(\.metadata(\.name)?|.*\.anyOf\[\d\])$")
# Numbers without both bounds, and why that is right.
UNBOUNDED_OK = {
    ".spec.tolerations[].tolerationSeconds",  # core/v1 leaves it unbounded too
}
JUNCTORS = ("allOf", "anyOf", "oneOf", "not")


def walk(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema node with a readable path (.spec.batching.maxQueue, .spec.env[].name)."""
    yield path, node
    for key, child in (node.get("properties") or {}).items():
        yield from walk(child, f"{path}.{key}")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}{{}}")
    if isinstance(node.get("items"), dict):
        yield from walk(node["items"], f"{path}[]")
    for junctor in JUNCTORS:
        for i, child in enumerate(node.get(junctor) or []):
            yield f"{path}.{junctor}[{i}]", child


def structural_problems(schema: dict[str, Any]) -> list[str]:
    """Violations of Kubernetes' structural-schema rules, plus this project's: documented, bounded."""
    problems = []
    for path, node in walk(schema):
        in_junctor = re.search(r"\.(allOf|anyOf|oneOf|not)\[\d\]$", path)
        special = node.get("x-kubernetes-int-or-string") or node.get("x-kubernetes-preserve-unknown-fields")
        if in_junctor:
            for key in ("description", "default", "additionalProperties", "nullable"):
                if key in node:
                    problems.append(f"{path}: {key} is not allowed inside {in_junctor.group(1)}")
            continue
        if not node.get("type") and not special:
            problems.append(f"{path or '<root>'}: no type")
        if node.get("type") == "object" and "properties" in node and "additionalProperties" in node:
            problems.append(f"{path}: both properties and additionalProperties")
        if node.get("type") == "object" and not (
            "properties" in node or "additionalProperties" in node or special or path == ".metadata"
        ):
            problems.append(f"{path}: an object without properties, additionalProperties or preserve-unknown-fields")
        if node.get("type") == "array" and "items" not in node:
            problems.append(f"{path}: an array without items")
        if node.get("x-kubernetes-list-type") == "map":
            keys = node.get("x-kubernetes-list-map-keys") or []
            if not keys or not set(keys) <= set(node["items"].get("required") or []):
                problems.append(f"{path}: list-type map needs its keys required in items")
        if path and not node.get("description") and not UNDOCUMENTED_OK.match(path):
            problems.append(f"{path}: no description")
        if path.startswith(".spec") and node.get("type") in ("integer", "number") and path not in UNBOUNDED_OK:
            if "minimum" not in node or "maximum" not in node:
                problems.append(f"{path}: a number without minimum and maximum")
    return problems


def unknown_fields(obj: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Fields of ``obj`` the API server would prune (silently drop) under ``schema``."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    if isinstance(obj, dict) and schema.get("type") == "object":
        if isinstance(schema.get("additionalProperties"), dict):
            return [p for k, v in obj.items() for p in unknown_fields(v, schema["additionalProperties"], f"{path}.{k}")]
        props = schema.get("properties") or {}
        if path == ".metadata":
            return []
        out = [f"{path}.{k}" for k in obj if k not in props]
        return out + [p for k, v in obj.items() if k in props for p in unknown_fields(v, props[k], f"{path}.{k}")]
    if isinstance(obj, list) and schema.get("type") == "array":
        return [p for i, v in enumerate(obj) for p in unknown_fields(v, schema["items"], f"{path}[{i}]")]
    return []


def examples(repo: Path) -> list[tuple[str, dict[str, Any]]]:
    """Every EncoderPool in examples/*.yaml."""
    out = []
    for path in sorted((repo / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == names.KIND:
                out.append((f"{path.name}:{doc['metadata']['name']}", doc))
    return out


def test_the_crd_is_a_structural_documented_bounded_schema(openapi: dict[str, Any]) -> None:
    assert structural_problems(openapi) == []


@pytest.mark.parametrize(
    ("broken", "problem"),
    [
        ({"type": "object", "properties": {"x": {"description": "d"}}}, ".x: no type"),
        ({"type": "object", "properties": {"x": {"type": "string"}}}, ".x: no description"),
        ({"type": "object", "properties": {"x": {"type": "object", "description": "d"}}}, "an object without"),
        ({"type": "object", "properties": {"x": {"type": "array", "description": "d"}}}, "an array without items"),
        ({"type": "object", "properties": {"spec": {"type": "object", "description": "d", "properties": {
            "n": {"type": "integer", "description": "d", "minimum": 0}}}}}, "without minimum and maximum"),
        ({"type": "object", "properties": {"x": {"description": "d", "anyOf": [
            {"type": "integer", "description": "no"}, {"type": "string"}], "x-kubernetes-int-or-string": True}}},
         "description is not allowed inside anyOf"),
    ],
)
def test_the_structural_checker_catches_what_it_claims(broken: dict[str, Any], problem: str) -> None:
    assert any(problem in p for p in structural_problems(broken)), structural_problems(broken)


def test_every_default_satisfies_its_own_schema(openapi: dict[str, Any]) -> None:
    for path, node in walk(openapi):
        if "default" in node:
            jsonschema.Draft4Validator(node).validate(node["default"])


def test_names_subresources_and_printer_columns(crd: dict[str, Any]) -> None:
    spec = crd["spec"]
    version = spec["versions"][0]
    assert crd["metadata"]["name"] == f"{names.PLURAL}.{names.GROUP}"
    assert (spec["group"], version["name"], spec["names"]["kind"]) == (names.GROUP, names.VERSION, names.KIND)
    assert spec["names"]["shortNames"] == ["encpool"]  # the public short name
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    assert "status" in version["subresources"]
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns == {
        "Model": ".spec.model", "TP": ".spec.parallelism.tensor", "DP": ".spec.parallelism.data",
        "Ready": ".status.readyText", "Reason": ".status.reason", "GPUs": ".status.gpusPerPod",
        "Age": ".metadata.creationTimestamp",
    }


def test_cel_lists_match_the_operator(openapi: dict[str, Any]) -> None:
    """The reserved env names, reserved labels and name limit in CEL are the operator's own."""
    spec = openapi["properties"]["spec"]["properties"]
    env_rule = spec["env"]["x-kubernetes-validations"][0]["rule"]
    assert tuple(re.findall(r"'([A-Z_]+)'", env_rule)) == RESERVED_ENV
    label_rule = spec["podLabels"]["x-kubernetes-validations"][0]["rule"]
    assert set(re.findall(r"'([^']+)' in self", label_rule)) == set(names.RESERVED_LABELS)
    name_rules = " ".join(r["rule"] for r in openapi["x-kubernetes-validations"])
    assert f"size() <= {names.MAX_POOL_NAME}" in name_rules
    backends = spec["transfer"]["properties"]["backend"]["enum"]
    assert backends == ["auto", "inline", "zmq_to_tokenizer", "zmq_to_scheduler", "mooncake"]


@pytest.mark.parametrize("case", examples(Path(__file__).resolve().parents[3]), ids=lambda c: c[0])
def test_examples_are_valid_pools(case: tuple[str, dict[str, Any]], openapi: dict[str, Any]) -> None:
    _, doc = case
    jsonschema.Draft4Validator(openapi).validate(doc)
    assert unknown_fields(doc, openapi) == [], "these fields would be pruned silently"
    parse_pool({**doc, "metadata": {**doc["metadata"], "namespace": "ml", "uid": "u", "generation": 1}})


def test_the_gpu_example_fits_a_node_with_8_gpus(repo: Path) -> None:
    doc = dict(examples(repo))["encoderpool.yaml:qwen2-vl"]
    par = doc["spec"]["parallelism"]
    assert par["tensor"] * par["data"] <= 8 and doc["spec"].get("device", "cuda") == "cuda"
    assert dict(examples(repo))["encoderpool-cpu.yaml:qwen2-vl-cpu"]["spec"]["device"] == "cpu"


def test_invalid_pools_are_refused_at_the_layer_they_claim(
    invalid_pools: list[dict[str, Any]], openapi: dict[str, Any]
) -> None:
    validator = jsonschema.Draft4Validator(openapi)
    assert len(invalid_pools) >= 20
    for doc in invalid_pools:
        layer = doc["metadata"]["annotations"]["test.encoderpool.io/layer"]
        errors = list(validator.iter_errors(doc))
        if layer == "schema":
            assert errors, f"{doc['metadata']['name']}: the schema accepts it"
        else:
            # Only a CEL rule refuses it, so the schema must accept it (or the case tests nothing).
            assert not errors, f"{doc['metadata']['name']}: {errors[0].message}"
