"""The peers' own virtual environments, outside the repository, created with uv when missing.

Each peer gets ``$ENCODERPOOL_CACHE/peers/<name>`` with the torch version that pyproject.toml
pins for the project (uv's cache hardlinks the wheel, so a second copy costs little disk) and
never torchvision: the comparison is about serving the same torch model, and torchvision is no
dependency of the project either. The requirement list is written into the environment; a
changed list reinstalls.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path

from bench.common import CACHE

REPO = Path(__file__).resolve().parents[2]
MARKER = ".encoderpool-requirements"


@dataclass(frozen=True)
class PeerEnv:
    """A peer's environment: where it lives and what goes in it."""

    name: str
    requirements: tuple[str, ...]

    @property
    def root(self) -> Path:
        """The environment's folder."""
        return CACHE / "peers" / self.name

    @property
    def python(self) -> Path:
        """The environment's interpreter."""
        return self.root / "bin" / "python"


def project_pin(package: str, pyproject: Path = REPO / "pyproject.toml") -> str:
    """The ``package==X`` requirement pyproject.toml's dependencies pin (raises if not pinned)."""
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    for dep in deps:
        name, sep, _ = dep.partition("==")
        if sep and name.strip().lower() == package.lower():
            return dep.replace(" ", "")
    raise LookupError(f"pyproject.toml pins no {package}==")


def peer_envs(pyproject: Path = REPO / "pyproject.toml") -> dict[str, PeerEnv]:
    """The two peers' environments.

    infinity-emb 0.0.78 asks for click<8.2, which transformers 5 (through huggingface-hub >= 1.31)
    cannot have, and infinity's own extras cap transformers at 5.0: it gets the last 4.x release.
    Its ``vision`` extra would bring torchvision, timm and colpali-engine; CLIP in infinity only
    needs transformers' PIL image processor, so the extra is left out and pillow named instead.
    Ray Serve gets the project's transformers.
    """
    torch = project_pin("torch", pyproject)
    return {
        "infinity": PeerEnv("infinity", (
            "infinity-emb[server]==0.0.78", "transformers==4.57.6", "aiohttp", "pillow", torch)),
        "ray": PeerEnv("ray", ("ray[serve]==2.60.0", project_pin("transformers", pyproject), "pillow", torch)),
    }


def find_uv() -> Path:
    """uv as the Makefile installs it (``$ENCODERPOOL_CACHE/tools/bin/uv``), else ``$UV``, else PATH."""
    for candidate in (CACHE / "tools" / "bin" / "uv", os.environ.get("UV"), shutil.which("uv")):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    raise FileNotFoundError("uv not found: run `make venv` once (it installs uv into the cache)")


def ensure(env: PeerEnv, python: str = "python3.11") -> Path:
    """Create or update ``env`` if its requirement list changed; returns its interpreter."""
    wanted = "\n".join(env.requirements) + "\n"
    marker = env.root / MARKER
    if env.python.is_file() and marker.is_file() and marker.read_text() == wanted:
        return env.python
    uv = find_uv()
    run_env = {**os.environ, "UV_CACHE_DIR": os.environ.get("UV_CACHE_DIR", str(CACHE / "uv"))}
    print(f">> installing {env.name} into {env.root}", flush=True)
    if not env.python.is_file():
        subprocess.run([str(uv), "venv", "-q", "--python", python, str(env.root)], check=True, env=run_env)
    subprocess.run([str(uv), "pip", "install", "-q", "--python", str(env.python), *env.requirements],
                   check=True, env=run_env)
    marker.write_text(wanted)
    return env.python


def installed_versions(python: Path, packages: tuple[str, ...]) -> dict[str, str | None]:
    """``{package: version or None}`` as the environment at ``python`` has them."""
    code = ("import importlib.metadata as m, json, sys\n"
            "out = {}\n"
            "for p in sys.argv[1:]:\n"
            "    try: out[p] = m.version(p)\n"
            "    except m.PackageNotFoundError: out[p] = None\n"
            "print(json.dumps(out))\n")
    done = subprocess.run([str(python), "-c", code, *packages], check=True, capture_output=True, text=True)
    return json.loads(done.stdout)
