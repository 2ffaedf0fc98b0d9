"""The encoder pod features some operator e2e tests stand on, and a loud failure when one is missing.

The operator renders these (docs/kubernetes.md, what the operator relies on in the pod); the
encoder pod builds them. A test that needs
one calls ``require(...)`` first: if the pod in this checkout lacks it, the test FAILS, saying
which feature it waits for (never a silent skip), instead of timing out on a symptom.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ENCODER_POD = Path(sys.executable).parent / "encoder-pod"

FEATURES = {
    "fetch-model": "`encoder-pod fetch-model hf://org/name[@rev]` (docs/models.md)",
    "drain": "the SIGTERM drain with ENCODER_DRAIN_TIMEOUT (docs/operations.md, Drain)",
    "livez": "GET /livez (docs/operations.md, Probes)",
}


def _settings_names() -> set[str]:
    from encoder_pod import settings

    if hasattr(settings, "all_settings"):
        return set(settings.all_settings())
    return set(getattr(settings, "EncoderSettings").model_fields)


def has(feature: str) -> bool:
    """Whether this checkout's encoder pod has the feature (read from its CLI and settings)."""
    if feature == "fetch-model":
        done = subprocess.run([str(ENCODER_POD), "fetch-model", "--help"], capture_output=True, timeout=120)
        return done.returncode == 0
    if feature == "drain":
        return "drain_timeout" in _settings_names()
    raise ValueError(f"unknown pod feature {feature!r} (GET /livez is checked on a running pod: require_livez)")


def require_livez(base_url: str) -> None:
    """Fail, naming the feature, if a running encoder pod does not serve GET /livez."""
    import httpx

    if httpx.get(base_url + "/livez", timeout=10).status_code == 404:
        pytest.fail(f"this test waits for an encoder pod feature not in this checkout yet: {FEATURES['livez']} "
                    "(the operator's liveness probe asks it; without it the kubelet restarts every pod)",
                    pytrace=False)


def require(*features: str) -> None:
    """Fail the test, naming what it waits for, unless the encoder pod has every feature."""
    missing = [FEATURES[f] for f in features if not has(f)]
    if missing:
        pytest.fail("this test waits for encoder pod features not in this checkout yet: " + "; ".join(missing),
                    pytrace=False)
