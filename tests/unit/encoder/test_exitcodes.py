"""Exit codes: one enum for the pod, and the operator's mirror of the model-load code."""

from __future__ import annotations

import pytest

from encoder_pod.exitcodes import ExitCode
from encoderpool_operator.podstate import MODEL_LOAD_EXIT_CODE

pytestmark = pytest.mark.unit


def test_operator_reads_the_code_the_pod_exits_with_on_a_failed_model_load():
    """The operator may not import encoder_pod (import-linter), so it mirrors the value: pinned here."""
    assert MODEL_LOAD_EXIT_CODE == ExitCode.MODEL_LOAD_FAILED == 3


def test_codes_are_the_documented_ones():
    assert {code.name: int(code) for code in ExitCode} == {
        "OK": 0, "BAD_SETTINGS": 2, "MODEL_LOAD_FAILED": 3, "ORPHANED": 4, "TP_GROUP_DOWN": 5,
    }
