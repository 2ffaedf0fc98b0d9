"""uv.lock pins every dependency, and constraints.txt is the same pins for pip (the images).

`make venv` installs exactly uv.lock (`uv sync --locked`, which refuses a lock older than
pyproject.toml); the Dockerfiles install with ``pip install -c constraints.txt``. Both files are
written by `make lock`; these tests fail when either is out of date.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
# The command `make lock` writes constraints.txt with (uv records it in the file's header).
EXPORT = ["export", "--frozen", "--all-extras", "--no-emit-project", "--no-hashes", "--format", "requirements-txt"]


def uv() -> str:
    """The pinned uv `make` installs into the cache (or one on PATH)."""
    cache = Path(os.environ.get("ENCODERPOOL_CACHE", Path.home() / ".cache" / "encoderpool"))
    found = cache / "tools" / "bin" / "uv"
    if found.is_file():
        return str(found)
    on_path = shutil.which("uv")
    if on_path is None:
        pytest.fail("uv not found: `make venv` installs it")
    return on_path


def run_uv(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([uv(), *args, "--offline"], cwd=REPO, capture_output=True, text=True, timeout=120)


def test_the_lock_is_up_to_date_with_pyproject() -> None:
    done = run_uv("lock", "--check")
    assert done.returncode == 0, f"uv.lock is stale, run `make lock`:\n{done.stderr}"


def test_constraints_are_the_locked_pins() -> None:
    done = run_uv(*EXPORT)
    assert done.returncode == 0, done.stderr
    committed = (REPO / "constraints.txt").read_text()
    assert " ".join(["uv", *EXPORT]) in committed, "the header names the command that wrote it"
    assert committed.split("\n", 2)[2] == done.stdout.split("\n", 2)[2], "constraints.txt is stale: run `make lock`"


def test_every_requirement_is_pinned_to_one_version() -> None:
    pins = [line for line in (REPO / "constraints.txt").read_text().splitlines() if line and not line.startswith(" ")
            and not line.startswith("#")]
    assert len(pins) > 50
    unpinned = [line for line in pins if not re.match(r"^[A-Za-z0-9_.-]+==[^ ;]+( ; .*)?$", line)]
    assert unpinned == []
    locked = {p["name"] for p in tomllib.loads((REPO / "uv.lock").read_text())["package"]}
    exported = {re.split(r"[=;\s]", line)[0].lower() for line in pins}
    assert exported <= locked and "torch" in exported and "uvicorn" in exported
