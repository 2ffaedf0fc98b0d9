"""Everything derived from the pod's settings declaration (encoder_pod/settings.py), written or checked.

    python -m encoder_pod.settings_gen            # write every generated part (`make generate`)
    python -m encoder_pod.settings_gen --check    # exit 1 with a diff where a part differs (`make lint`)

As controller-gen writes a CRD from Go types with markers, this writes, from each setting's
declaration (type, bounds, default, doc, env names, and ``names(crd=..., derived_from=...)``):

- the CRD's settings objects (``spec.parallelism``, ``spec.batching``, ``spec.transfer``: every
  ``crd=`` setting, with the CEL rule of each relation inside one object) and the CEL rule that
  keeps spec.env off every variable the operator renders (every name the pod reads it under),
  between ``# BEGIN GENERATED <part>`` / ``# END GENERATED <part>`` lines of
  crds/encoderpools.encoderpool.io.yaml, and the chart's byte-identical copy;
- operator/encoderpool_operator/podsettings.py: the operator's pydantic models of those
  objects and the env names it renders and reserves (the operator never imports encoder_pod);
- the settings table of docs/configuration.md, between ``<!-- BEGIN GENERATED settings-table``
  and ``<!-- END GENERATED settings-table -->``.

The hand-written rest of each file is left as it is. tests/unit/test_settings_contract.py fails
when a generated part is not what this module writes.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
import textwrap
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Literal, get_args, get_origin

import annotated_types
import yaml
from pydantic_core import PydanticUndefined

from encoder_pod.settings import CRD_OBJECTS, RELATIONS, NotAbove, Setting, all_settings

REPO = Path(__file__).resolve().parents[1]
CRD = Path("crds/encoderpools.encoderpool.io.yaml")
CHART_CRD = Path("charts/encoderpool-operator/crds/encoderpools.encoderpool.io.yaml")
OPERATOR_MODULE = Path("operator/encoderpool_operator/podsettings.py")
DOCS = Path("docs/configuration.md")
COMMAND = "python -m encoder_pod.settings_gen"
YAML_WIDTH = 104
"""A description line longer than :data:`FOLD_AT` is folded (``>-``) at this column, as the hand-written parts of the CRD are."""
FOLD_AT = 120


@dataclass(frozen=True)
class CrdField:
    """A setting that is the EncoderPool field ``spec.<obj>.<key>``."""

    setting: Setting
    obj: str
    key: str

    @property
    def attr(self) -> str:
        """The operator model's attribute: the key in snake case (maxBatchSize -> max_batch_size)."""
        return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", self.key).lower()

    @property
    def path(self) -> str:
        """``spec.batching.maxBatchSize``."""
        return f"spec.{self.obj}.{self.key}"


def crd_fields() -> list[CrdField]:
    """Every ``crd=`` setting, in declaration order (ValueError for an unknown object or a duplicate)."""
    fields: list[CrdField] = []
    for setting in all_settings().values():
        if setting.crd is None:
            continue
        obj, _, key = setting.crd.partition(".")
        if obj not in CRD_OBJECTS or not re.fullmatch(r"[a-z][A-Za-z0-9]*", key):
            raise ValueError(f"{setting.name}: crd={setting.crd!r} is not <one of {sorted(CRD_OBJECTS)}>.<camelCaseField>")
        fields.append(CrdField(setting, obj, key))
    paths = [f.path for f in fields]
    if len(set(paths)) != len(paths):
        raise ValueError(f"two settings declare the same CRD field: {sorted(p for p in paths if paths.count(p) > 1)}")
    return fields


def by_object() -> dict[str, list[CrdField]]:
    """The CRD fields of each object of :data:`CRD_OBJECTS` that has any, in its order."""
    fields = crd_fields()
    return {obj: [f for f in fields if f.obj == obj] for obj in CRD_OBJECTS if any(f.obj == obj for f in fields)}


# --- what a setting's type, bounds and default are ----------------------------------------------

def _base_type(annotation: Any) -> tuple[Any, bool]:
    """``(type, optional)``: ``X | None`` -> ``(X, True)``."""
    args = get_args(annotation)
    if args and type(None) in args and get_origin(annotation) is not Literal:
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return rest[0], True
    return annotation, False


