"""House rules of the operator package, checked on its source (ast, no imports needed).

.importlinter states the same layering for lint-imports; this test keeps
the rule that matters most enforced in the unit tier too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

SOURCE_ROOT = Path(__file__).resolve().parents[3] / "operator"
PACKAGE = SOURCE_ROOT / "encoderpool_operator"
CLUSTER_LIBRARIES = {"kopf", "kubernetes", "urllib3"}
MAY_IMPORT_CLUSTER_LIBRARIES = {"process.py", "handlers.py", "client.py"}


def imported_roots(tree: ast.AST) -> set[str]:
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def modules() -> list[Path]:
    return sorted(PACKAGE.glob("*.py"))


def test_operator_source_root_is_not_a_package() -> None:
    """operator/__init__.py would shadow the stdlib module "operator" for anyone in the repo root."""
    assert not (SOURCE_ROOT / "__init__.py").exists()


@pytest.mark.parametrize("path", modules(), ids=lambda p: p.name)
def test_module_rules(path: Path) -> None:
    tree = ast.parse(path.read_text())
    roots = imported_roots(tree)
    if path.name not in MAY_IMPORT_CLUSTER_LIBRARIES:
        assert not roots & CLUSTER_LIBRARIES, f"{path.name} imports {roots & CLUSTER_LIBRARIES}"
    assert not roots & {"encoder_pod", "torch", "transformers"}, "the operator image has no encoder"
    assert len(path.read_text().splitlines()) < 400
    for node in ast.walk(tree):
        assert not isinstance(node, ast.Global), f"{path.name}:{node.lineno} uses global"
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = (node.end_lineno or node.lineno) - node.lineno
            assert length <= 60, f"{path.name}:{node.name} is {length} lines"
    if path.name != "__init__.py":
        assert ast.get_docstring(tree), f"{path.name} has no module docstring"


@pytest.mark.parametrize("path", modules(), ids=lambda p: p.name)
def test_public_functions_and_classes_have_docstrings(path: Path) -> None:
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
            assert ast.get_docstring(node), f"{path.name}:{node.name} has no docstring"
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and not item.name.startswith("_"):
                    assert ast.get_docstring(item), f"{path.name}:{node.name}.{item.name} has no docstring"


def test_no_module_level_mutable_state() -> None:
    """Module-level names are constants: no dict/list/set literals bound to lower-case names."""
    for path in modules():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                value = node.value
                for target in targets:
                    if isinstance(target, ast.Name) and isinstance(value, (ast.Dict, ast.List, ast.Set)):
                        assert target.id.isupper(), f"{path.name}: {target.id} is module-level mutable state"
