"""Which GPU or CPU share each worker gets, and the restart backoff: pure functions."""

from __future__ import annotations

import signal

import pytest

from encoder_pod.parallel.placement import plan, visible_gpus
from encoder_pod.parallel.supervisor import BACKOFF_CAP_S, DEATH_REASONS, describe_exit, restart_delay
from encoder_pod.exitcodes import ExitCode
from encoder_pod.settings import SettingsError, load_settings

pytestmark = pytest.mark.unit


def _plan(environ: dict[str, str], cpus: int, **env: str):
    settings = load_settings(env={f"ENCODER_{k.upper()}": v for k, v in env.items()})
    return plan(settings.parallel, settings.model, environ, cpus)


def test_cpu_workers_split_the_cpus_and_see_no_gpu():
    placements = _plan({"CUDA_VISIBLE_DEVICES": "0,1"}, 8, dp_size="2", device="cpu")
    assert [p.device for p in placements] == ["cpu", "cpu"]
    assert [p.num_threads for p in placements] == [4, 4]
    assert all(p.env["CUDA_VISIBLE_DEVICES"] == "" and p.env["OMP_NUM_THREADS"] == "4" for p in placements)


def test_explicit_threads_are_per_worker_and_never_zero():
    assert [p.num_threads for p in _plan({}, 2, dp_size="2", num_threads="3", device="cpu")] == [3, 3]
    assert [p.num_threads for p in _plan({}, 2, dp_size="4", device="cpu")] == [1, 1, 1, 1]


def test_gpu_workers_get_one_visible_device_each():
    placements = _plan({"CUDA_VISIBLE_DEVICES": "3,5,7"}, 16, dp_size="2")
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in placements] == ["3", "5"]
    assert [p.device for p in placements] == ["cuda", "cuda"] and placements[0].num_threads == 8


def test_too_few_gpus_is_a_setting_error_naming_the_flag():
    with pytest.raises(SettingsError, match="--dp-size.*4 workers need one GPU each, 2 visible"):
        _plan({"CUDA_VISIBLE_DEVICES": "0,1"}, 8, dp_size="4", device="cuda")


def test_gpus_counted_from_device_files_without_cuda(tmp_path):
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"):
        (tmp_path / name).touch()
    assert visible_gpus({}, tmp_path) == ["0", "1"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, tmp_path) == []


def test_backoff_doubles_and_is_capped():
    assert [restart_delay(1.0, n) for n in (1, 2, 3)] == [1.0, 2.0, 4.0]
    assert restart_delay(1.0, 50) == BACKOFF_CAP_S


def test_exit_reasons():
    assert describe_exit(-signal.SIGKILL) == ("killed", "killed by SIGKILL")
    assert describe_exit(ExitCode.MODEL_LOAD_FAILED)[0] == "load_failed"
    assert describe_exit(ExitCode.TP_GROUP_DOWN)[0] == "tp_group_down"
    assert describe_exit(1) == ("crashed", "exited with code 1")


def test_every_exit_reason_is_among_those_exported_at_zero_from_the_start():
    codes = [None, 0, 1, -signal.SIGKILL, -signal.SIGSEGV, -99, *ExitCode]
    assert {describe_exit(code)[0] for code in codes} | {"hung"} == set(DEATH_REASONS)