def _choices(kind: Any) -> list[str] | None:
    if get_origin(kind) is Literal:
        return [str(v) for v in get_args(kind)]
    if isinstance(kind, type) and issubclass(kind, Enum):
        return [str(member.value) for member in kind]
    return None


_BOUNDS = {annotated_types.Ge: "ge", annotated_types.Gt: "gt", annotated_types.Le: "le", annotated_types.Lt: "lt",
           annotated_types.MinLen: "min_length", annotated_types.MaxLen: "max_length"}


def _bounds(setting: Setting) -> dict[str, Any]:
    """``ge``/``gt``/``le``/``lt``/``min_length``/``max_length`` of the setting's Field."""
    return {_BOUNDS[type(item)]: getattr(item, _BOUNDS[type(item)]) for item in setting.info.metadata if type(item) in _BOUNDS}


def default_of(setting: Setting) -> Any:
    """The setting's default as plain data (an enum as its value), or None when it has none."""
    info = setting.info
    value = info.default_factory() if info.default_factory is not None else info.default  # type: ignore[call-arg]
    if value is PydanticUndefined:
        return None
    return value.value if isinstance(value, Enum) else value


def _number(value: Any) -> Any:
    """180.0 -> 180 (the CRD's and docs' style); other values as they are."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def schema_of(field: CrdField) -> dict[str, Any]:
    """The openAPIV3Schema node of a CRD field."""
    setting = field.setting
    kind, _ = _base_type(setting.info.annotation)
    choices, bounds = _choices(kind), _bounds(setting)
    node: dict[str, Any]
    if choices is not None:
        node = {"type": "string", "enum": choices}
    elif kind is bool:
        node = {"type": "boolean"}
    elif kind in (int, float):
        node = {"type": "integer" if kind is int else "number"}
        if "gt" in bounds:
            node.update(exclusiveMinimum=True, minimum=_number(bounds["gt"]))
        elif "ge" in bounds:
            node["minimum"] = _number(bounds["ge"])
        if "lt" in bounds:
            node.update(exclusiveMaximum=True, maximum=_number(bounds["lt"]))
        elif "le" in bounds:
            node["maximum"] = _number(bounds["le"])
        if "minimum" not in node or "maximum" not in node:
            raise ValueError(f"{setting.name}: a CRD number needs both bounds (ge/gt and le/lt)")
    elif kind is str:
        node = {"type": "string"}
        node.update({k2: bounds[k] for k, k2 in (("min_length", "minLength"), ("max_length", "maxLength")) if k in bounds})
    elif get_origin(kind) is list and get_args(kind) == (str,):
        node = {"type": "array", "items": {"type": "string", "description": "One entry."}}
        node.update({k2: bounds[k] for k, k2 in (("min_length", "minItems"), ("max_length", "maxItems")) if k in bounds})
    else:
        raise ValueError(f"{setting.name}: no CRD rendering of {setting.info.annotation!r}")
    default = default_of(setting)
    if default is not None:
        node["default"] = _number(default)
    node["description"] = f"{(setting.info.description or '').rstrip('.')} ({setting.env})."
    return node


def relation_rules(obj: str, fields: list[CrdField]) -> tuple[list[dict[str, Any]], list[tuple[CrdField, CrdField, NotAbove]]]:
    """The CEL rules (and the field pairs) of the relations whose two settings are both in ``obj``."""
    here = {f.setting.name: f for f in fields}
    everywhere = {f.setting.name: f for f in crd_fields()}
    rules, pairs = [], []
    for rule in RELATIONS:
        low, high = everywhere.get(rule.low), everywhere.get(rule.high)
        if low is None or high is None:
            continue  # not both in the CRD: the pod checks it at start
        if low.obj != high.obj:
            raise ValueError(f"relation {rule.low} <= {rule.high} spans spec.{low.obj} and spec.{high.obj}: "
                             "declare both in one CRD object (or teach settings_gen a spec-level rule)")
        if rule.low not in here:
            continue
        pair = (here[rule.low], here[rule.high])
        rules.append({
            # has(): the API server also checks the rule against the object's bare default {}.
            "rule": f"!has(self.{pair[0].key}) || !has(self.{pair[1].key}) || self.{pair[0].key} <= self.{pair[1].key}",
            "message": relation_message(pair[0], pair[1], rule),
        })
        pairs.append((pair[0], pair[1], rule))
    return rules, pairs


def relation_message(low: CrdField, high: CrdField, rule: NotAbove) -> str:
    """The words the CRD and the operator refuse a relation with."""
    return f"{low.path} must not exceed {high.path}: {rule.why}"


def crd_objects() -> dict[str, dict[str, Any]]:
    """``spec.properties`` entries of the settings objects."""
    out: dict[str, dict[str, Any]] = {}
    for obj, fields in by_object().items():
        node: dict[str, Any] = {"type": "object", "default": {}, "description": CRD_OBJECTS[obj]}
        rules, _ = relation_rules(obj, fields)
        if rules:
            node["x-kubernetes-validations"] = rules
        node["properties"] = {f.key: schema_of(f) for f in fields}
        out[obj] = node
    return out


def managed() -> list[Setting]:
    """The settings the operator renders (``crd=`` or ``derived_from=``), in declaration order."""
    return [s for s in all_settings().values() if s.crd is not None or s.derived_from is not None]


def reserved_env() -> list[str]:
    """Every env name the pod reads a managed setting under: spec.env may set none of them."""
    return [name for setting in managed() for name in setting.env_names]


def env_rule() -> list[dict[str, Any]]:
    """The CEL rule of spec.env."""
    listed = ", ".join(f"'{name}'" for name in reserved_env())
    return [{
        "rule": f"self.all(e, !(e.name in [{listed}]))",
        "message": "spec.env must not set an ENCODER_* variable the operator renders from the spec (or another "
                   "name the pod reads it under): set the spec field instead",
    }]


# --- a small YAML writer in the CRD's own style ------------------------------------------------

def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value)
    plain = (text and not re.search(r"[:#'\"\[\]{},&*!|>%@`]|^[-?\s]|\s$", text)
             and yaml.safe_load(text) == text)
    return text if plain else json.dumps(text, ensure_ascii=False)


def _emit(node: Any, indent: int) -> list[str]:
    pad = " " * indent
    lines: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            head = f"{pad}{key}:"
            if isinstance(value, dict) and value:
                lines += [head, *_emit(value, indent + 2)]
            elif isinstance(value, dict):
                lines.append(f"{head} {{}}")
            elif isinstance(value, list) and value and isinstance(value[0], dict):
                lines += [head, *_emit(value, indent + 2)]
            elif isinstance(value, list):
                lines.append(f"{head} [{', '.join(_scalar(v) for v in value)}]")
            elif key == "description" and len(f"{head} {value}") > FOLD_AT:
                lines.append(f"{head} >-")
                lines += textwrap.wrap(str(value), YAML_WIDTH, initial_indent=pad + "  ",
                                       subsequent_indent=pad + "  ", break_long_words=False, break_on_hyphens=False)
            else:
                lines.append(f"{head} {_scalar(value)}")
    elif isinstance(node, list):
        for item in node:
            inner = _emit(item, indent + 2)
            lines.append(f"{pad}- {inner[0].lstrip()}")
            lines += inner[1:]
    return lines


def to_yaml(node: Any, indent: int) -> str:
    """``node`` as YAML lines at ``indent``; checked to read back as ``node``."""
    text = "\n".join(_emit(node, indent)) + "\n"
    if yaml.safe_load(textwrap.dedent(text)) != node:
        raise AssertionError(f"the YAML writer does not round-trip:\n{text}")
    return text


# --- regions of hand-written files -------------------------------------------------------------

def replace_region(text: str, part: str, render: Callable[[int], str], comment: str = "#") -> str:
    """``text`` with the lines between its ``BEGIN GENERATED <part>`` / ``END GENERATED <part>``
    comments replaced by ``render(indent of the BEGIN line)``."""
    end_mark = " -->" if comment == "<!--" else ""
    begin = re.compile(rf"^( *){re.escape(comment)} BEGIN GENERATED {re.escape(part)}\b.*\n", re.M)
    found = begin.search(text)
    if found is None:
        raise ValueError(f"no '{comment} BEGIN GENERATED {part}' line")
    end = re.compile(rf"^ *{re.escape(comment)} END GENERATED {re.escape(part)}{re.escape(end_mark)}\n", re.M)
    closing = end.search(text, found.end())
    if closing is None:
        raise ValueError(f"no '{comment} END GENERATED {part}' line after its BEGIN line")
    return text[: found.end()] + render(len(found.group(1))) + text[closing.start():]


def render_crd(text: str) -> str:
    """The CRD with its generated parts rewritten."""
    text = replace_region(text, "spec-settings", lambda indent: to_yaml(crd_objects(), indent))
    return replace_region(text, "spec-env-rule", lambda indent: to_yaml(env_rule(), indent))


# --- the operator's module -----------------------------------------------------------------------

def _annotation(setting: Setting) -> str:
    kind, optional = _base_type(setting.info.annotation)
    choices = _choices(kind)
    if choices is not None:
        text = "Literal[" + ", ".join(json.dumps(c) for c in choices) + "]"
    elif get_origin(kind) is list:
        text = "list[str]"
    else:
        text = kind.__name__
    return f"{text} | None" if optional else text


def _py(value: Any) -> str:
    """A literal in the project's style: strings double-quoted."""
    return json.dumps(value) if isinstance(value, str) else repr(value)


