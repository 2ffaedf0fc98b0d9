"""The encoder-pod command line: the one place errors become exit codes."""

from __future__ import annotations

import pytest

from encoder_pod.cli import main
from encoder_pod.exitcodes import ExitCode

pytestmark = pytest.mark.unit


def test_missing_model_exits_3_naming_the_path(tmp_path, capsys):
    assert main(["serve", "--model-path", str(tmp_path / "nope")]) == ExitCode.MODEL_LOAD_FAILED == 3
    err = capsys.readouterr().err
    assert "model load failed" in err and "nope" in err and "ENCODER_MODEL_PATH" in err


def test_bad_setting_exits_2_with_named_flag(tmp_path, capsys):
    assert main(["serve", "--model-path", str(tmp_path), "--max-batch-size", "0"]) == ExitCode.BAD_SETTINGS == 2
    err = capsys.readouterr().err
    assert "--max-batch-size" in err and "ENCODER_MAX_BATCH_SIZE" in err and "Traceback" not in err


def test_bad_env_setting_exits_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ENCODER_PORT", "70000")
    assert main(["serve", "--model-path", str(tmp_path)]) == ExitCode.BAD_SETTINGS
    assert "ENCODER_PORT" in capsys.readouterr().err


def test_unknown_arch_is_refused(tmp_path, capsys):
    assert main(["make-tiny-model", "--arch", "gpt9", "--out", str(tmp_path / "m")]) == 2
    assert "gpt9" in capsys.readouterr().err


def test_gpu_preprocessing_is_refused_at_start_naming_the_variable(tmp_path, capsys):
    assert main(["serve", "--model-path", str(tmp_path), "--image-processor-use-gpu"]) == ExitCode.BAD_SETTINGS
    err = capsys.readouterr().err
    assert "ENCODER_IMAGE_PROCESSOR_USE_GPU" in err and "torchvision" in err and "Traceback" not in err
