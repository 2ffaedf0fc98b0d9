"""A checkpoint the pod cannot serve stops ``encoder-pod serve`` at once, visibly to Kubernetes.

Each case is a real ``encoder-pod serve`` subprocess on a checkpoint directory as a user would have
it (config.json and processor files); it must exit with code 3 (what a missing model path exits
with) and say the model type and the reason on its last line, before it ever listens. The operator's
own pod-status function then reads that exit and the log tail the kubelet quotes
(terminationMessagePolicy FallbackToLogsOnError keeps the last 2 KiB) as ``ModelLoadFailed``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from encoder_pod.exitcodes import ExitCode
from encoderpool_operator import names, podstate
from testkit.server import free_port, process_alive

pytestmark = pytest.mark.integration

KUBELET_TAIL_BYTES = 2048
"""What FallbackToLogsOnError quotes of a failed container's log: its last 2 KiB (or 80 lines)."""

CASES = {
    "unknown architecture": (
        {"model_type": "frobnicator_vl", "architectures": ["FrobnicatorForConditionalGeneration"]},
        {},
        "does not know this model type",
    ),
    "remote code only": (
        {"model_type": "acme_vl", "architectures": ["AcmeVLForCausalLM"],
         "auto_map": {"AutoConfig": "configuration_acme.AcmeConfig", "AutoModelForCausalLM": "modeling_acme.AcmeVL"}},
        {},
        "remote code",
    ),
    "processor needs torchvision": (
        {"model_type": "llama4", "architectures": ["Llama4ForConditionalGeneration"]},
        {"image_processor_type": "Llama4ImageProcessor"},
        "Llama4ImageProcessor needs torchvision",
    ),
    "no feature methods": (
        {"model_type": "bert", "architectures": ["BertModel"]},
        {},
        "get_image_features",
    ),
}


def serve_until_exit(model_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "encoder_pod.cli", "serve", "--model-path", str(model_dir),
           "--host", "127.0.0.1", "--port", str(free_port()), *args]
    # Generous: a loaded machine imports transformers slowly. A server that stays up would hit it.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "ENCODER_LOG_LEVEL": "info"}
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)


def paligemma_missing_a_tower_tensor(tmp_path: Path) -> tuple[Path, str]:
    """A PaliGemma checkpoint (the generic path's) that passes the start-up check, but whose index
    lost one tensor of the vision tower (an interrupted or hand-pruned download): only loading
    finds out. Returns the directory and the lost tensor's name."""
    from encoder_pod.models.tiny_generic import build_tiny

    model_dir = tmp_path / "paligemma"
    build_tiny("paligemma", model_dir)
    index_file = model_dir / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    lost = sorted(key for key in index["weight_map"] if "vision_tower" in key)[0]
    del index["weight_map"][lost]
    index_file.write_text(json.dumps(index))
    return model_dir, lost


def operator_diagnosis(done: subprocess.CompletedProcess[str]) -> tuple[str, str]:
    """What the operator makes of the exit: the kubelet's termination state of the encoder container."""
    tail = (done.stdout + done.stderr).encode()[-KUBELET_TAIL_BYTES:].decode(errors="replace")
    pod = {
        "metadata": {"name": "enc-0"},
        "status": {"containerStatuses": [{
            "name": names.CONTAINER_NAME, "ready": False, "started": False, "restartCount": 1,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"exitCode": done.returncode, "reason": "Error", "message": tail}},
        }]},
    }
    found = podstate.diagnose(pod, datetime.now(timezone.utc), probe_failing_after=120.0)
    assert found is not None, tail
    return found


@pytest.mark.parametrize("case", list(CASES))
def test_unservable_checkpoint_exits_3_naming_model_type_and_reason(case: str, tmp_path: Path) -> None:
    config, processor, reason = CASES[case]
    (tmp_path / "config.json").write_text(json.dumps(config))
    if processor:
        (tmp_path / "preprocessor_config.json").write_text(json.dumps(processor))

    done = serve_until_exit(tmp_path)

    assert done.returncode == ExitCode.MODEL_LOAD_FAILED == podstate.MODEL_LOAD_EXIT_CODE, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert f"model_type {config['model_type']!r}" in last and reason in last, done.stderr
    assert "Traceback" not in done.stderr and "Uvicorn running" not in done.stderr

    problem, detail = operator_diagnosis(done)
    assert problem == podstate.MODEL_LOAD_FAILED, detail
    assert config["model_type"] in detail and reason in detail, detail


def test_a_checkpoint_the_generic_path_fails_to_load_exits_3_naming_model_type_and_reason(tmp_path: Path) -> None:
    # Before, the pod stayed up unready for good (/health 503, state failed).
    model_dir, lost = paligemma_missing_a_tower_tensor(tmp_path)

    done = serve_until_exit(model_dir)

    assert done.returncode == ExitCode.MODEL_LOAD_FAILED, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert "cannot serve model_type 'paligemma': the generic path cannot load it" in last, done.stderr[-3000:]
    assert lost.rsplit(".", 1)[0].split("vision_tower.", 1)[-1] in last, last  # the tensor is named
    assert "Traceback" not in done.stderr
    problem, detail = operator_diagnosis(done)
    assert problem == podstate.MODEL_LOAD_FAILED and "paligemma" in detail, detail


def test_a_data_parallel_worker_whose_load_refuses_the_checkpoint_stops_the_pod_after_one_start(tmp_path: Path) -> None:
    # The same refusal behind the data-parallel front: deterministic, so no rank is restarted
    # (ENCODER_DP_MAX_FAILED_STARTS does not apply); the first refusal stops every worker and the
    # pod exits 3 naming the worker, the model type and the reason. Before, each rank was retried
    # up to 5 times and the front then stayed up failed for good.
    model_dir, lost = paligemma_missing_a_tower_tensor(tmp_path)

    done = serve_until_exit(model_dir, "--dp-size", "2")

    log = done.stderr
    assert done.returncode == ExitCode.MODEL_LOAD_FAILED, log[-4000:]
    last = log.strip().splitlines()[-1]
    refused = re.fullmatch(
        r"encoder-pod: model load failed: worker [01]: cannot serve model_type 'paligemma': "
        r"the generic path cannot load it: .+", last,
    )
    assert refused is not None and "failed starts" not in last, log[-4000:]
    assert lost.rsplit(".", 1)[0].split("vision_tower.", 1)[-1] in last, last  # the tensor is named
    starts = re.findall(r"rank (\d): worker pid (\d+) started", log)
    assert sorted(rank for rank, _ in starts) == ["0", "1"], log[-4000:]  # one start per rank
    assert "restart #" not in log and "restarting in" not in log, log[-4000:]
    assert not any(process_alive(int(pid)) for _, pid in starts), starts
    assert "Traceback" not in log
    problem, detail = operator_diagnosis(done)
    assert problem == podstate.MODEL_LOAD_FAILED and "worker" in detail and "paligemma" in detail, detail