def _field_call(field: CrdField) -> str:
    setting = field.setting
    if setting.info.default_factory is not None:
        args = [f"default_factory={setting.info.default_factory.__name__}"]
    else:
        args = [_py(default_of(setting))]
    args += [f"{k}={_py(_number(v))}" for k, v in _bounds(setting).items()]
    args.append(f"alias={_py(field.key)}")
    return f"Field({', '.join(args)})"


def _docstring(text: str) -> str:
    if '"""' in text or "\\" in text:
        raise ValueError(f"a docstring with triple quotes or backslashes: {text!r}")
    return f'"""{text}"""'


def class_name(obj: str) -> str:
    """The operator model of a spec object: batching -> Batching."""
    return obj[0].upper() + obj[1:]


def render_operator_module() -> str:
    """operator/encoderpool_operator/podsettings.py (the whole file)."""
    objects = by_object()
    uses_literal = any("Literal[" in _annotation(f.setting) for fields in objects.values() for f in fields)
    out = [
        f'"""The pod settings the operator renders. GENERATED by `{COMMAND}` from',
        "encoder_pod/settings.py (the one declaration of every pod setting): do not edit; change the",
        "declaration and run `make generate`.",
        "",
        "The models of the spec objects that are pod settings (their fields are the settings: same type,",
        "bounds, default and doc), and the env names the operator renders (podenv.py) and reserves",
        "(spec.env and the pod template override may not set them). The operator never imports",
        "encoder_pod; tests/unit/test_settings_contract.py fails when this file is stale.",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        *(["from typing import Literal", ""] if uses_literal else []),
        "from pydantic import Field, model_validator",
        "",
        "from encoderpool_operator.specmodels import SpecModel",
        "",
        '__all__ = ("DERIVED_ENV", "DIRECT_ENV", "MANAGED_ENV", "RESERVED_ENV", "PodSettingsSpec", '
        + ", ".join(f'"{class_name(o)}"' for o in objects) + ")",
        "",
    ]
    for obj, fields in objects.items():
        name = class_name(obj)
        out += ["", f"class {name}(SpecModel):", f"    {_docstring(CRD_OBJECTS[obj])}", ""]
        for field in fields:
            out.append(f"    {field.attr}: {_annotation(field.setting)} = {_field_call(field)}")
            out.append(f"    {_docstring(schema_of(field)['description'])}")
        _, pairs = relation_rules(obj, fields)
        if pairs:
            out += ["", '    @model_validator(mode="after")', f'    def _relations(self) -> "{name}":']
            for low, high, rule in pairs:
                out.append(f"        if self.{low.attr} > self.{high.attr}:")
                out.append(f"            raise ValueError({_py(relation_message(low, high, rule))})")
            out.append("        return self")
        out.append("")
    out += ["", "class PodSettingsSpec(SpecModel):", '    """The spec objects that hold pod settings (PoolSpec extends it)."""', ""]
    out += [f"    {obj}: {class_name(obj)} = Field(default_factory={class_name(obj)})" for obj in objects]
    direct = [(f.obj, f.attr, f.setting.env) for f in crd_fields()]
    out += [
        "",
        "",
        "DIRECT_ENV: tuple[tuple[str, str, str], ...] = (",
        *[f"    ({_py(o)}, {_py(a)}, {_py(e)})," for o, a, e in direct],
        ")",
        '"""``(spec object, attribute, env name)`` of every setting that is a spec field, rendered from its value."""',
        "DERIVED_ENV: tuple[str, ...] = (",
        *[f"    {_py(s.env)},  # {s.derived_from}" for s in managed() if s.derived_from is not None],
        ")",
        '"""Settings podenv.py computes from other spec fields (the comment says which)."""',
        "MANAGED_ENV: tuple[str, ...] = (",
        *[f"    {_py(s.env)}," for s in managed()],
        ")",
        '"""Every variable the operator renders, in the order it renders them."""',
        "RESERVED_ENV: tuple[str, ...] = (",
        *[f"    {_py(name)}," for name in reserved_env()],
        ")",
        '"""Every name the pod reads a managed setting under (aliases and deprecated names too): spec.env may not set them."""',
        "",
    ]
    return "\n".join(out)


