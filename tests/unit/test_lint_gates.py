"""The gates `make lint` runs (and `make test` runs `make lint` first) check what they claim.

The lint itself runs in `make lint`; these tests check that its configuration has no escape
hatch: no import exempt from the import contracts, both packages under mypy and vulture, and a
vulture whitelist that names only what vulture would otherwise report.
"""

from __future__ import annotations

import ast
import configparser
import re
import tomllib
from pathlib import Path

import pytest
import vulture

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
WHITELIST = REPO / "vulture_whitelist.py"


def vulture_config() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["vulture"]


def whitelist_entries(source: str) -> list[tuple[int, str]]:
    """``(line, name)`` of every entry: the last name of each bare expression (``a.b.c`` -> ``c``)."""
    entries = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.Expr) and not isinstance(node.value, ast.Constant):
            value = node.value
            name = value.attr if isinstance(value, ast.Attribute) else getattr(value, "id", None)
            if name is None:
                raise ValueError(f"line {node.lineno}: a whitelist entry is a dotted name")
            entries.append((node.lineno, name))
    return entries


def reported_without_whitelist() -> set[str]:
    """The names vulture reports on the checked packages when the whitelist is left out."""
    config = vulture_config()
    scan = vulture.Vulture(ignore_decorators=config.get("ignore_decorators"), ignore_names=config.get("ignore_names"))
    scan.scavenge([str(REPO / p) for p in config["paths"] if p != WHITELIST.name], exclude=config.get("exclude"))
    return {item.name for item in scan.get_unused_code(min_confidence=config["min_confidence"])}


def stale(source: str, reported: set[str]) -> list[str]:
    return [f"vulture_whitelist.py:{line}: {name}" for line, name in whitelist_entries(source) if name not in reported]


def test_vulture_checks_both_packages_and_the_whitelist() -> None:
    assert {"encoder_pod", "operator", WHITELIST.name} <= set(vulture_config()["paths"])


def test_every_whitelist_entry_is_something_vulture_would_report() -> None:
    """A name that is gone, or used by now, must leave the whitelist (else it hides the next dead one)."""
    assert stale(WHITELIST.read_text(), reported_without_whitelist()) == []


def test_the_stale_check_catches_a_stale_entry() -> None:
    source = WHITELIST.read_text() + "\n_.no_such_name_anywhere\n"
    assert stale(source, reported_without_whitelist()) == [f"vulture_whitelist.py:{len(source.splitlines())}: no_such_name_anywhere"]


def test_import_contracts_have_no_type_checking_escape() -> None:
    """An import under ``if TYPE_CHECKING:`` still couples two modules: it counts for layers and cycles."""
    config = configparser.ConfigParser()
    config.read(REPO / ".importlinter")
    assert "exclude_type_checking_imports" not in config["importlinter"]


def test_make_test_runs_the_whole_lint_first() -> None:
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^test:.*\blint\b", makefile, re.M), "make test must depend on make lint"
    lint = re.search(r"^lint:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert lint is not None
    recipe = lint.group(1)
    assert "lint-imports" in recipe and re.search(r"mypy encoder_pod operator", recipe) and "vulture" in recipe
