"""The encoder-pod command line."""

from __future__ import annotations

import pytest

from encoder_pod.cli import EXIT_MODEL_LOAD, main

pytestmark = pytest.mark.unit


def test_missing_model_exits_3_naming_the_path(tmp_path, capsys):
    assert main(["serve", "--model-path", str(tmp_path / "nope")]) == EXIT_MODEL_LOAD
    err = capsys.readouterr().err
    assert "model load failed" in err and "nope" in err and "ENCODER_MODEL_PATH" in err


def test_bad_setting_stops_with_named_flag(tmp_path):
    with pytest.raises(SystemExit) as info:
        main(["serve", "--model-path", str(tmp_path), "--max-batch-size", "0"])
    assert "--max-batch-size" in str(info.value)


def test_unknown_arch_is_refused(tmp_path, capsys):
    assert main(["make-tiny-model", "--arch", "gpt9", "--out", str(tmp_path / "m")]) == 2
    assert "gpt9" in capsys.readouterr().err