# --- the docs table --------------------------------------------------------------------------------

def _allowed(setting: Setting) -> str:
    kind, _ = _base_type(setting.info.annotation)
    choices = _choices(kind)
    if choices is not None:
        return ", ".join(f"`{c}`" for c in choices)
    if kind is bool:
        return "`true`, `false`"
    bounds = _bounds(setting)
    low = f"> {_number(bounds['gt'])}" if "gt" in bounds else f">= {_number(bounds['ge'])}" if "ge" in bounds else ""
    high = f"< {_number(bounds['lt'])}" if "lt" in bounds else f"<= {_number(bounds['le'])}" if "le" in bounds else ""
    return ", ".join(part for part in (low, high) if part)


def _default_text(setting: Setting) -> str:
    value = default_of(setting)
    if value in (None, "", []):
        return "—"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    return f"`{_number(value)}`"


def _cell(text: str) -> str:
    if "|" in text or "\n" in text:
        raise ValueError(f"a table cell with | or a newline: {text!r}")
    return text


def render_docs_table(indent: int = 0) -> str:
    """The settings table of docs/configuration.md (one row per setting)."""
    rows = [
        "| group | variable and flag | default | allowed | meaning | in an EncoderPool |",
        "|---|---|---|---|---|---|",
    ]
    for setting in all_settings().values():
        names = f"`{setting.env}` `{setting.flag}`"
        others = [*(f"`{a}`" for a in setting.env_aliases), *(f"`{d}`, deprecated" for d in setting.deprecated_env)]
        if others:
            names += " (also " + "; ".join(others) + ")"
        pool = f"`{CrdField(setting, *setting.crd.split('.', 1)).path}`" if setting.crd else (
            setting.derived_from if setting.derived_from else "`spec.env`")
        rows.append("| " + " | ".join(_cell(c) for c in (
            setting.group, names, _default_text(setting), _allowed(setting), setting.info.description or "", pool)) + " |")
    return "\n".join(rows) + "\n"


def render_docs(text: str) -> str:
    """docs/configuration.md with its generated table rewritten."""
    return replace_region(text, "settings-table", render_docs_table, comment="<!--")


# --- writing and checking ---------------------------------------------------------------------------

OUTPUTS: dict[Path, Callable[[str], str]] = {
    CRD: render_crd,
    CHART_CRD: render_crd,  # rendered from the top-level CRD: byte-identical to it
    OPERATOR_MODULE: lambda _: render_operator_module(),  # the whole file is generated
    DOCS: render_docs,
}


def rendered(root: Path = REPO) -> dict[Path, tuple[str, str]]:
    """``path -> (committed text, generated text)`` of every output."""
    out = {}
    for path, render in OUTPUTS.items():
        current = (root / path).read_text() if (root / path).exists() else ""
        out[path] = (current, render((root / CRD).read_text() if path == CHART_CRD else current))
    return out


def main(argv: list[str] | None = None) -> int:
    """Write the generated parts, or with ``--check`` report the stale ones (exit 1)."""
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a generated part differs")
    args = parser.parse_args(argv)
    stale = 0
    for path, (current, generated) in rendered().items():
        if current == generated:
            continue
        stale += 1
        if args.check:
            sys.stdout.writelines(difflib.unified_diff(
                current.splitlines(keepends=True), generated.splitlines(keepends=True), f"{path} (committed)", f"{path} (generated)"))
        else:
            (REPO / path).write_text(generated)
            print(f"wrote {path}")
    if args.check and stale:
        print(f"{stale} generated file(s) are stale: run `make generate` ({COMMAND})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
